"""What the server worker reads from an engine around each run besides `meta_info`: the device time of the target's
verify forwards (`/metrics`) and the request limits (`/server_info`). One code path for SGLang 0.5.23 and the
reference engine, which exposes the same names, labels and meanings (workers/reference/server.py).

    parse_scrape(text) -> Scrape           a /metrics text: {sample name: sum over labels} plus every labelled
                                           sample (prometheus_client's parser)
    counter(scrape, name) -> float | None  a counter's value, with or without its `_total` suffix
    verify_device_seconds(scrape) -> float target-verify device seconds so far (0.0 before the first verify)
    verify_step_ms(before, after) -> float | None
        1000 x Δ verify device seconds / Δ sglang:spec_verify_calls_total between two scrapes of one run
    verify_timing(before, after, metrics) -> list[str]
        puts verify_step_ms into `metrics`; notes for a run that verified but got no timing
    server_limits(info) -> dict[str, float]   max_req_input_len, max_total_num_tokens from /server_info
    read_limits(base_url) -> dict[str, float] the same, read from a live engine ({} when it cannot be)
    scrape_metrics(base_url) -> Scrape | None a live engine's /metrics (None, and a log line, when it cannot be read)
    accept_length_from_counters(before, after) -> float | None
        Δ sglang:generation_tokens_total / Δ sglang:spec_verify_calls_total between two scrapes of one run (both
        move when a request finishes, by its truncated completion_tokens and its spec_verify_ct), so it
        cross-checks engine_accept_length, not commit_len_mean (workers/sglang/observe.py)

Verify timing, SGLang 0.5.23 (paths relative to site-packages):
- `SGLANG_ENABLE_METRICS_DEVICE_TIMER=1` (`sglang/srt/environ.py:479`, read once at import,
  `sglang/srt/managers/scheduler_components/metrics_reporter.py:68`) installs a `DeviceTimer` on the target's
  model runner and the draft runners (`metrics_reporter.py:325-341`, `364-375`). It times each forward with CUDA
  events (`sglang/srt/utils/device_timer.py:59-90`, `147-165`) and adds the elapsed seconds, once an event has
  completed, to the counter `sglang:forward_execution_seconds_total` with label `category`
  (`sglang/srt/observability/metrics_collector.py:1054-1061`, `1598-1606`). Without `--enable-metrics` nothing is
  exported (`metrics_reporter.py:337-338`); workers/sglang/argv.py passes both.
- The target's verify forward is category `target_verify`, spelled so on every path: eager
  (`sglang/srt/model_executor/runner/eager_runner.py:344-350`), piecewise prefill graph
  (`sglang/srt/model_executor/model_runner.py:2047-2056`), decode-graph replay (`ForwardMode.TARGET_VERIFY.name
  .lower()`, `sglang/srt/model_executor/runner/decode_cuda_graph_runner.py:1986-1988`). Draft forwards have their
  own categories (`eagle_draft`, `eagle_draft_extend`, ...).
- Completed intervals are drained when the scheduler goes idle (`Scheduler.on_idle` ->
  `record_scheduler_idle`, `sglang/srt/managers/scheduler.py:5241-5273`; `metrics_reporter.py:1403-1406`), which
  happens as soon as the run's last request has finished, before its answer reaches the client.
- Every scheduler process exports its own series (labels `tp_rank`, `pp_rank`, `moe_ep_rank`, ...,
  `metrics_collector.py:1382-1393`): TP ranks run the same forward, so the figure is the mean over `tp_rank` of the
  sum over the other labels.
- `sglang:spec_verify_calls_total` (`metrics_collector.py:1865-1869`) grows by each finished request's
  `spec_verify_ct` (`metrics_collector.py:2111-2112`, `sglang/srt/managers/tokenizer_manager.py:3270-3296`), which
  counts that request's verify steps
  (`sglang/srt/managers/scheduler_components/batch_result_processor.py:832`).

So verify_step_ms = Δ device seconds / Δ verify calls is the device time of one verify forward at
probe.concurrency 1. With N requests batched, one forward verifies N requests and counts N verify calls: the figure
is then the batched forward's time divided by the requests in it (device time per request verify step), not the
latency of a step. Both engines' counters are cumulative (never reset by /flush_cache), so the run's figure is the
delta between a scrape before the run's flush and one after its last answer.

Limits (`Scheduler.get_init_info`, `sglang/srt/managers/scheduler.py:1942-1947`, merged into /server_info by
`build_server_info`, `sglang/srt/utils/common.py:3584-3593`): `max_total_num_tokens`, the KV pool's capacity in
tokens (`sglang/srt/managers/tp_worker.py:576`), and `max_req_input_len`, the prompt length from which the
scheduler aborts a request (`tp_worker.py:568-573`, `sglang/srt/managers/utils.py:272-287`;
`specsweep_common.sglang_limits` has the whole rule).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from prometheus_client.parser import text_string_to_metric_families

from specsweep_common.sglang_facts import (DEVICE_TIMER_ENV, FORWARD_SECONDS, GENERATION_TOKENS, VERIFY_CALLS,
                                          VERIFY_CATEGORY)
from workers.errors import BadResponse, ProbeTimeout
from workers.http_client import ProbeClient

RANK_LABEL = "tp_rank"  # metrics_collector.py:1385
LIMIT_KEYS = ("max_req_input_len", "max_total_num_tokens")  # scheduler.py:1944-1946

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


class Scrape(dict):
    """One /metrics scrape: {sample name: sum over label sets} , with the labelled
    samples kept in `samples`."""

    samples: tuple[Sample, ...] = ()


def parse_scrape(text: str) -> Scrape:
    """A Prometheus text exposition; ValueError where prometheus_client's parser refuses it."""
    out = Scrape()
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if math.isnan(s.value):
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
            samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    out.samples = tuple(samples)
    return out


