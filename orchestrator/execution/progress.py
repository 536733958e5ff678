"""Driver-side progress: a Rich live line (done / failed / total, servers up) and a final table.

    with SweepProgress(total=plan.num_runs, enabled=settings.progress) as progress:
        progress.server_up(); progress.server_down()
        progress.add(result)            # one RunResult as it arrives
    progress.summary(results)           # final Rich table (or log lines when disabled)

The final table's metric columns follow the job: engine runs show the probe's figures (`ENGINE_COLUMNS`), kernel
runs (`job: kernel`) the kernel's (`KERNEL_COLUMNS`: time_us, gbs, floor_frac, rel_err, as the report's kernel
table); a sweep holding both prints one table per job.

When disabled, or when stderr is not a terminal, each result is one `logging` line instead of the live bar.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.results.report import KERNEL_METRICS
from specsweep_vocab.spec import JobKind, RunResult, RunState

logger = logging.getLogger(__name__)

_STYLE = {RunState.FINISHED: "green", RunState.FAILED: "red", RunState.KILLED: "yellow"}
ENGINE_COLUMNS = ("prompt_tokens", "commit_len_mean", "decode_tok_s", "ttft_s", "verify_step_ms")
KERNEL_COLUMNS = KERNEL_METRICS  # time_us, gbs, floor_frac, rel_err


class SweepProgress:
    def __init__(self, total: int, enabled: bool = True, console: Console | None = None):
        self.total = total
        self.console = console or Console(stderr=True)
        if not self.console.is_terminal:
            self.console.width = max(self.console.width, 160)  # logs and CI: don't fold run names
        self.live_enabled = enabled and self.console.is_terminal
        self.enabled = enabled
        self.done = self.failed = self.killed = self.servers_up = 0
        self.t0 = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> "SweepProgress":
        if self.live_enabled:
            self._live = Live(self._line(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def server_up(self) -> None:
        self.servers_up += 1
        self._refresh()

    def server_down(self) -> None:
        self.servers_up = max(0, self.servers_up - 1)
        self._refresh()

    def add(self, result: RunResult) -> None:
        self.done += 1
        self.failed += result.state is RunState.FAILED
        self.killed += result.state is RunState.KILLED
        why = f" {result.reason.value}: {result.message}" if result.reason else ""
        logger.info("[%d/%d] %s %s%s", self.done, self.total, result.state.value, result.run.name, why)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._line())

    def _line(self) -> Text:
        line = Text()
        line.append(f"{self.done}/{self.total} runs", style="bold")
        line.append(f"  failed {self.failed}", style="red" if self.failed else "dim")
        if self.killed:
            line.append(f"  killed {self.killed}", style="yellow")
        line.append(f"  servers up {self.servers_up}  {time.monotonic() - self.t0:.0f} s", style="dim")
        return line

    def summary(self, results: Sequence[RunResult]) -> None:
        if not self.enabled:
            return
        ordered = sorted(results, key=lambda r: r.run.job_index)
        by_job = {job: [r for r in ordered if job_of(r) is job] for job in JobKind}
        title = f"{len(ordered)} runs in {time.monotonic() - self.t0:.1f} s"
        shown = [(job, runs) for job, runs in by_job.items() if runs] or [(JobKind.ENGINE, [])]
        for job, runs in shown:
            self.console.print(summary_table(runs, job, title if len(shown) == 1
                                             else f"{job.value} jobs: {len(runs)} of {title}"))


def job_of(result: RunResult) -> JobKind:
    """A kernel run's RunSpec carries its shape; its server is a kernel group."""
    run = result.run
    return JobKind.KERNEL if run.kernel is not None or run.server.job is JobKind.KERNEL else JobKind.ENGINE


def summary_table(results: Sequence[RunResult], job: JobKind, title: str) -> Table:
    """One Rich table: #, run, state, the job's metric columns, reason."""
    columns = KERNEL_COLUMNS if job is JobKind.KERNEL else ENGINE_COLUMNS
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("run")
    table.add_column("state")
    for col in columns:
        table.add_column(col, justify="right")
    table.add_column("reason")
    for r in results:
        table.add_row(str(r.run.job_index), r.run.name, Text(r.state.value, style=_STYLE[r.state]),
                      *(_fmt(r.metrics.get(c)) for c in columns), r.reason.value if r.reason else "")
    return table


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.3g}"
