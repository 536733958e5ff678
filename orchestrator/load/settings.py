"""`LoadSettings`: the load curve of a configuration (Hydra: `hydra.sweeper.load.*` of the `specsweep` sweeper, set by
`conf/load/<name>.yaml`: `specsweep +load=NAME`, alone or beside `+tune=NAME`). Declared once here; the sweeper's
`load` section is generated from it (hydra_plugins/specsweep_launcher).

    settings_problems(values) -> [Problem]        every key in its domain, before any server starts
    to_load_settings(values) -> LoadSettings
    load_spec(settings, gen_tokens, tune_limits) -> LoadSpec   what the node runs (specsweep_common/load.py)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from specsweep_common.domain import NAME, PATH, TOKENS, Choice, Int, Items, Num, domain
from specsweep_common.load import LoadLevel, LoadSpec
from specsweep_common.problem import Problem

KEY_PREFIX = "hydra.sweeper.load."
CONCURRENCY = Int(1, 4096)
RATE = Num(0, 1e6, lo_open=True)
# bench_serving's request modes the engines serve (docs/engine.md "OpenAI-compatible routes")
BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")
MIN_PROMPTS = 8  # a level's default number of requests is 4 x its concurrency, at least this
RATE_LEVEL_PROMPTS = 16  # a request-rate level's default


@dataclass(frozen=True)
class LoadSettings:
    # --max-concurrency levels: requests sent as fast as a slot frees up (closed loop)
    concurrency: tuple[int, ...] = field(default=(1, 4, 16), metadata=domain(Items(CONCURRENCY, 64)))
    # --request-rate levels, requests/s (Poisson arrivals, open loop, no concurrency cap)
    request_rates: tuple[float, ...] = field(default=(), metadata=domain(Items(RATE, 64)))
    # requests per level (0: 4 x the level's concurrency, at least 8; a request-rate level: 16)
    prompts: int = field(default=0, metadata=domain(Int(0, 100000)))
    input_len: int = field(default=128, metadata=domain(TOKENS))  # every prompt's length (random-ids)
    output_len: int | None = field(default=None, metadata=domain(TOKENS))  # None: the config's gen_tokens
    backend: str = field(default="sglang", metadata=domain(Choice(*BACKENDS)))
    # --model/--tokenizer for bench_serving (None: the server's /model_info tokenizer_path)
    tokenizer: str | None = field(default=None, metadata=domain(PATH))
    # p99 latency limits: goodput counts the requests within them (bench_serving --goodput) and a level is "within
    # the limits" when its p99 TPOT / p99 TTFT are. None: in a tune, the tune's max_tpot_ms / max_ttft_s
    max_p99_tpot_ms: float | None = field(default=None, metadata=domain(Num(0, 1e9, lo_open=True)))
    max_p99_ttft_s: float | None = field(default=None, metadata=domain(Num(0, 1e6, lo_open=True)))
    seed: int = field(default=1, metadata=domain(Int(0, 2 ** 31 - 1)))
    timeout_s: float = field(default=1800.0, metadata=domain(Num(0, 86400, lo_open=True)))  # one level at most
    name: str | None = field(default=None, metadata=domain(NAME))  # the MLflow run's name (None: the configuration)

    def levels(self) -> tuple[LoadLevel, ...]:
        return (*(LoadLevel(concurrency=c) for c in self.concurrency),
                *(LoadLevel(request_rate=float(r)) for r in self.request_rates))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def settings_problems(values: Mapping[str, Any]) -> list[Problem]:
    """What a `hydra.sweeper.load` section refuses, each with its key, its value and what is allowed."""
    from orchestrator.config.domains import domain_problems

    out: list[Problem] = []
    levels = {"concurrency": CONCURRENCY, "request_rates": RATE}
    for key, dom in levels.items():
        vals = values.get(key) or []
        if not isinstance(vals, (list, tuple)):
            out.append(Problem(KEY_PREFIX + key, vals, f"a list of levels, each {dom.describe()}"))
            continue
        for i, v in enumerate(vals):
            ok = _is_number(v) and (key != "concurrency" or float(v).is_integer())
            if not ok or dom.why_not(int(v) if key == "concurrency" else float(v)):
                out.append(Problem(f"{KEY_PREFIX}{key}[{i}]", v, dom.describe()))
        if len(set(map(repr, vals))) != len(vals):
            out.append(Problem(KEY_PREFIX + key, vals, "distinct levels"))
    if not out:
        out += [Problem(KEY_PREFIX + p.key, p.value, p.allowed) for p in domain_problems(values, LoadSettings)]
    if not values.get("concurrency") and not values.get("request_rates"):
        out.append(Problem(KEY_PREFIX + "concurrency", values.get("concurrency"),
                           "at least one level: a concurrency or a request rate (request_rates)"))
    tok = values.get("tokenizer")
    if tok and not os.path.isdir(str(tok)):
        out.append(Problem(KEY_PREFIX + "tokenizer", tok, "a tokenizer directory that exists on this machine "
                           "(or unset: the server's /model_info tokenizer_path)"))
    return out


def to_load_settings(values: Mapping[str, Any]) -> LoadSettings:
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()
             if k in LoadSettings.__dataclass_fields__}
    given["concurrency"] = tuple(int(c) for c in given.get("concurrency", ()))
    given["request_rates"] = tuple(float(r) for r in given.get("request_rates", ()))
    return LoadSettings(**given)


@dataclass(frozen=True)
class Limits:
    """The p99 limits a load curve is judged by (None: none), and where each came from."""

    p99_tpot_ms: float | None = None
    p99_ttft_s: float | None = None
    source: str = "none"

    def goodput_ms(self) -> tuple[tuple[str, float], ...]:
        """bench_serving's --goodput SLOs in ms (sglang/benchmark/goodput.py:12, :36-40)."""
        out: list[tuple[str, float]] = []
        if self.p99_ttft_s is not None:
            out.append(("ttft", self.p99_ttft_s * 1000))
        if self.p99_tpot_ms is not None:
            out.append(("tpot", self.p99_tpot_ms))
        return tuple(out)


def limits(settings: LoadSettings, tune_tpot_ms: float | None = None, tune_ttft_s: float | None = None) -> Limits:
    """The load's own limits, else the tune's (read on the load curve's p99 instead of the probe's means)."""
    tpot = settings.max_p99_tpot_ms if settings.max_p99_tpot_ms is not None else tune_tpot_ms
    ttft = settings.max_p99_ttft_s if settings.max_p99_ttft_s is not None else tune_ttft_s
    own = settings.max_p99_tpot_ms is not None or settings.max_p99_ttft_s is not None
    return Limits(tpot, ttft, "none" if tpot is None and ttft is None else "load" if own else "tune")


def load_spec(settings: LoadSettings, gen_tokens: int, lim: Limits) -> LoadSpec:
    levels = settings.levels()
    prompts = tuple(settings.prompts or (max(MIN_PROMPTS, 4 * lv.concurrency) if lv.concurrency is not None
                                         else RATE_LEVEL_PROMPTS) for lv in levels)
    assert all(math.isfinite(lv.request_rate) or lv.concurrency for lv in levels)
    return LoadSpec(levels=levels, prompts=prompts, input_len=settings.input_len,
                    output_len=settings.output_len or gen_tokens, backend=settings.backend, seed=settings.seed,
                    goodput_ms=lim.goodput_ms(), tokenizer=settings.tokenizer, timeout_s=settings.timeout_s)
