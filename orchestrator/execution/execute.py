"""Execution on Ray: one server (a placement group and its actors) per ServerGroup; results stream back as they
finish.

    execute_plan(plan: Plan, settings: ExecutionSettings, on_result: Callable[[RunResult], None] | None = None,
                 *, track: bool = True, stats: ExecutionStats | None = None, multirun_yaml: str | None = None,
                 tracker: Tracker | None = None, connection: RayConnection | None = None) -> list[RunResult]

Exactly one RunResult per RunSpec of `plan`, in job order. `on_result` is called on the driver for each result as
it arrives. With `track` (the default) the results are also recorded in MLflow (`orchestrator.results.tracking`'s
`Tracker`): a parent run for this invocation and a child run per result, the parent closed FINISHED (KILLED on
interrupt). `stats`, when given, is filled in (engine starts, start-up seconds, wall time, the phase marks, the
parent run id) for benchmarks and the report.

The parts, one module each in this package (orchestrator/execution/):

    ray_connection.py connect Ray (or reuse it) and the Ray preflight, once; shut down what was started
    actors.py        `ServerWorker` (rank 0) and `NodeWorker` (rank > 0), thin Ray actors around `workers.runners`'s
                     runners
    driver.py        the slots, the queue (longest first, `cluster.max_concurrent_servers` at once), the `ray.wait`
                     loop, node loss and re-queueing, killing everything on an interrupt
    recording.py     results to the progress line, `on_result` and MLflow; the background thread (imports, MLflow
                     set-up, report); the closing of the MLflow runs
    signals.py       Ctrl-C and SIGTERM as KeyboardInterrupt, held back while a result is recorded
    stats.py         ExecutionStats, SlotRecord, the parent run's metrics

`connection`: a `ray_connection` the caller opened (the sweep, `orchestrator.session.sweep`: it connected Ray and
ran the preflight before its resume lookup); without one, `execute_plan` opens its own and closes it before the
report is awaited.

Preflight (`orchestrator.execution.preflight`): once Ray is up and before MLflow or any engine, every group must be
placeable on the empty cluster (GPUs per node, node count, accelerator label); else `PreflightError` names each
group that never fits and what the cluster has, and nothing is recorded.

Ctrl-C / SIGTERM on the driver: every actor is killed (its engine dies with it: parent-death signal), unfinished
and queued runs become KILLED (`interrupted`) and are recorded, then KeyboardInterrupt propagates (for SIGTERM its
subclass `orchestrator.execution.signals.Terminated`, on which `python -m orchestrator` exits 143); the same command
again resumes (FINISHED runs are skipped). A second Ctrl-C while stopping skips the report but never the closing of the
parent run and of claims without a result.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterable

import ray

from orchestrator.execution.driver import Driver
from orchestrator.execution.ray_connection import RayConnection, ray_connection
from orchestrator.execution.recording import Recorder
from orchestrator.config.settings import ExecutionSettings
from orchestrator.execution.signals import driver_signals
from orchestrator.execution.stats import ExecutionStats
from specsweep_common.spec import RunResult

if TYPE_CHECKING:
    from orchestrator.config.plan import Plan
    from orchestrator.execution.progress import SweepProgress
    from orchestrator.results.report.build import Report
    from orchestrator.results.tracking import Tracker

logger = logging.getLogger(__name__)


def execute_plan(plan: Plan, settings: ExecutionSettings, on_result: Callable[[RunResult], None] | None = None, *,
                 track: bool = True, stats: ExecutionStats | None = None, multirun_yaml: str | None = None,
                 tracker: Tracker | None = None, connection: RayConnection | None = None) -> list[RunResult]:
    """Run every RunSpec of `plan`; see the module docstring.

    `multirun_yaml`: the text of Hydra's `<sweep dir>/multirun.yaml`, stored on the parent run.
    `tracker`: an `orchestrator.results.tracking.Tracker` whose parent run is already begun (the session's, holding
    this plan's claims); results are recorded there and no set-up thread runs. Claims still without a result at the end
    are closed (KILLED when interrupted, else FAILED), and the parent is closed even on a second Ctrl-C.

    Timeline (what overlaps what): Ray starts (or is reused) → preflight → every actor is submitted → MLflow is
    set up in a thread (import, store, experiment, parent run) while the actors' workers start their engines;
    results arrive and are recorded as they finish → once every run has its result, the report is written in
    that thread while the engines stop and Ray shuts down → the parent run is closed.
    """
    from orchestrator.execution.progress import SweepProgress

    if plan.num_runs == 0:
        return []
    if track:
        from orchestrator.results.tracking import experiment_for

        experiment_for(settings, plan)  # ValueError (stub mixed with a real engine) before anything starts
    stats = stats if stats is not None else ExecutionStats()
    stats.begin()
    progress = SweepProgress(plan.num_runs, enabled=settings.progress, servers=len(plan.groups))
    recorder = Recorder(plan, settings, stats, progress, on_result, track=track, tracker=tracker,
                        multirun_yaml=multirun_yaml, ray_up=ray.is_initialized())
    try:
        with driver_signals() as shield, progress, recorder.outcome():
            with _ray(plan, settings, stats, connection) as ray_up:
                log_dir = _engine_log_dir(plan, settings)  # after the preflight: a refused plan leaves no folder
                logger.info("running %d run(s) on %d server(s); engine logs in %s", plan.num_runs,
                            len(plan.groups), log_dir)
                driver = Driver(settings, log_dir, progress, recorder.emit, recorder.note_attempt, stats,
                                ray_up.preflight, shield)
                with driver.stop_all_on_error():
                    driver.submit(plan.groups)
                    stats.mark("submitted")
                    recorder.start_tracking(shield)
                    stats.ready_s = stats.elapsed()
                    stats.mark("tracker_ready")
                    driver.loop()
                    stats.mark("loop_done")
    finally:
        stats.wall_s = stats.elapsed()
        report = recorder.close()
        stats.mark("end")
        _show_summary(progress, recorder.results.values(), report, settings)
    return recorder.in_job_order()


def _ray(plan: Plan, settings: ExecutionSettings, stats: ExecutionStats,
         connection: RayConnection | None) -> ContextManager[RayConnection]:
    """The caller's Ray connection, or one of this call's own (connect, preflight; Ray shut down at its end)."""
    if connection is None:
        return ray_connection(settings.cluster, plan.groups, stats)
    stats.mark("ray_up")
    return contextlib.nullcontext(connection)


def _engine_log_dir(plan: Plan, settings: ExecutionSettings) -> Path:
    folder = (Path(settings.work_dir).resolve() / "logs" / "engines"
              / f"{plan.sweep_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _show_summary(progress: SweepProgress, results: Iterable[RunResult], report: Report | None,
                  settings: ExecutionSettings) -> None:
    progress.summary(list(results))
    if report is not None and settings.progress:
        from rich.markdown import Markdown

        at_a_glance = report.summary_md.split("## Every run")[0]  # the pivot (report/sections.py), then the diagnosis
        progress.console.print(Markdown(at_a_glance + "\n" + report.diagnosis_md))
