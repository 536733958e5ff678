"""Per-metric verdicts of one grid point against its baseline: pure functions, numbers in, a `Verdict` out.

Two kinds of metric (docs/schedule.md, "Regressions"):

- **exact**: the commit length and accept rate of a temperature-0 probe. On the same engine build they repeat to the
  last digit, so any change is real and is reported as it is (`2.85 → 2.40`). When the baseline itself is not
  constant (an engine that is not deterministic), the metric is judged as noisy instead, and the verdict says so.
- **noisy**: throughput and verify time, judged on a log scale (a change is a factor). The sweep-to-sweep spread is
  a `Noise`: the within-point variance of the log values, pooled over every point of one engine, node and
  `probe.repeats` in the recent history (`pooled_noise`; 4 points x 5 runs give 16 degrees of freedom where one
  point's 5 runs give 4). A new value is flagged when it is at least `min_rel_change` from the baseline's geometric
  mean AND outside the Student-t prediction interval for one new value: |log x - mean| > q * sd * sqrt(1 + 1/n), n
  the point's baseline runs, q the t quantile (df of the pool) with the two-sided tail of a normal `max_z`
  (`limit_q`). With no spread between sweeps (no point has 2 earlier runs: the second sweep ever) a noisy metric is
  not judged (status `no spread`): its change is shown, never flagged. This run's repeats do not replace it: their
  95 % interval bounds the noise within one sweep, not the drift between sweeps (a loaded host moves every value of
  a sweep together), so on a shared machine it would flag the drift.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.config.settings import RegressSettings
from orchestrator.results.metric_catalogue import EXACT_WATCHED, NOISY_WATCHED, WATCHED

# metric -> +1 when higher is better, -1 when lower is better: the catalogue's watched metrics
EXACT_METRICS, NOISY_METRICS, METRICS = EXACT_WATCHED, NOISY_WATCHED, WATCHED
EXACT_TOLERANCE = 1e-9  # relative: float formatting through MLflow, never a measured difference

REGRESSION, IMPROVEMENT, UNCHANGED, NO_BASELINE = "regression", "improvement", "unchanged", "no baseline"
NO_SPREAD = "no spread"  # a noisy metric with no sweep-to-sweep spread to judge it by: shown, never flagged
EXCURSION = "excursion"  # outside the limit on one point, one sweep, unconfirmed (compare.confirm): never flagged


@dataclass(frozen=True)
class Noise:
    """Sweep-to-sweep spread of one metric: the standard deviation of its log values around each point's own mean,
    pooled over `points` points (the classical pooled variance, `df` = sum over points of runs - 1)."""

    sd: float
    df: int
    points: int

    def __str__(self) -> str:
        return f"sd {self.sd:.1%} (log, pooled over {self.points} point(s), df {self.df})"


def pooled_noise(series: Iterable[Sequence[float]]) -> Noise | None:
    """`series`: per point, its baseline values (one per run). None when no point has 2 positive values (no
    spread), or a point has a non-positive value (no log scale: the point is left out of the pool)."""
    ss, df, points = 0.0, 0, 0
    for values in series:
        if len(values) < 2 or min(values) <= 0:
            continue
        logs = [math.log(v) for v in values]
        m = statistics.fmean(logs)
        ss += sum((y - m) ** 2 for y in logs)
        df += len(logs) - 1
        points += 1
    return Noise(math.sqrt(ss / df), df, points) if df else None


def limit_q(max_z: float, df: int) -> float:
    """The Student-t quantile (df degrees of freedom) with the two-sided tail of a normal at `max_z`: the same
    false-alarm rate per verdict as a z of max_z with a known spread, honest about a spread estimated from few
    values (df 4: 17.4 for max_z 4; df 16: 5.4; df 32: 4.6)."""
    from scipy.special import ndtr, stdtrit

    return float(stdtrit(df, ndtr(max_z)))


@dataclass(frozen=True)
class Verdict:
    metric: str
    kind: str  # exact | noisy
    status: str  # regression | improvement | unchanged | no baseline | no spread | excursion
    current: float
    baseline: float  # exact: the baseline's value; noisy: its geometric mean (median when not all positive)
    n_baseline: int  # baseline runs
    rel_change: float  # (current - baseline) / |baseline|
    z: float | None  # noisy with a pooled spread: log change / prediction sd
    why: str
    limit: float | None = None  # the |z| above which it is flagged (`limit_q`)

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


def _exact(metric: str, baseline: Sequence[float], x: float) -> Verdict:
    b = baseline[-1]
    delta = x - b
    rel = delta / abs(b) if b else (math.inf if delta else 0.0)
    if abs(delta) <= EXACT_TOLERANCE * max(1.0, abs(b)):
        return Verdict(metric, "exact", UNCHANGED, x, b, len(baseline), 0.0, None, "identical (deterministic)")
    return Verdict(metric, "exact", _direction(metric, delta), x, b, len(baseline), rel, None,
                   f"exact: {b:.6g} in all {len(baseline)} baseline run(s), now {x:.6g} (temperature 0 repeats "
                   "exactly on one engine build: any change is real)")


def judge(metric: str, baseline: Sequence[float], current: Sequence[float], settings: RegressSettings,
          noise: Noise | None = None) -> Verdict:
    """`baseline`: one value per baseline run (its mean over repeats), oldest first; `current`: this run's repeats;
    `noise`: the metric's pooled spread over the sweep's points (`pooled_noise`); None: this point's own baseline's."""
    if not current:
        raise ValueError(f"{metric}: no current value to judge")
    x = statistics.fmean(current)
    if not baseline:
        return Verdict(metric, "exact" if metric in EXACT_METRICS else "noisy", NO_BASELINE, x, math.nan, 0, math.nan,
                       None, "no earlier run of this point")
    if metric in EXACT_METRICS and _constant(baseline):
        return _exact(metric, baseline, x)
    note = "" if metric in NOISY_METRICS else " (baseline not constant: judged as noisy)"
    positive = min(baseline) > 0 and x > 0
    center = math.exp(statistics.fmean(math.log(v) for v in baseline)) if positive else statistics.median(baseline)
    delta = x - center
    rel = delta / abs(center) if center else (math.inf if delta else 0.0)
    big = abs(rel) >= settings.min_rel_change
    noise = noise if noise is not None else pooled_noise([baseline])
    z = q = None
    if positive and noise is not None and noise.sd > 0:
        pred = noise.sd * math.sqrt(1 + 1 / len(baseline))
        z = math.log(x / center) / pred
        q = limit_q(settings.max_z, noise.df)
        flagged = big and abs(z) > q
        why = (f"geometric mean {center:.4g} of {len(baseline)} run(s), spread {noise}: change {rel:+.1%} = "
               f"{z:+.1f} prediction sd (limit {q:.2f}: t, df {noise.df}, tail of z {settings.max_z:g}; "
               f"min {settings.min_rel_change:.0%}){note}")
    else:
        return Verdict(metric, "noisy", NO_SPREAD, x, center, len(baseline), rel, None,
                       f"not judged: baseline {center:.4g} of {len(baseline)} run(s) and no point of this engine with 2 "
                       f"earlier runs, so no spread between sweeps to judge a noisy metric by (change {rel:+.1%}; this "
                       f"run's repeats bound the noise within one sweep, not the drift between sweeps){note}")
    status = _direction(metric, delta) if flagged else UNCHANGED
    return Verdict(metric, "noisy", status, x, center, len(baseline), rel, z, why, q)
