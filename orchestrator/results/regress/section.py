"""The report's "Changes since <baseline>" section: the one call the report's build makes
(`orchestrator/results/report/build.py`).

    changes = changes_section(client, parent_run_id, out_dir)
    changes.markdown   the section (top of diagnosis.md); changes.plots: one PNG per flagged metric over time

It loads the sweep's history, compares (orchestrator/results/regress/baseline_compare.py), tags the parent (`regression`:
"none" or "<metric> on <n> point(s); ...") and every compared child (`regression`: the metrics that worsened, or
"none"; `<metric>.interval`: mean ± 95 % over its repeats when it has more than one), and draws the plots.
A failure here is logged and leaves the rest of the report alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.results.regress.changepoints import change_points
from orchestrator.results.regress.baseline_compare import Comparison, PointResult, compare
from orchestrator.results.regress.history import BaselineError, History, load_history, point_series, select_baseline
from orchestrator.results.regress.history import settings_of
from orchestrator.results.regress.verdict import EXCURSION, NO_BASELINE, NO_SPREAD
from orchestrator.results.store_layout import REGRESSION_TAG

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Changes:
    markdown: str
    plots: tuple[Path, ...] = ()
    comparison: Comparison | None = None

    @property
    def regressed(self) -> bool:
        return bool(self.comparison and self.comparison.regressions)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _point_rows(p: PointResult) -> list[str]:
    rows = []
    for v in p.flagged:
        now = str(p.intervals[v.metric]) if v.metric in p.intervals else f"{v.current:.4g}"
        rows.append(f"| {_cell(p.run.name)} | {v.metric} | {v.kind} | {v.baseline:.4g} | {now} | "
                    f"{v.rel_change:+.1%} | **{v.status}** | {_cell(v.why)} |")
    return rows


def render(c: Comparison, history: History, plots: list[Path]) -> str:
    lines = [f"# Changes since {c.baseline.label}", ""]
    if not c.baseline.parents:
        return "\n".join(lines + ["Nothing to compare with yet: this is the sweep's first FINISHED run.", ""])
    judged = [p for p in c.points if any(v.status != NO_BASELINE for v in p.verdicts)]
    flagged = [p for p in c.points if p.flagged]
    new = len(c.points) - len(judged)
    lines.append(f"{len(judged)} point(s) compared with {len(c.baseline.parents)} baseline run(s)"
                 + (f"; {new} point(s) new (no baseline run)" if new else "") + ": "
                 + (f"{len(c.regressions)} regression(s), "
                    f"{sum(len(p.flagged) for p in flagged) - len(c.regressions)} improvement(s)."
                    if flagged else "no change beyond the noise."))
    unjudged = sorted({v.metric for p in c.points for v in p.verdicts if v.status == NO_SPREAD})
    if unjudged:
        lines.append(f"Not judged: {', '.join(unjudged)} (noisy; no point has 2 earlier runs yet, so there is no "
                     "spread between sweeps to judge them by; the exact metrics are judged).")
    excursions = [f"{p.run.name} {v.metric} {v.rel_change:+.1%}" for p in c.points for v in p.verdicts
                  if v.status == EXCURSION]
    if excursions:
        lines.append(f"Not confirmed (one point, one sweep, nothing else moved: not flagged; flagged if the next sweep "
                     f"repeats it): {'; '.join(excursions)}.")
    lines.append("")
    if flagged:
        lines += ["| point | metric | kind | baseline | now | change | verdict | why |", "|---|---|---|---|---|---|---|---|"]
        for p in flagged:
            lines += _point_rows(p)
        lines += ["", "**Pattern across the grid**", ""] + [f"- {s}" for s in c.patterns]
        lines += [f"- {n}" for n in c.notes]
        lines += ["", "**What differs from the baseline runs**", ""]
        for p in flagged:
            lines.append(f"- {p.run.name}: " + ("; ".join(p.differences) or "nothing recorded differs (same git sha, "
                                                                               "engine, server args, GPU and node)"))
        cps = _change_point_lines(history, flagged)
        if cps:
            lines += ["", "**Change points in the history** (ruptures PELT)", ""] + cps
        lines += [""] + [f"![{f.stem}](report/{f.name})" for f in plots]
    return "\n".join(lines) + "\n"


def _change_point_lines(history: History, flagged: list[PointResult]) -> list[str]:
    out = []
    for p in flagged:
        for v in p.flagged:
            series = point_series(history, p.run.point_key, v.metric)
            cps = change_points([sum(vs) / len(vs) for _, vs in series])
            if cps:
                out.append(f"- {p.run.name} {v.metric}: level changed at "
                           + ", ".join(series[i][0].label for i in cps))
    return out


def plot_metric(path: Path, history: History, points: list[PointResult], metric: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for p in points:
        series = point_series(history, p.run.point_key, metric)
        if not series:
            continue
        xs = list(range(len(series)))
        ys = [sum(vs) / len(vs) for _, vs in series]
        ax.plot(xs, ys, marker="o", label=p.run.name[:60])
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    labels = [par.label for par, _ in point_series(history, points[0].run.point_key, metric)]
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} over the sweep's runs (flagged points)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _tag(client, c: Comparison) -> None:
    from mlflow.entities import RunTag

    for p in c.points:
        worse = sorted(v.metric for v in p.verdicts if v.status == "regression")
        tags = [RunTag(REGRESSION_TAG, ",".join(worse) or "none")]
        tags += [RunTag(f"{m}.interval", str(i)) for m, i in p.intervals.items() if i.n > 1]
        client.log_batch(p.run.run_id, tags=tags)


def changes_section(client, parent_run_id: str, out: Path) -> Changes:
    """The section, its plots in `out` and the `regression` tags; never raises (a failure becomes the section)."""
    try:
        parent = client.get_run(parent_run_id)
        settings = settings_of(dict(parent.data.params))
        if not settings.enabled:
            return Changes("")
        history = load_history(client, parent.info.experiment_id, include=parent_run_id)
        baseline = select_baseline(client, history, parent_run_id, settings)
        c = compare(history, parent_run_id, baseline, settings)
        plots = []
        for metric in c.flagged_metrics:
            points = [p for p in c.points if any(v.metric == metric for v in p.flagged)]
            if plot_metric(out / f"changes_{metric}.png", history, points, metric):
                plots.append(out / f"changes_{metric}.png")
        _tag(client, c)
        client.set_tag(parent_run_id, REGRESSION_TAG, c.tag())
        client.set_tag(parent_run_id, "regression.baseline", c.baseline.label[:5000])
        return Changes(render(c, history, plots), tuple(plots), c)
    except BaselineError as e:
        log.error("%s", e)
        return Changes(f"# Changes since the pinned baseline\n\nNot compared: {e}\n")
    except Exception as e:  # noqa: BLE001 - the regression check must never cost the sweep its report
        log.exception("the regression check of parent run %s failed", parent_run_id)
        return Changes(f"# Changes\n\nThe regression check failed: {e}\n")
