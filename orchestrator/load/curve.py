"""A load curve's figures, read from SGLang's bench_serving result lines and the engine's per-request records.

    level_figures(record, requests, level, gpus, limits) -> Level    one level
    pareto_front(levels) -> [Level]          the levels no other level beats on both tok/s per GPU and per user
    level_metrics(level) -> {name: value}    the MLflow metrics of a level (`load.<level>.<name>`)

Where each figure comes from (sglang 0.5.23, sglang/benchmark/serving.py; the result line is `result` plus, with
--output-details, `result_details`, written at :1961-1966):
- `output_throughput` (output tok/s: every successful request's output tokens / the benchmark's wall time, :1274),
  `request_throughput` (completed requests/s, :1272), `concurrency` (sum of request latencies / wall time: the mean
  number of requests in flight, :1305), `completed`, `duration`: the result dict, :1855-1908.
- TTFT, TPOT, ITL, E2E: `mean_/median_/std_/p90_/p95_/p99_` + `ttft_ms`, `tpot_ms`, `itl_ms`, `e2e_latency_ms`
  (:1279-1304; numpy percentiles over the successful requests). TPOT is per request (latency - TTFT) / (output
  tokens - 1) (:1172); ITL is per streamed token (a chunk's gap split over its tokens, :796-797 for the native
  backend), so ITL percentiles weigh long requests more.
- Goodput, with --goodput: `request_goodput` (requests/s meeting every SLO), `slo_attainment` (their share of the
  requests sent), `slo_attainment_by_metric` (sglang/benchmark/goodput.py:15-21, :24-53; a request's TPOT there is
  computed as above, its TTFT and E2E are the client's).
- `accept_length`: the server's /server_info `avg_spec_accept_length` read once after the level (:1642-1662): on both
  engines a windowed figure over complete `--decode-log-interval` windows since the last cache flush
  (docs/sglang.md), not this level's alone. The per-request accept length comes from the engine's own record of
  each request (`spec_accept_length` = completion_tokens / spec_verify_ct; workers/load_curve.py), since
  bench_serving keeps none per request in its file.

Tok/s per user is 1000 / median TPOT (ms): the decode rate the median request saw, the x axis of the Pareto chart
(output tok/s per GPU against tok/s per user, as vLLM's and AIPerf's Pareto plots draw a serving configuration).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from orchestrator.load.settings import Limits
from specsweep_common.load import LoadLevel

LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")  # bench_serving's `<stat>_<name>_ms` keys
STATS = ("mean", "median", "p90", "p95", "p99")


@dataclass(frozen=True)
class Level:
    level: LoadLevel
    completed: int
    requests: int  # sent (successful or not)
    duration_s: float
    output_tok_s: float
    request_per_s: float
    measured_concurrency: float
    latency_ms: Mapping[str, float]  # `<stat>_<name>_ms` as bench_serving names them
    gpus: int  # the server's GPUs, what "per GPU" divides by (0: a CPU server, per server)
    accept_lens: tuple[float, ...] = ()  # per request: completion_tokens / spec_verify_ct
    server_accept_length: float | None = None
    goodput_req_s: float | None = None
    slo_attainment: float | None = None
    slo_attainment_by_metric: Mapping[str, float] = field(default_factory=dict)
    within_limits: bool | None = None  # None: no limits
    errors: tuple[str, ...] = ()

    @property
    def tok_s_per_user(self) -> float:
        tpot = self.latency_ms.get("median_tpot_ms", 0.0)
        return 1000.0 / tpot if tpot > 0 else math.nan

    @property
    def tok_s_per_gpu(self) -> float:
        return self.output_tok_s / max(1, self.gpus)

    @property
    def x(self) -> float:
        """Where the level sits on the load curve's axis: its concurrency cap, else the concurrency it reached."""
        return float(self.level.concurrency) if self.level.concurrency is not None else self.measured_concurrency


