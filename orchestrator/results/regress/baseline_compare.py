"""Compare one parent run's points with their baseline: verdicts per point and metric, attribution, patterns.
Pure over a loaded `History` (orchestrator/results/regress/history.py): no MLflow here.

A noisy metric outside its limit on one point only is a **single excursion** until something confirms it (`confirm`):
a stall of a loaded host hits one probe of one point, a real change (an engine build, a driver, a drafter) hits every
point it touches and stays. Confirmed by: the same metric moving the same way on another point of the sweep; an
exact metric of the point changing; the median of the point's repeats (3 or more) outside the limit too; or the
point's previous run outside the same band the same way (two sweeps in a row). Unconfirmed: status `excursion`,
shown, never flagged.

    compare(history, current_id, baseline, settings) -> Comparison
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config.settings import RegressSettings
from orchestrator.results.regress.attribution import (GridPoint, differences, drafter_or_pipeline, grid_pattern,
                                                      node_of)
from orchestrator.results.regress.history import (Baseline, BaselineError, History, PointRun, means,
                                                  select_baseline)
from orchestrator.results.regress.verdict import (EXCURSION, METRICS, NO_BASELINE, NO_SPREAD, REGRESSION, Noise,
                                                  Verdict, judge, pooled_noise)
from specsweep_common.confidence_interval import Interval, interval


@dataclass(frozen=True)
class PointResult:
    run: PointRun
    point: GridPoint
    verdicts: tuple[Verdict, ...]
    intervals: dict[str, Interval]  # this run's mean and 95 % interval per metric (repeats)
    differences: tuple[str, ...]  # attribution tags that differ from the baseline runs
    # flagged noisy metrics whose median over 3+ repeats is outside the limit too (a stall moves one repeat)
    repeats_agree: frozenset[str] = frozenset()

    @property
    def flagged(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.flagged)


@dataclass(frozen=True)
class Comparison:
    baseline: Baseline
    points: tuple[PointResult, ...]
    patterns: tuple[str, ...]  # one line per (metric, direction) with flagged points
    notes: tuple[str, ...]  # diagnosis-rule conclusions

    @property
    def regressions(self) -> list[tuple[PointResult, Verdict]]:
        return [(p, v) for p in self.points for v in p.verdicts if v.status == REGRESSION]

    @property
    def flagged_metrics(self) -> list[str]:
        return sorted({v.metric for p in self.points for v in p.flagged})

    def tag(self) -> str:
        """The parent's `regression` tag: "none", or "<metric> on <n> point(s); ..." for each regressed metric."""
        counts: dict[str, int] = {}
        for _, v in self.regressions:
            counts[v.metric] = counts.get(v.metric, 0) + 1
        return "; ".join(f"{m} on {n} point(s)" for m, n in sorted(counts.items())) or "none"


def _int(params: dict[str, str], key: str) -> int:
    try:
        return int(float(params.get(key, "0")))
    except ValueError:
        return 0


def grid_point(run: PointRun) -> GridPoint:
    p = run.params
    return GridPoint(key=run.point_key, context_len=_int(p, "context_len"),
                     probe=p.get("probe.kind", "?"), drafter=p.get("drafter.name", "?"),
                     attention=p.get("attention.name", "?"), page_size=_int(p, "page_size"), node=node_of(run.tags),
                     is_oracle=p.get("drafter.is_oracle", "False").lower() == "true")


def noise_group(run: PointRun) -> tuple[str, str, str]:
    """Points whose sweep-to-sweep spread is pooled: one engine on one node at one probe.repeats (a mean of N
    repeats has its own spread)."""
    return (run.tags.get("engine") or run.params.get("engine.kind", "?"), node_of(run.tags),
            run.params.get("probe.repeats", "1"))


def noise_parents(history: History, current_id: str, baseline: Baseline, settings: RegressSettings) -> Baseline:
    """The parents whose spread judges the noisy metrics: the baseline's, and the sweep's last `regress.history`
    FINISHED parents before this one (a pinned baseline is one run: its spread comes from the recent history)."""
    current = history.by_id(current_id)
    earlier = [p for p in history.parents if p.run_id != current_id
               and (current is None or p.start_time < current.start_time)][-settings.history:]
    chosen = {p.run_id: p for p in (*baseline.parents, *earlier)}
    return Baseline("noise", tuple(chosen.values()))


def pooled(runs: Sequence[PointRun], parents: Baseline) -> dict[tuple[tuple[str, str, str], str], Noise | None]:
    """(noise group, metric) -> the metric's spread pooled over the group's points in `parents`."""
    series: dict[tuple[tuple[str, str, str], str], list[list[float]]] = {}
    for r in runs:
        for metric in METRICS:
            series.setdefault((noise_group(r), metric), []).append(means(parents.runs_of(r.point_key), metric))
    return {k: pooled_noise(v) for k, v in series.items()}


def judge_point(run: PointRun, baseline_runs: Sequence[PointRun], settings: RegressSettings,
                noise: dict[str, Noise | None] | None = None) -> PointResult:
    """`noise`: metric -> its pooled spread over the sweep's points (`pooled`); absent: this point's own."""
    verdicts, intervals, agree = [], {}, set()
    for metric in METRICS:
        current = run.values(metric)
        if not current:
            continue
        intervals[metric] = interval(current)
        base, spread = means(baseline_runs, metric), (noise or {}).get(metric)
        v = judge(metric, base, current, settings, spread)
        verdicts.append(v)
        if v.flagged and len(current) >= 3 and \
                judge(metric, base, [statistics.median(current)], settings, spread).status == v.status:
            agree.add(metric)
    diffs = tuple(differences(run.tags, [b.tags for b in baseline_runs])) if baseline_runs else ()
    return PointResult(run, grid_point(run), tuple(verdicts), intervals, diffs, frozenset(agree))


