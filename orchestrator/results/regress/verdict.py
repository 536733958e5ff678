"""Per-metric verdicts of one grid point against its baseline: pure functions, numbers in, a `Verdict` out.

Two kinds of metric (docs/schedule.md, "Regressions"):

- **exact**: the commit length and accept rate of a temperature-0 probe. On the same engine build they repeat to the
  last digit, so any change is real and is reported as it is (`2.85 → 2.40`). When the baseline itself is not
  constant (an engine that is not deterministic), the metric is judged as noisy instead, and the verdict says so.
- **noisy**: throughput and verify time. Judged against the baseline's spread: the median and the MAD of the
  baseline runs (each run's mean over its repeats). A change is flagged when it is at least `min_rel_change` of the
  median AND, with 3 or more baseline runs, more than `max_z` robust standard deviations (1.4826 MAD) from it.
  With fewer baseline runs there is no spread to judge by: with repeats, the baseline's median must lie outside this
  run's 95 % interval; without, the change must be at least GROSS_FACTOR x `min_rel_change`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config.settings import RegressSettings
from specsweep_vocab.stats import interval

# metric -> +1 when higher is better, -1 when lower is better
EXACT_METRICS = {"commit_len_mean": +1, "accept_rate": +1}
NOISY_METRICS = {"decode_tok_s": +1, "throughput_tok_s": +1, "verify_step_ms": -1}
METRICS = {**EXACT_METRICS, **NOISY_METRICS}
MAD_TO_SIGMA = 1.4826  # MAD of a normal sample x this = its standard deviation
MIN_RUNS_FOR_SPREAD = 3  # with fewer baseline runs the MAD means nothing: min_rel_change alone decides
# with too few baseline runs for a spread and no repeats, only a change this many times min_rel_change is flagged
GROSS_FACTOR = 5.0
EXACT_TOLERANCE = 1e-9  # relative: float formatting through MLflow, never a measured difference

REGRESSION, IMPROVEMENT, UNCHANGED, NO_BASELINE = "regression", "improvement", "unchanged", "no baseline"

@dataclass(frozen=True)
class Verdict:
    metric: str
    kind: str  # exact | noisy
    status: str  # regression | improvement | unchanged | no baseline
    current: float
    baseline: float  # exact: the baseline's value; noisy: its median
    n_baseline: int  # baseline runs
    rel_change: float  # (current - baseline) / |baseline|
    z: float | None  # noisy with a spread: robust z
    why: str

    @property
    def flagged(self) -> bool:
        return self.status in (REGRESSION, IMPROVEMENT)

    def change_text(self) -> str:
        if self.status == NO_BASELINE:
            return "no baseline"
        return f"{self.baseline:.4g} → {self.current:.4g} ({self.rel_change:+.1%})"


def _direction(metric: str, delta: float) -> str:
    return IMPROVEMENT if delta * METRICS.get(metric, +1) > 0 else REGRESSION


def _constant(values: Sequence[float]) -> bool:
    return max(values) - min(values) <= EXACT_TOLERANCE * max(1.0, abs(max(values)))


def judge(metric: str, baseline: Sequence[float], current: Sequence[float], settings: RegressSettings) -> Verdict:
    """`baseline`: one value per baseline run (its mean over repeats), oldest first; `current`: this run's repeats."""
    if not current:
        raise ValueError(f"{metric}: no current value to judge")
    x = statistics.fmean(current)
    if not baseline:
        return Verdict(metric, "exact" if metric in EXACT_METRICS else "noisy", NO_BASELINE, x, math.nan, 0, math.nan,
                       None, "no earlier run of this point")
    if metric in EXACT_METRICS and _constant(baseline):
        b = baseline[-1]
        delta = x - b
        rel = delta / abs(b) if b else (math.inf if delta else 0.0)
        if abs(delta) <= EXACT_TOLERANCE * max(1.0, abs(b)):
            return Verdict(metric, "exact", UNCHANGED, x, b, len(baseline), 0.0, None, "identical (deterministic)")
        return Verdict(metric, "exact", _direction(metric, delta), x, b, len(baseline), rel, None,
                       f"exact: {b:.6g} in all {len(baseline)} baseline run(s), now {x:.6g} (temperature 0 repeats "
                       "exactly on one engine build: any change is real)")
    med = statistics.median(baseline)
    mad = statistics.median(abs(v - med) for v in baseline)
    sigma = MAD_TO_SIGMA * mad
    delta = x - med
    rel = delta / abs(med) if med else (math.inf if delta else 0.0)
    note = "" if metric in NOISY_METRICS else " (baseline not constant: judged as noisy)"
    z = delta / sigma if sigma > 0 else None
    big = abs(rel) >= settings.min_rel_change
    if len(baseline) >= MIN_RUNS_FOR_SPREAD and sigma > 0:
        flagged = big and abs(delta) > settings.max_z * sigma
        why = (f"median {med:.4g} of {len(baseline)} runs, robust sd {sigma:.3g}: z={delta / sigma:+.1f} "
               f"(limit {settings.max_z:g}), change {rel:+.1%} (min {settings.min_rel_change:.0%}){note}")
    elif len(current) > 1:  # no spread in the baseline: this run's own repeats give one
        ci = interval(current)
        flagged = big and abs(delta) > ci.half_width
        why = (f"median {med:.4g} of {len(baseline)} run(s) (too few for a spread); this run {ci}: change "
               f"{rel:+.1%} (min {settings.min_rel_change:.0%}), baseline {'outside' if flagged else 'inside'} "
               f"its 95 % interval{note}")
    else:
        flagged = abs(rel) >= GROSS_FACTOR * settings.min_rel_change
        why = (f"median {med:.4g} of {len(baseline)} run(s), too few for a spread and no repeats: change "
               f"{rel:+.1%}, flagged from {GROSS_FACTOR * settings.min_rel_change:.0%} "
               f"({GROSS_FACTOR:g} x min_rel_change){note}")
    status = _direction(metric, delta) if flagged else UNCHANGED
    return Verdict(metric, "noisy", status, x, med, len(baseline), rel, z, why)
