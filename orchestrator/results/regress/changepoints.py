"""Change points in a point's history of one metric: where its level stepped, with `ruptures` (PELT, least-squares
cost). docs/schedule.md says why this library ("Change points": tools/bench_changepoints.py's numbers).

    change_points(values) -> list[int]      indices where a new level starts (0 < i < len(values))
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MIN_SIZE = 2  # fewest runs in one level
PENALTY_PER_LOG_N = 3.0  # PELT's penalty = this x ln(n), on values scaled to unit noise (BIC-like)
MAD_TO_SIGMA = 1.4826


def _steps(values: Sequence[float]) -> list[int]:
    return [i for i in range(1, len(values)) if values[i] != values[i - 1]]


def noise_sigma(values: Sequence[float]) -> float:
    """Robust noise level from successive differences (insensitive to the steps themselves)."""
    diffs = [abs(b - a) for a, b in zip(values, values[1:])]
    return MAD_TO_SIGMA * statistics.median(diffs) / math.sqrt(2) if diffs else 0.0


def change_points(values: Sequence[float]) -> list[int]:
    """Start indices of new levels. Values without noise (an exact metric) change where they change; noisy ones are
    segmented by PELT on the values scaled by their robust noise level."""
    if len(values) < 2:
        return []
    sigma = noise_sigma(values)
    if sigma == 0.0:
        return _steps(values)
    if len(values) < 2 * MIN_SIZE:
        return []
    import numpy as np
    import ruptures as rpt

    signal = (np.asarray(values, dtype=float) - statistics.median(values)) / sigma
    algo = rpt.Pelt(model="l2", min_size=MIN_SIZE, jump=1).fit(signal.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=PENALTY_PER_LOG_N * math.log(len(values)))[:-1]]
