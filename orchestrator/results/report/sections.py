"""The report's Markdown sections (`report/summary.md` on the parent run, its HTML, and the printed summary), in
order. A section is a function of the `ReportContext` that returns Markdown (starting with a `## ` heading) or
None to leave itself out; adding one is one entry in `SECTIONS`:

    def changes_section(ctx: ReportContext) -> str | None: ...
    SECTIONS = (pivot_section, changes_section, runs_section)

`write_report(..., sections=...)` takes another sequence for one report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.results.diagnosis import Diagnosis, RunRow
from orchestrator.results.report.read_back import ChildRun
from orchestrator.results.report.tables import render_md_table, render_pivot_md, table_rows


@dataclass(frozen=True)
class ReportContext:
    client: Any  # MlflowClient of the store
    parent_run_id: str
    sweep: str
    children: tuple[ChildRun, ...]  # engine runs of every point (earlier invocations' included)
    finished: tuple[RunRow, ...]  # of them, FINISHED
    diagnosis: Diagnosis


Section = Callable[[ReportContext], "str | None"]


def pivot_section(ctx: ReportContext) -> str | None:
    """drafter x probe x context; cells: commit length / decode tok/s."""
    return render_pivot_md(ctx.finished) or None


def runs_section(ctx: ReportContext) -> str | None:
    return "## Every run\n\n" + render_md_table(table_rows(ctx.children))


SECTIONS: tuple[Section, ...] = (pivot_section, runs_section)


def render_sections(ctx: ReportContext, sections: Sequence[Section] = SECTIONS) -> str:
    parts = [text for section in sections if (text := section(ctx))]
    return f"# Report: {ctx.sweep}\n\n" + "\n".join(p.rstrip("\n") + "\n" for p in parts)
