"""Winners that survive noise: pure functions over each leader's repeated values at one workload point.

    robust_score(values) -> float          median - 1.4826 * MAD: a lower bound a one-off fast run cannot lift
    pick(entries, tie_frac, noise) -> Pick  the winner, the runner-up, the no-speculation baseline, and whether each
                                           margin is larger than the noise

Why these rules:
- **median - 1.4826 MAD** (1.4826 MAD estimates the standard deviation of normal data; the median and MAD each
  ignore one outlier of three): on a shared host one repeat that ran while another job was idle is fast by chance;
  a mean or a max would crown it.
- **ties within `tie_frac` (1 %) go to fewer draft tokens**: a larger tree costs KV, memory bandwidth at larger
  batches and verify work that the short benchmark does not charge; within the noise the cheaper one is the safer
  deployment.
- **separable** uses the regression watch's spread model (orchestrator/results/regress/verdict.py): the spread of
  log values pooled over every leader at this point (`pooled_noise`), and the Student-t quantile with the pool's
  degrees of freedom (`limit_q`) at a two-sided 95 % (z 1.96): two medians whose log ratio exceeds
  q * sd * sqrt(1/n_a + 1/n_b) differ by more than the noise. Otherwise the table says "not separable".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from orchestrator.results.regress.verdict import Noise, limit_q, pooled_noise

MAD_TO_SD = 1.4826  # 1 / Phi^-1(3/4): MAD * this estimates the standard deviation of normal data
SEPARABLE_Z = 1.96  # two-sided 95 %


def robust_score(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("robust_score of no values")
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med - MAD_TO_SD * mad


@dataclass(frozen=True)
class Entry:
    """One leader at one workload point: its candidate key, label, draft tokens and repeated values."""

    key: str
    label: str
    draft_tokens: int  # 0: no speculation
    values: tuple[float, ...]

    @property
    def score(self) -> float:
        return robust_score(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)


@dataclass(frozen=True)
class Margin:
    rel: float  # (winner score - other score) / other score
    separable: bool
    why: str


@dataclass(frozen=True)
class Pick:
    ranked: tuple[Entry, ...]  # winner first
    noise: Noise | None
    tied: tuple[str, ...]  # keys within tie_frac of the best score (the tie rule chose among them)
    runner_up: Margin | None
    baseline: Entry | None  # the best no-speculation entry
    over_baseline: Margin | None

    @property
    def winner(self) -> Entry:
        return self.ranked[0]


def rank(entries: Sequence[Entry], tie_frac: float) -> tuple[list[Entry], list[str]]:
    """Best robust score first, except that among the entries within `tie_frac` of the best score the one with the
    fewest draft tokens leads (then the higher score)."""
    by_score = sorted(entries, key=lambda e: (-e.score, e.draft_tokens, e.key))
    best = by_score[0].score
    floor = best - abs(best) * tie_frac
    tied = [e for e in by_score if e.score >= floor]
    winner = min(tied, key=lambda e: (e.draft_tokens, -e.score, e.key))
    return [winner, *(e for e in by_score if e is not winner)], [e.key for e in tied]


def separable(a: Entry, b: Entry, noise: Noise | None) -> Margin:
    rel = (a.score - b.score) / abs(b.score) if b.score else math.inf
    if min(a.median, b.median) <= 0:
        return Margin(rel, False, "a median at or below 0: no log scale")
    log_ratio = math.log(a.median / b.median)
    if noise is None or noise.sd == 0:
        ok = log_ratio != 0
        return Margin(rel, ok, "no spread between repeats: any difference is real" if ok else "identical medians")
    q = limit_q(SEPARABLE_Z, noise.df)
    limit = q * noise.sd * math.sqrt(1 / len(a.values) + 1 / len(b.values))
    ok = abs(log_ratio) > limit
    return Margin(rel, ok, f"log ratio of medians {log_ratio:+.3f} vs limit {limit:.3f} (t {q:.2f}, df {noise.df}, "
                           f"sd {noise.sd:.1%})")


def pick(entries: Sequence[Entry], tie_frac: float) -> Pick:
    """The answer at one workload point from its leaders' repeats (each entry >= 3 values)."""
    if not entries:
        raise ValueError("pick among no entries")
    noise = pooled_noise([e.values for e in entries])
    ranked, tied = rank(entries, tie_frac)
    winner = ranked[0]
    runner = separable(winner, ranked[1], noise) if len(ranked) > 1 else None
    base = next((e for e in sorted(entries, key=lambda e: -e.score) if e.draft_tokens == 0), None)
    over = separable(winner, base, noise) if base is not None and base is not winner else None
    return Pick(tuple(ranked), noise, tuple(tied), runner, base, over)
