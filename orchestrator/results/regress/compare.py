"""Compare one parent run's points with their baseline: verdicts per point and metric, attribution, patterns.
Pure over a loaded `History` (orchestrator/results/regress/history.py): no MLflow here.

    compare(history, current_id, baseline, settings) -> Comparison
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config.settings import RegressSettings
from orchestrator.results.regress.attribution import (GridPoint, differences, drafter_or_pipeline, grid_pattern,
                                                      node_of)
from orchestrator.results.regress.history import Baseline, History, PointRun, means
from orchestrator.results.regress.verdict import METRICS, REGRESSION, Noise, Verdict, judge, pooled_noise
from specsweep_vocab.stats import Interval, interval


@dataclass(frozen=True)
class PointResult:
    run: PointRun
    point: GridPoint
    verdicts: tuple[Verdict, ...]
    intervals: dict[str, Interval]  # this run's mean and 95 % interval per metric (repeats)
    differences: tuple[str, ...]  # attribution tags that differ from the baseline runs

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
    verdicts, intervals = [], {}
    for metric in METRICS:
        current = run.values(metric)
        if not current:
            continue
        intervals[metric] = interval(current)
        verdicts.append(judge(metric, means(baseline_runs, metric), current, settings, (noise or {}).get(metric)))
    diffs = tuple(differences(run.tags, [b.tags for b in baseline_runs])) if baseline_runs else ()
    return PointResult(run, grid_point(run), tuple(verdicts), intervals, diffs)


def compare(history: History, current_id: str, baseline: Baseline, settings: RegressSettings) -> Comparison:
    current = history.by_id(current_id)
    runs = current.children if current else ()
    noise = pooled(runs, noise_parents(history, current_id, baseline, settings))
    points = tuple(judge_point(r, baseline.runs_of(r.point_key), settings,
                               {m: noise.get((noise_group(r), m)) for m in METRICS}) for r in runs)
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
