"""A run's spread over its repeats (`probe.repeats`): the mean and a 95 % confidence interval, Student's t.

    interval(values) -> Interval(mean, half_width, n)     half_width 0 for a single value

Why Student's t and not a bootstrap: a point has few repeats (2 to a handful; probe.repeats allows up to
MAX_REPEATS). A percentile bootstrap of 3 to 5 values can only return values already seen and covers the true
mean far less often than it claims (about 60 % nominal-95 % coverage at n = 3, 75 % at n = 5 for normal data),
while the t-interval is exact for normal errors at every n and robust enough for the sums of many step times that
throughput and verify time are. docs/schedule.md ("Repeats") says the same. Used by the workers (the interval they
record) and by the regression check (the interval it judges with), so both compute it one way.

Standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t, two-sided 95 %, by degrees of freedom (1..30); above 30 the normal 1.96 is within 2 %.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with `df` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass(frozen=True)
class Interval:
    """Mean and 95 % confidence interval (Student's t) of one run's repeats; half_width 0 for a single value."""

    mean: float
    half_width: float
    n: int

    @property
    def lo(self) -> float:
        return self.mean - self.half_width

    @property
    def hi(self) -> float:
        return self.mean + self.half_width

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.half_width:.2g} (n={self.n})" if self.n > 1 else f"{self.mean:.4g}"


def interval(values: Sequence[float]) -> Interval:
    if not values:
        raise ValueError("interval of no values")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(mean, 0.0, 1)
    return Interval(mean, t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)), len(values))
