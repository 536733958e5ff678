"""A load curve's request, as the driver sends it to the node that runs the server (workers/load_curve.py).

    LoadLevel(concurrency=4)          bench_serving --max-concurrency 4 (requests sent as fast as slots free up)
    LoadLevel(request_rate=2.0)       bench_serving --request-rate 2.0 (Poisson arrivals), no concurrency cap
    LoadSpec(levels, ...)             the levels and the workload every level sends

Standard library only: specsweep_common is shared by the driver and the workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadLevel:
    concurrency: int | None = None  # --max-concurrency (None: not capped)
    request_rate: float = math.inf  # --request-rate, requests/s (inf: all at once, within the concurrency cap)

    @property
    def label(self) -> str:
        """`c4` (concurrency 4) or `r2.5` (2.5 requests/s): the level's part of a metric name."""
        if self.concurrency is not None and math.isinf(self.request_rate):
            return f"c{self.concurrency}"
        rate = f"r{self.request_rate:g}"
        return rate if self.concurrency is None else f"{rate}c{self.concurrency}"


@dataclass(frozen=True)
class LoadSpec:
    levels: tuple[LoadLevel, ...]
    prompts: tuple[int, ...]  # requests per level (same order as levels)
    input_len: int  # --random-input-len (random-ids, range ratio 1: every prompt this long)
    output_len: int  # --random-output-len
    backend: str = "sglang"  # bench_serving --backend: sglang (native /generate), sglang-oai, sglang-oai-chat
    seed: int = 1
    goodput_ms: tuple[tuple[str, float], ...] = ()  # bench_serving --goodput KEY:MS (ttft, tpot, e2el)
    tokenizer: str | None = None  # --model/--tokenizer (None: /model_info's tokenizer_path)
    timeout_s: float = 1800.0  # one level's bench_serving, at most
    extra_args: tuple[str, ...] = field(default=())  # more bench_serving flags, as given
