"""Driver-side progress: one Rich live display that owns the terminal (log lines scroll above it), and a final table.

    with live_status():                 # from the start of a sweep (the launcher): the phase and a ticking clock
        set_phase("validating 12 job(s)"); set_phase("starting Ray"); ...
        with SweepProgress(total=plan.num_runs, enabled=settings.progress) as progress:   # joins that display
        progress.server_up(); progress.server_down()
        progress.add(result)            # one RunResult as it arrives
    progress.summary(results)           # final Rich table (or log lines when disabled)

The final table's metric columns follow the job: engine runs show the probe's figures (`ENGINE_COLUMNS`), kernel
runs (`job: kernel`) the kernel's (`KERNEL_COLUMNS`: time_us, gbs, floor_frac, rel_err, as the report's kernel
table); a sweep holding both prints one table per job.

The display is two lines: the phase (validating, starting Ray, opening the MLflow store, starting N server(s):
loading the model, probing k/N) with the elapsed time, re-drawn 4 times a second so the clock never freezes; and,
once runs are submitted, done / failed / total and servers up. While it is shown, the root logger's handlers write
through its console, so a log line is printed above it, never glued to it. Each phase is also a log line.

When disabled, or when stderr is not a terminal, each phase and result is one `logging` line instead.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.results.metric_catalogue import KERNEL_METRICS, PROGRESS_METRICS
from specsweep_common.spec import JobKind, RunResult, RunState

logger = logging.getLogger(__name__)

_STYLE = {RunState.FINISHED: "green", RunState.FAILED: "red", RunState.KILLED: "yellow"}
ENGINE_COLUMNS = PROGRESS_METRICS  # prompt_tokens, commit_len_mean, ttft_s, decode_tok_s, verify_step_ms
KERNEL_COLUMNS = KERNEL_METRICS  # time_us, gbs, floor_frac, rel_err


class LiveStatus:
    """The one live display: the current phase and the elapsed time, plus the attached SweepProgress's line."""

    def __init__(self, console: Console):
        self.console = console
        self.t0 = time.monotonic()
        self.phase = "starting"
        self.progress: SweepProgress | None = None
        self._live: Live | None = None
        self._handlers: list[tuple[logging.Handler, object]] = []

    def __rich__(self) -> Text:  # rendered at every refresh: the clock ticks between events
        line = Text()
        phase = self.progress.phase() if self.progress is not None else self.phase
        line.append(f"{phase}", style="bold cyan")
        line.append(f"  {time.monotonic() - self.t0:.0f} s", style="dim")
        if self.progress is not None:
            line.append("\n")
            line.append_text(self.progress._line())
        return line

    def start(self) -> None:
        self._live = Live(self, console=self.console, refresh_per_second=4, transient=True)
        self._live.start()
        for h in logging.getLogger().handlers:  # log lines through the live console: printed above the display
            if hasattr(h, "console"):
                self._handlers.append((h, h.console))
                h.console = self.console  # type: ignore[attr-defined]
            elif isinstance(h, logging.StreamHandler):
                self._handlers.append((h, h.stream))
                h.setStream(self.console.file)

    def stop(self) -> None:
        for h, old in self._handlers:
            if isinstance(old, Console):
                h.console = old  # type: ignore[attr-defined]
            elif isinstance(h, logging.StreamHandler):
                h.setStream(old)  # type: ignore[arg-type]
        self._handlers.clear()
        live, self._live = self._live, None
        if live is not None:
            live.stop()


_CURRENT: LiveStatus | None = None


@contextlib.contextmanager
def live_status(enabled: bool = True, console: Console | None = None) -> Iterator[LiveStatus | None]:
    """Start the live display (when `enabled` and stderr is a terminal) for the block; nested calls reuse it."""
    global _CURRENT
    console = console or Console(stderr=True)
    if _CURRENT is not None or not (enabled and console.is_terminal):
        yield _CURRENT
        return
    status = _CURRENT = LiveStatus(console)
    status.start()
    try:
        yield status
    finally:
        status.stop()
        _CURRENT = None


def set_phase(text: str) -> None:
    """The current phase: on the live display, and one log line."""
    logger.info("%s", text)
    if _CURRENT is not None:
        _CURRENT.phase = text


class SweepProgress:
    def __init__(self, total: int, enabled: bool = True, console: Console | None = None, servers: int = 1):
        self.total = total
        self.servers = servers
        self.console = console or Console(stderr=True)
        if not self.console.is_terminal:
            self.console.width = max(self.console.width, 160)  # logs and CI: don't fold run names
        self.live_enabled = enabled and self.console.is_terminal
        self.enabled = enabled
        self.done = self.failed = self.killed = self.servers_up = 0
        self.t0 = time.monotonic()
        self._own: contextlib.AbstractContextManager | None = None
        self._status: LiveStatus | None = None

    def __enter__(self) -> "SweepProgress":
        if self.live_enabled:
            self._own = live_status(True, self.console)
            status = self._own.__enter__()
            if status is not None:
                self.console = status.console
                status.progress = self
                self._status = status
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.progress = None
            self._status.phase = "writing the report"
            self._status = None
        if self._own is not None:
            self._own.__exit__(*exc)
            self._own = None

    def phase(self) -> str:
        if self.done == 0 and self.servers_up == 0:
            return f"starting {self.servers} server(s): loading the model"
        return f"probing {self.done}/{self.total}"

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
        pass  # the live display re-draws itself 4 times a second

    def _line(self) -> Text:
        line = Text()
        line.append(f"{self.done}/{self.total} runs", style="bold")
        line.append(f"  failed {self.failed}", style="red" if self.failed else "dim")
        if self.killed:
            line.append(f"  killed {self.killed}", style="yellow")
        line.append(f"  servers up {self.servers_up}", style="dim")
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
