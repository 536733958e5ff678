"""A sweep's report, logged on its parent run: `diagnosis.md` and `report/` (summary.md with the pivot at the top,
summary.csv, summary.html, the plots, kernels.csv for kernel sweeps)."""

from __future__ import annotations

import csv
import io
import logging
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.settings import Thresholds
from orchestrator.results.console import print_markdown, print_table
from orchestrator.results.diagnosis import Diagnosis, Finding, diagnose
from orchestrator.results.diagnosis_md import render_markdown
from orchestrator.results.metric_catalogue import HEADLINE_METRICS
from orchestrator.results.regress.section import changes_section
from orchestrator.results.report.read_back import ChildRun, load_children, sweep_run_hashes, with_outputs
from orchestrator.results.report.plots import build_plots
from orchestrator.results.report.sections import SECTIONS, ReportContext, Section, render_sections
from orchestrator.results.report.tables import (KERNEL_COLUMNS, TABLE_COLUMNS, kernel_rows, pivot, render_csv,
                                                render_html, render_kernel_md, table_rows)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    parent_run_id: str
    sweep: str
    children: tuple[ChildRun, ...]
    findings: tuple[Finding, ...]
    diagnosis: Diagnosis
    diagnosis_md: str
    artifact_files: tuple[str, ...]
    summary_md: str = ""  # report/summary.md: the sections (pivot first, then every run)


def write_report(client, parent_run_id: str, thresholds: Thresholds = Thresholds(), sweep: str | None = None,
                 print_summary: bool = True, run_hashes: Collection[str] | None = None,
                 sections: Sequence[Section] = SECTIONS) -> Report:
    """Build the tables, plots and diagnosis of a sweep and log them as artifacts of its parent run.

    `run_hashes`: every point of the sweep (`Plan.run_hashes`); None reads the parent's `run_hashes.txt`."""
    if sweep is None:
        parent = client.get_run(parent_run_id)
        sweep = client.get_experiment(parent.info.experiment_id).name
    if run_hashes is None:
        run_hashes = sweep_run_hashes(client, parent_run_id)
    children = load_children(client, parent_run_id, run_hashes)
    engine_children = [c for c in children if c.job != "kernel"]
    finished = [c for c in engine_children if c.status == "FINISHED"]
    rows_finished = [c.row for c in finished]
    peak = max((r.metric("peak_bw_gbs") or 0.0 for r in rows_finished), default=0.0) or None
    diagnosis = diagnose(with_outputs(client, rows_finished), thresholds, peak_gbs=peak)
    krows = kernel_rows(children)
    if engine_children or not krows:
        diagnosis_md = render_markdown(diagnosis, sweep, earlier=sum(bool(c.earlier_parent) for c in finished))
    else:  # a kernel sweep: the engine rules have nothing to examine
        earlier = sum(bool(c.earlier_parent) for c in children if c.job == "kernel")
        diagnosis_md = f"# Diagnosis: {sweep}\n" + (
            f"\n{earlier} kernel run(s) from earlier invocations of this sweep (skipped on resume).\n" if earlier else "")
    if krows:
        diagnosis_md += "\n" + render_kernel_md(krows)
    rows = table_rows(engine_children)
    ctx = ReportContext(client, parent_run_id, sweep, tuple(engine_children), tuple(rows_finished), diagnosis)
    summary_md = render_sections(ctx, sections)
    with tempfile.TemporaryDirectory(prefix="specsweep-report-") as tmp:
        out = Path(tmp)
        changes = changes_section(client, parent_run_id, out)  # "Changes since <baseline>": orchestrator/results/regress
        diagnosis_md = changes.markdown + ("\n" if changes.markdown else "") + diagnosis_md
        (out / "summary.csv").write_text(render_csv(table_rows(engine_children, ci=False)))
        (out / "summary.md").write_text(summary_md)
        plots = [*changes.plots, *build_plots(out, client, engine_children)]
        (out / "summary.html").write_text(render_html(summary_md.split("## Every run")[0], rows, sweep,
                                                      diagnosis_md, images=[p for p in plots if p.suffix == ".png"]))
        if krows:
            buf = io.StringIO()
            csv.writer(buf).writerows([list(KERNEL_COLUMNS), *krows])
            (out / "kernels.csv").write_text(buf.getvalue())
            plots.append(out / "kernels.csv")
        (out / "diagnosis.md").write_text(diagnosis_md)
        client.log_artifact(parent_run_id, str(out / "diagnosis.md"))
        files = ["diagnosis.md"]
        for f in [out / "summary.csv", out / "summary.md", out / "summary.html", *plots]:
            client.log_artifact(parent_run_id, str(f), artifact_path="report")
            files.append(f"report/{f.name}")
    report = Report(parent_run_id, sweep, tuple(children), diagnosis.findings, diagnosis, diagnosis_md, tuple(files),
                    summary_md)
    if print_summary:
        print_report(report)
    return report


def print_report(report: Report) -> None:
    """The pivot (when there are finished engine runs) or the per-run table, then the diagnosis; whole and plain when
    not printed to a terminal (orchestrator/results/console.py)."""
    from rich.console import Console

    console = Console()
    finished = [c.row for c in report.children if c.status == "FINISHED" and c.job != "kernel"]
    if finished:
        header, body = pivot(finished)
        print_table(header, body, title=f"sweep {report.sweep} ({len(report.children)} runs): commit length / "
                                        "decode tok/s", console=console)
    cols = ("run", "status", *HEADLINE_METRICS)
    unfinished = [c for c in report.children if c.status != "FINISHED"]
    if unfinished or not finished:
        idx = [TABLE_COLUMNS.index(c) for c in cols]
        print_table(cols, [[r[i] for i in idx] for r in table_rows(unfinished or list(report.children))],
                    title=f"{len(unfinished)} run(s) not FINISHED" if finished
                    else f"sweep {report.sweep} ({len(report.children)} runs)", console=console)
    print_markdown(report.diagnosis_md, console=console)
