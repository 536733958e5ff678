"""`specsweep-report --history <sweep>`: each metric over time, per grid point, with its change points.

    render_history(history, metrics=METRICS) -> str     Markdown: one table per point (point_key), a row per
                                                         FINISHED parent run, `*` after a value where a new level
                                                         starts (orchestrator/results/regress/changepoints.py)
    experiment_for_sweep(client, sweep) -> (experiment id, name)   `<sweep>`, else `<sweep>-stub`
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.results.regress.changepoints import change_points
from orchestrator.results.regress.history import History, PointRun
from orchestrator.results.regress.verdict import METRICS
from specsweep_common.confidence_interval import interval
from orchestrator.results.store_layout import STUB_EXPERIMENT_SUFFIX



def experiment_for_sweep(client, sweep: str) -> tuple[str, str]:
    """The sweep's experiment: its name, or the stub engine's `<name>-stub`. Raises ValueError naming the ones there
    are."""
    for name in (sweep, sweep + STUB_EXPERIMENT_SUFFIX):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id, exp.name
    names = sorted(e.name for e in client.search_experiments())
    raise ValueError(f"--history {sweep!r}: no such sweep; sweeps here: {', '.join(names) or 'none'}")


def _points(history: History) -> dict[str, PointRun]:
    """point_key -> its latest run (for the point's name)."""
    latest: dict[str, PointRun] = {}
    for p in history.parents:
        for c in p.children:
            latest[c.point_key] = c
    return latest


def render_history(history: History, metrics: Sequence[str] = tuple(METRICS)) -> str:
    lines = []
    for key, last in sorted(_points(history).items(), key=lambda kv: kv[1].name):
        rows = [(p, next(c for c in p.children if c.point_key == key)) for p in history.parents
                if any(c.point_key == key for c in p.children)]
        shown = [m for m in metrics if any(c.values(m) for _, c in rows)]
        marks = {}
        for m in shown:
            series = [(i, sum(c.values(m)) / len(c.values(m))) for i, (_, c) in enumerate(rows) if c.values(m)]
            marks[m] = {series[i][0] for i in change_points([v for _, v in series])}
        lines += [f"## {last.name}", "", f"point_key {key}, {len(rows)} run(s); `*`: a new level starts (change point)",
                  "", "| parent run | git_sha | engine_version | " + " | ".join(shown) + " |",
                  "|---|---|---|" + "---|" * len(shown)]
        for i, (p, c) in enumerate(rows):
            cells = []
            for m in shown:
                vs = c.values(m)
                cells.append((str(interval(vs)) if vs else "") + (" *" if i in marks[m] else ""))
            lines.append(f"| {p.label} | {c.tags.get('git_sha', '')[:10]} | {c.tags.get('engine_version', '')} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) if lines else "No FINISHED run with a point_key in this sweep yet.\n"