def accept_lengths(requests: Sequence[Mapping[str, Any]]) -> tuple[float, ...]:
    """Per request, tokens committed per verify step (SGLang's spec_accept_length: completion_tokens /
    spec_verify_ct, sglang/srt/managers/tokenizer_manager.py:3166-3168); requests without a verify step (no
    speculation) have none."""
    out = []
    for r in requests:
        steps, tokens = r.get("spec_verify_ct"), r.get("completion_tokens")
        if isinstance(steps, (int, float)) and steps > 0 and isinstance(tokens, (int, float)):
            out.append(float(tokens) / float(steps))
    return tuple(out)


def level_figures(record: Mapping[str, Any], requests: Sequence[Mapping[str, Any]], level: LoadLevel, gpus: int,
                  lim: Limits) -> Level:
    lat = {f"{s}_{n}_ms": float(record[f"{s}_{n}_ms"]) for s in STATS for n in LATENCIES
           if isinstance(record.get(f"{s}_{n}_ms"), (int, float))}
    errors = tuple(e for e in record.get("errors", []) if e)
    within = None
    if lim.p99_tpot_ms is not None or lim.p99_ttft_s is not None:
        within = ((lim.p99_tpot_ms is None or lat.get("p99_tpot_ms", math.inf) <= lim.p99_tpot_ms)
                  and (lim.p99_ttft_s is None or lat.get("p99_ttft_ms", math.inf) <= lim.p99_ttft_s * 1000))
    acc = record.get("accept_length")
    return Level(level=level, completed=int(record.get("completed", 0)),
                 requests=len(record.get("output_lens", [])) or int(record.get("completed", 0)),
                 duration_s=float(record.get("duration", 0.0)), output_tok_s=float(record["output_throughput"]),
                 request_per_s=float(record["request_throughput"]),
                 measured_concurrency=float(record.get("concurrency", 0.0)), latency_ms=lat, gpus=max(0, gpus),
                 accept_lens=accept_lengths(requests),
                 server_accept_length=float(acc) if isinstance(acc, (int, float)) else None,
                 goodput_req_s=_num(record.get("request_goodput")), slo_attainment=_num(record.get("slo_attainment")),
                 slo_attainment_by_metric=dict(record.get("slo_attainment_by_metric") or {}),
                 within_limits=within, errors=errors)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pareto_front(levels: Sequence[Level]) -> list[Level]:
    """The levels not dominated on (tok/s per user, tok/s per GPU): no other level at least as good on both and
    better on one. Sorted by tok/s per user."""
    pts = [lv for lv in levels if math.isfinite(lv.tok_s_per_user)]

    def dominated(a: Level) -> bool:
        return any(b is not a and b.tok_s_per_user >= a.tok_s_per_user and b.tok_s_per_gpu >= a.tok_s_per_gpu
                   and (b.tok_s_per_user > a.tok_s_per_user or b.tok_s_per_gpu > a.tok_s_per_gpu) for b in pts)

    return sorted((a for a in pts if not dominated(a)), key=lambda lv: lv.tok_s_per_user)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default, as bench_serving's percentiles)."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def level_metrics(lv: Level) -> dict[str, float]:
    """A level's MLflow metrics, `load.<label>.<name>`; latency names as bench_serving's keys."""
    m: dict[str, float] = {"output_tok_s": lv.output_tok_s, "request_per_s": lv.request_per_s,
                           "concurrency_measured": lv.measured_concurrency, "completed": float(lv.completed),
                           "tok_s_per_user": lv.tok_s_per_user, "tok_s_per_gpu": lv.tok_s_per_gpu, **lv.latency_ms}
    if lv.goodput_req_s is not None:
        m["goodput_req_s"] = lv.goodput_req_s
    if lv.slo_attainment is not None:
        m["slo_attainment"] = lv.slo_attainment
    if lv.within_limits is not None:
        m["within_limits"] = float(lv.within_limits)
    if lv.server_accept_length is not None:
        m["server_accept_len"] = lv.server_accept_length
    if lv.accept_lens:
        m["accept_len_mean"] = statistics.fmean(lv.accept_lens)
        for q in (10, 50, 90):
            m[f"accept_len_p{q}"] = quantile(lv.accept_lens, q / 100)
    return {f"load.{lv.level.label}.{k}": v for k, v in m.items() if math.isfinite(v)}