def has_forward_timer(scrape: Scrape) -> bool:
    """The engine exports forward device time at all (SGLang: launched with the device timer on)."""
    return any(s.name == FORWARD_SECONDS for s in scrape.samples)


def verify_device_seconds(scrape: Scrape) -> float:
    """Seconds of target-verify forwards so far: per tp_rank the sum over the other labels, then the mean over
    ranks. 0.0 when no verify forward was timed yet (SGLang creates a label set at its first increment)."""
    by_rank: dict[str, float] = {}
    for s in scrape.samples:
        if s.name == FORWARD_SECONDS and s.label("category") == VERIFY_CATEGORY:
            rank = s.label(RANK_LABEL) or "0"
            by_rank[rank] = by_rank.get(rank, 0.0) + s.value
    return statistics.fmean(by_rank.values()) if by_rank else 0.0


def counter(samples: Mapping[str, float], name: str) -> float | None:
    """A counter summed over its labels, by its name or, in an exposition without the suffix, its name less
    `_total`; None when the scrape has neither."""
    if name in samples:
        return float(samples[name])
    bare = samples.get(name.removesuffix("_total"))
    return None if bare is None else float(bare)


def verify_calls(scrape: Mapping[str, float]) -> float:
    """sglang:spec_verify_calls_total summed over its labels; 0.0 before the first speculative request finished."""
    return counter(scrape, VERIFY_CALLS) or 0.0


def accept_length_from_counters(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Tokens generated per verify call between two scrapes (both counters move when a request finishes)."""
    gen_b, calls_b, gen_a, calls_a = [counter(s, n) for s in (before, after)
                                      for n in (GENERATION_TOKENS, VERIFY_CALLS)]
    if gen_b is None or calls_b is None or gen_a is None or calls_a is None:
        return None
    calls = calls_a - calls_b
    return (gen_a - gen_b) / calls if calls > 0 else None


def verify_step_ms(before: Scrape, after: Scrape) -> float | None:
    """Device ms of target-verify forwards per request verify step between two scrapes (see the module doc); None
    when the engine exports no forward time or no verify call finished in between."""
    if not has_forward_timer(after):
        return None
    calls = verify_calls(after) - verify_calls(before)
    seconds = verify_device_seconds(after) - verify_device_seconds(before)
    if calls <= 0 or seconds <= 0:
        return None
    return 1000.0 * seconds / calls


def verify_timing(before: Scrape | None, after: Scrape | None, metrics: dict[str, float]) -> list[str]:
    """metrics["verify_step_ms"] from the run's two scrapes; a note when a run that verified gets none."""
    if before is None or after is None:
        return ["no verify_step_ms: /metrics was not read before and after the run"] if "verify_steps" in metrics \
            else []
    value = verify_step_ms(before, after)
    if value is not None:
        metrics["verify_step_ms"] = value
        return []
    if "verify_steps" not in metrics:
        return []
    if not has_forward_timer(after):
        return [f"no verify_step_ms: /metrics has no {FORWARD_SECONDS} (SGLang needs {DEVICE_TIMER_ENV}=1 "
                "and --enable-metrics)"]
    return [f"no verify_step_ms: Δ{VERIFY_CALLS}={verify_calls(after) - verify_calls(before):g} and Δ target_verify "
            f"seconds={verify_device_seconds(after) - verify_device_seconds(before):.3g} over the run"]


def server_limits(info: Mapping[str, Any]) -> dict[str, float]:
    """max_req_input_len and max_total_num_tokens of a /server_info answer, where present and numbers."""
    return {k: float(v) for k in LIMIT_KEYS
            if isinstance(v := info.get(k), (int, float)) and not isinstance(v, bool)}


def read_limits(base_url: str) -> dict[str, float]:
    """`server_limits` of a live engine's /server_info; {} (and a log line) when it cannot be read."""
    client = ProbeClient(base_url, timeout_s=30.0)
    try:
        return server_limits(client.server_info())
    except (BadResponse, ProbeTimeout, ValueError) as e:
        logger.warning("%s: /server_info limits not read: %s", base_url, e)
        return {}
    finally:
        client.close()


def read_metrics(base_url: str, parse: Any, purpose: str = "") -> Any:
    """`parse` of the server's /metrics text, or None when it cannot be read or parsed (logged, naming `purpose`;
    the caller then skips what needs it)."""
    client = ProbeClient(base_url, timeout_s=30.0)
    try:
        return parse(client.metrics_text())
    except (BadResponse, ProbeTimeout, ValueError) as e:
        logger.warning("%s: /metrics not read%s: %s", base_url, f" for {purpose}" if purpose else "", e)
        return None
    finally:
        client.close()


def scrape_metrics(base_url: str) -> Scrape | None:
    """/metrics samples (summed over labels, and labelled: `Scrape`), or None when they cannot be read."""
    return read_metrics(base_url, parse_scrape)