def raw_points(history: History, ref_id: str, runs: Sequence[PointRun], baseline: Baseline,
               settings: RegressSettings) -> tuple[PointResult, ...]:
    """`runs` judged against `baseline` with the spread `ref_id`'s comparison uses, before any confirmation."""
    noise = pooled(runs, noise_parents(history, ref_id, baseline, settings))
    return tuple(judge_point(r, baseline.runs_of(r.point_key), settings,
                             {m: noise.get((noise_group(r), m)) for m in METRICS}) for r in runs)


def _previous(history: History, current_id: str) -> str | None:
    current = history.by_id(current_id)
    earlier = [p for p in history.parents if p.run_id != current_id
               and (current is None or p.start_time < current.start_time)]
    return earlier[-1].run_id if earlier else None


def confirm(history: History, current_id: str, points: tuple[PointResult, ...],
            settings: RegressSettings) -> tuple[PointResult, ...]:
    """Each flagged noisy verdict confirmed (module docstring) or turned into an `excursion` (not flagged); a noisy
    metric outside the band of the previous sweep's baseline in this sweep and the previous one, the same way, is
    flagged as judged against that baseline (the previous excursion would otherwise widen its own band)."""
    moved: dict[tuple[str, str], int] = {}
    for p in points:
        for v in p.flagged:
            moved[(v.metric, v.status)] = moved.get((v.metric, v.status), 0) + 1
    persistent = _persistent(history, current_id, points, settings)
    out = []
    for p in points:
        exact = [v.metric for v in p.flagged if v.kind == "exact"]
        verdicts = []
        for v in p.verdicts:
            if v.kind == "exact" or v.status in (NO_BASELINE, NO_SPREAD):
                verdicts.append(v)
                continue
            why = None
            if v.flagged and moved[(v.metric, v.status)] > 1:
                why = f"confirmed: {v.metric} moved the same way on {moved[(v.metric, v.status)] - 1} other point(s)"
            elif v.flagged and exact:
                why = f"confirmed: the exact {', '.join(exact)} of this point changed too"
            elif v.flagged and v.metric in p.repeats_agree:
                why = f"confirmed: the median of its {len(p.run.values(v.metric))} repeats is outside the limit too"
            if why is not None:
                verdicts.append(dataclasses.replace(v, why=f"{v.why}; {why}"))
            elif (twice := persistent.get((p.run.point_key, v.metric))) is not None:
                verdicts.append(dataclasses.replace(twice, why=f"{twice.why}; confirmed: its previous run was outside "
                                                    "this band the same way (two sweeps in a row, judged against the "
                                                    "baseline before the first)"))
            elif v.flagged:
                verdicts.append(dataclasses.replace(v, status=EXCURSION, why=f"{v.why}; NOT confirmed: one point, one "
                                                    "sweep, no exact metric moved (a stall of a loaded host looks "
                                                    "like this; flagged when the next sweep repeats it)"))
            else:
                verdicts.append(v)
        out.append(dataclasses.replace(p, verdicts=tuple(verdicts)))
    return tuple(out)


def _persistent(history: History, current_id: str, points: tuple[PointResult, ...],
                settings: RegressSettings) -> dict[tuple[str, str], Verdict]:
    """(point_key, metric) -> this run's verdict against the previous sweep's baseline, where the previous sweep's
    run and this one are both outside that band, the same way."""
    prev_id = _previous(history, current_id)
    prev = history.by_id(prev_id) if prev_id is not None else None
    if prev_id is None or prev is None:
        return {}
    try:
        base = select_baseline(None, history, prev_id, settings)
    except BaselineError:  # the previous sweep is the pinned baseline itself
        return {}
    if not base.parents:
        return {}
    before = raw_points(history, prev_id, prev.children, base, settings)
    now = raw_points(history, prev_id, [p.run for p in points], base, settings)
    flagged_before = {(p.run.point_key, v.metric, v.status) for p in before for v in p.flagged if v.kind == "noisy"}
    return {(p.run.point_key, v.metric): v for p in now for v in p.flagged
            if (p.run.point_key, v.metric, v.status) in flagged_before}


def compare(history: History, current_id: str, baseline: Baseline, settings: RegressSettings) -> Comparison:
    current = history.by_id(current_id)
    runs = current.children if current else ()
    points = confirm(history, current_id, raw_points(history, current_id, runs, baseline, settings), settings)
    grid = [p.point for p in points]
    patterns, notes = [], []
    for metric in METRICS:
        for status in ("regression", "improvement"):
            hit = {p.point.key for p in points for v in p.verdicts if v.metric == metric and v.status == status}
            if hit:
                verb = "worsened" if status == REGRESSION else "improved"
                patterns.append(f"{metric} {verb} {grid_pattern(grid, hit)}")
        fell = {p.point.key for p in points for v in p.verdicts if v.metric == metric and v.flagged
                and v.current < v.baseline}
        if (note := drafter_or_pipeline(metric, fell, grid)) is not None:
            notes.append(note)
    return Comparison(baseline, points, tuple(patterns), tuple(notes))
