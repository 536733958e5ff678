"""The final table: engine runs show the probe's columns, kernel runs (`job: kernel`) the kernel's."""

from __future__ import annotations

from rich.console import Console

from orchestrator.config.jobs import expand_grid, plan_jobs
from orchestrator.execution.progress import ENGINE_COLUMNS, KERNEL_COLUMNS, SweepProgress
from specsweep_common.spec import FailureReason, RunResult, RunState
from tools.testing import tiny_run, tiny_server


def _kernel_runs(tmp_path):
    jobs = expand_grid({"kernel.prefix": [33, 300]}, "job=kernel", "sweep_name=verify_kernel", "engine.device=cpu",
                       "kernel.layout=gqa-small", "kernel.dtype=float32", "kernel.tokens=8")
    plan, _ = plan_jobs(jobs, cwd=str(tmp_path))
    return plan.runs


def _table(results) -> str:
    console = Console(record=True, width=400, force_terminal=False)
    progress = SweepProgress(len(results), console=console)
    progress.summary(results)
    return console.export_text()


def _header(text: str) -> str:
    return next(line for line in text.splitlines() if "run" in line and "state" in line)


def test_kernel_sweep_table_shows_kernel_columns(tmp_path):
    small, large = _kernel_runs(tmp_path)
    results = [
        RunResult(run=small, state=RunState.FINISHED,
                  metrics={"time_us": 75.25, "gbs": 1234.5, "floor_frac": 0.47, "rel_err": 3.1e-7, "kv_bytes": 4096}),
        RunResult(run=large, state=RunState.FAILED, reason=FailureReason.TIMEOUT, metrics={}),
    ]
    text = _table(results)
    header = _header(text)
    assert all(col in header for col in KERNEL_COLUMNS)
    assert not any(col in header for col in ENGINE_COLUMNS)  # no commit_len_mean / decode_tok_s for a kernel
    row = next(line for line in text.splitlines() if small.name in line)
    assert "FINISHED" in row and "75.2" in row and "1234" in row and "0.47" in row and "3.1e-07" in row
    row = next(line for line in text.splitlines() if large.name in line)
    assert "FAILED" in row and "timeout" in row and row.count(" - ") >= len(KERNEL_COLUMNS) - 1
    assert text.lstrip().startswith("2 runs in")


def test_engine_sweep_table_is_unchanged():
    run = tiny_run(tiny_server(), 0)
    text = _table([RunResult(run=run, state=RunState.FINISHED,
                             metrics={"prompt_tokens": 64, "commit_len_mean": 5.0, "decode_tok_s": 301.7})])
    header = _header(text)
    assert all(col in header for col in ENGINE_COLUMNS) and "time_us" not in header
    assert "301.7" not in text and "302" in text  # >= 100: no decimals


def test_mixed_sweep_prints_one_table_per_job(tmp_path):
    kernel = _kernel_runs(tmp_path)[0]
    engine = tiny_run(tiny_server(), 5)
    text = _table([RunResult(run=kernel, state=RunState.FINISHED, metrics={"time_us": 10.0}),
                   RunResult(run=engine, state=RunState.FINISHED, metrics={"commit_len_mean": 5.0})])
    assert "engine jobs: 1 of 2 runs in" in text and "kernel jobs: 1 of 2 runs in" in text
    engine_part, kernel_part = text.split("kernel jobs: 1 of")
    assert "commit_len_mean" in engine_part and "time_us" not in engine_part
    assert "time_us" in kernel_part and "commit_len_mean" not in kernel_part


def test_one_live_display_shows_phases_a_ticking_clock_and_log_lines_above_it():
    """Rich's console output captured: the phase line from the start, the elapsed time moving without any event,
    root log lines written through the live console (above the display, each on its own line), then the runs."""
    import io
    import logging

    from rich.logging import RichHandler

    from orchestrator.execution.progress import live_status, set_phase

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160)
    own = Console(file=io.StringIO())
    handler = RichHandler(console=own, show_path=False)
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        with live_status(console=console) as status:
            assert status is not None and handler.console is console  # log lines go through the live console
            set_phase("starting Ray")
            status.t0 -= 7  # seven seconds later, with no event in between
            assert str(status.__rich__()).startswith("starting Ray  7 s")
            logging.getLogger("specsweep.test").info("a log line")
            run = tiny_run(tiny_server(), 0)
            with SweepProgress(3, console=console, servers=2) as progress:
                assert str(status.__rich__()).startswith("starting 2 server(s): loading the model")
                progress.server_up()
                progress.add(RunResult(run=run, state=RunState.FINISHED, metrics={"commit_len_mean": 3.0}))
                text = str(status.__rich__())
                assert text.startswith("probing 1/3") and "1/3 runs  failed 0  servers up 1" in text
            assert status.progress is None
        assert handler.console is own  # given back
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    out = buf.getvalue()
    assert any(line.rstrip().endswith("a log line") for line in out.splitlines())
    assert "starting Ray" in out  # the phase as a log line too
