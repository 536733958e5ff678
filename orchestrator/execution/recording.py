"""Where `execute_plan`'s results go on the driver, and MLflow's part of a sweep, in one background thread.

    Recorder(plan, settings, stats, progress, on_result, *, track, tracker, multirun_yaml, ray_up)
        .emit(result)            a run's final result: kept by job index, counted on the progress line, given to
                                 `on_result`, recorded in MLflow (held back until MLflow is ready)
        .note_attempt(result)    a failed attempt whose run was re-queued: recorded, not a result of the sweep
        .start_tracking(shield)  the actors are submitted: let the MLflow set-up begin and wait for it
        .outcome()               a context manager: an exception ends the sweep KILLED (Ctrl-C) or FAILED
        .close() -> report       after Ray is down: the report, the parent's metrics, claims left without a result,
                                 the parent's status (even on a second Ctrl-C)

The background thread (one, in order): imports what Ray's first remote call needs (`WARM_IMPORTS`) while Ray
starts; the MLflow set-up (import, store, experiment, parent run: seconds), which waits until the preflight has
passed and the actors are submitted (a sweep that cannot fit leaves no trace; on 2 cores MLflow's 1.7 s import
would slow an embedded Ray's start, whose raylet registration sits right at Ray's 1 s polling step); and the
report, once every run has its result, while the engines stop and Ray shuts down. With a `tracker` given (the
launcher's, its parent begun and this plan's runs claimed) there is no set-up. With Ray already up MLflow's import
begins at once (it writes nothing).

    warm_mlflow(uri)    import what `Tracker(uri)` loads, writing nothing (the launcher's import thread)
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from orchestrator.config.settings import ExecutionSettings
from orchestrator.execution.signals import Shield, sigterm_as_interrupt
from orchestrator.execution.stats import ExecutionStats, parent_metrics
from orchestrator.results import fault_notes
from orchestrator.results.fault_notes import is_disk_full
from specsweep_common.spec import FailureReason, RunResult, RunState

if TYPE_CHECKING:
    from orchestrator.config.plan import Plan
    from orchestrator.execution.progress import SweepProgress
    from orchestrator.results.report.build import Report
    from orchestrator.results.tracking import Tracker

logger = logging.getLogger(__name__)

# What Ray's first remote call imports to build the driver's serialization context (its arrow and pydantic
# serializers): 0.2 s right after ray.init, on the sweep's critical path, when they are installed (MLflow brings
# pyarrow and numpy). Imported in the background thread while Ray starts instead; a missing one is skipped.
WARM_IMPORTS = ("pyarrow", "pyarrow.json", "pydantic", "starlette.datastructures")


MLFLOW_DB_LOGGER = "mlflow.store.db.utils"  # logs every SQLAlchemy error with its traceback before raising it


def _not_disk_full(record: logging.LogRecord) -> bool:
    """A logging filter: MLflow's own traceback of a full disk goes; the sweep reports it in one line (StoreFull)."""
    error = record.exc_info[1] if record.exc_info else None
    return not ((error is not None and is_disk_full(error)) or "database or disk is full" in record.getMessage())


class StoreFull(RuntimeError):
    """The tracking store's disk is full: the sweep stops (engines included) and its runs are closed `disk_full` as
    soon as the store takes a write again (`closed`: at once; else by the next driver, from the fault note)."""

    closed = False


class Recorder:
    def __init__(self, plan: Plan, settings: ExecutionSettings, stats: ExecutionStats, progress: SweepProgress,
                 on_result: Callable[[RunResult], None] | None, *, track: bool, tracker: Tracker | None,
                 multirun_yaml: str | None, ray_up: bool):
        self.plan, self.settings, self.stats, self.progress, self.on_result = plan, settings, stats, progress, on_result
        self.tracker = tracker
        self.results: dict[int, RunResult] = {}
        self.backlog: list[RunResult] = []  # results that came before MLflow was ready
        self.status = RunState.FINISHED
        self.store_full: StoreFull | None = None  # the store's disk filled up: nothing more is recorded
        mlflow_db = logging.getLogger(MLFLOW_DB_LOGGER)
        if _not_disk_full not in mlflow_db.filters:
            mlflow_db.addFilter(_not_disk_full)
        self.report_job: Future | None = None  # the report, written in `pool` once every run has its result
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sweep-bg")  # imports, MLflow set-up, report
        self.pool.submit(_warm_imports)  # while Ray starts
        self.gate = _Gate()
        self.setup: Future | None = None
        if tracker is not None:
            stats.parent_run_id = tracker.parent_run_id
        elif track:
            self.setup = self.pool.submit(open_tracker, plan, settings, multirun_yaml, stats, self.gate,
                                          settings.tracking_uri if ray_up else None)

    def in_job_order(self) -> list[RunResult]:
        return [self.results[r.job_index] for r in self.plan.runs if r.job_index in self.results]

    def emit(self, result: RunResult) -> None:
        if result.run.job_index in self.results:
            logger.error("duplicate result for job %d ignored", result.run.job_index)
            return
        self.results[result.run.job_index] = result
        self.progress.add(result)
        if self.tracker is not None:
            self._record(result)
            self._start_report()
        elif self.setup is not None:
            self.backlog.append(result)
        if self.on_result is not None:
            self.on_result(result)

    def note_attempt(self, result: RunResult) -> None:
        """A failed attempt whose run was re-queued: recorded in MLflow, not a result of the sweep."""
        self.stats.attempts_retried += 1
        if self.tracker is not None:
            self._record(result)
        elif self.setup is not None:
            self.backlog.append(result)

    def start_tracking(self, shield: Shield) -> None:
        """The preflight passed and every actor is submitted: the MLflow set-up may begin; wait for it (shielded)
        and record what arrived meanwhile."""
        self.gate.open(True)
        if self.setup is not None:
            with shield():
                self._tracker_ready()

    @contextlib.contextmanager
    def outcome(self) -> Iterator[None]:
        """An exception ends the sweep KILLED (Ctrl-C, SIGTERM) or FAILED; a set-up not yet begun never begins."""
        try:
            yield
        except BaseException as e:
            self.gate.open(False)
            self.status = RunState.KILLED if isinstance(e, KeyboardInterrupt) else RunState.FAILED  # StoreFull too
            raise

    def close(self) -> Report | None:
        """After the runs and Ray: the report (written now if not yet), then the MLflow runs closed, each attempted;
        a second Ctrl-C skips the report, never the closing."""
        report = None
        try:
            if self.tracker is None and self.setup is not None:
                with contextlib.suppress(Exception):  # set-up raised: that error is already propagating
                    self._tracker_ready()
            if self.tracker is not None:
                if self.status is not RunState.FINISHED:
                    logger.warning("writing the report of the runs that ended (Ctrl-C again skips it; the MLflow "
                                   "runs are closed either way)")
                if self.report_job is None and self.results and self.store_full is None:  # interrupted, failed
                    self.report_job = self.pool.submit(_timed_report, self.tracker, self.plan, self.settings,
                                                       self.stats)
                report = self.report_job.result() if self.report_job is not None else None
                self.stats.mark("report_done")
        except KeyboardInterrupt:  # a second Ctrl-C while stopping: the runs are still closed below
            self.status = RunState.KILLED
            logger.warning("interrupted again: closing the MLflow runs without the report")
            raise
        finally:
            with sigterm_as_interrupt() as shield, shield():  # a third Ctrl-C waits for the runs to be closed
                closed = close_tracking(self.tracker, self.status, self.results.values(), self.stats,
                                        store_full=self.store_full)
                if self.store_full is not None:
                    self.store_full.closed = closed
            self.pool.shutdown(wait=False)
        return report

    def _record(self, result: RunResult) -> None:
        assert self.tracker is not None
        if self.store_full is not None:
            return  # its claim is closed disk_full with the others (close_tracking)
        t = time.perf_counter()
        claim = self.tracker.claims.get(result.run.job_index)
        try:
            self.tracker.log_result(result)
        except Exception as e:  # MLflow trouble must not lose the other results; loud, not silent
            if claim is not None:  # closed at the end with the other claims, never left RUNNING
                self.tracker.claims.setdefault(result.run.job_index, claim)
            if is_disk_full(e):
                self.store_full = StoreFull(f"{self.tracker.redact(self.settings.tracking_uri)}: {_first_line(e)}")
                logger.error("the tracking store's disk is full (%s): stopping the sweep", self.store_full)
                raise self.store_full from None
            logger.exception("could not record run %d (%s) in MLflow", result.run.job_index, result.run.name)
        finally:
            self.stats.tracking_s += time.perf_counter() - t

    def _start_report(self) -> None:
        """Every run has its result and is recorded: nothing more can reach the child runs the report reads, so
        it is written now, in the background thread, while the engines stop and Ray shuts down."""
        if self.report_job is None and self.tracker is not None and self.store_full is None and \
                len(self.results) == self.plan.num_runs:
            self.stats.mark("runs_recorded")
            self.report_job = self.pool.submit(_timed_report, self.tracker, self.plan, self.settings, self.stats)

    def _tracker_ready(self) -> None:
        assert self.setup is not None
        self.tracker = self.setup.result()
        while self.backlog and self.tracker is not None:
            self._record(self.backlog.pop(0))
        self._start_report()


def _warm_imports() -> None:
    for name in WARM_IMPORTS:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class _Gate:
    """Opened once by the driver thread: True lets the MLflow set-up proceed, False cancels it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.ok = False

    def open(self, ok: bool) -> None:
        if not self._event.is_set():
            self.ok = ok
            self._event.set()

    def wait(self) -> bool:
        self._event.wait()
        return self.ok


def warm_mlflow(uri: str) -> None:
    """Import what `Tracker(uri)` loads (≈ 1.7 s: MLflow, pandas, SQLAlchemy, alembic), writing nothing."""
    with contextlib.suppress(ImportError):  # a broken install raises where MLflow is used, with its traceback
        importlib.import_module("mlflow")
        if uri.startswith("sqlite:"):
            importlib.import_module("mlflow.store.tracking.sqlalchemy_store")


def open_tracker(plan: Plan, settings: ExecutionSettings, multirun_yaml: str | None, stats: ExecutionStats,
                 gate: _Gate | None = None, early_import_uri: str | None = None) -> Tracker | None:
    """The MLflow set-up: store, experiment, parent run (None when the gate cancels it)."""
    from orchestrator.results.tracking import Tracker  # light: MLflow itself loads in from_settings (or warm_mlflow)

    if early_import_uri is not None:
        warm_mlflow(early_import_uri)
    if gate is not None and not gate.wait():
        return None
    tracker = Tracker.from_settings(settings, plan)
    stats.parent_run_id = tracker.begin_parent(plan, work_dir=settings.work_dir, multirun_yaml=multirun_yaml)
    stats.tracking_setup_s = stats.elapsed()
    return tracker


def close_tracking(tracker: Tracker | None, status: RunState, results: Iterable[RunResult],
                   stats: ExecutionStats, store_full: StoreFull | None = None) -> bool:
    """Parent metrics, claims left without a result, the parent's status: each attempted, none masks the sweep's
    own outcome. A full disk (now or earlier: `store_full`) closes them FAILED `disk_full` if the store takes a
    write now, else leaves the reason in this driver's fault note for the next driver. False: left RUNNING."""
    if tracker is None:
        return True
    if store_full is not None:
        return _close_disk_full(tracker, store_full)
    try:
        tracker.log_parent_metrics(parent_metrics(results, stats))
    except Exception as e:
        if is_disk_full(e):
            return _close_disk_full(tracker, StoreFull(_first_line(e)))
        logger.exception("could not log the parent run's metrics in MLflow")
    try:
        if status is RunState.FINISHED:
            tracker.release_claims(RunState.FAILED, FailureReason.WORKER_ERROR, "execution returned no result")
        else:
            tracker.release_claims(status, FailureReason.INTERRUPTED, "the sweep was interrupted")
        tracker.end_parent(status)
        fault_notes.discard(tracker.uri)
    except Exception as e:
        if is_disk_full(e):
            return _close_disk_full(tracker, StoreFull(_first_line(e)))
        logger.exception("could not close the parent run in MLflow")
    return True


def _close_disk_full(tracker: Tracker, full: StoreFull) -> bool:
    """The parent and every claim without a recorded result FAILED `disk_full`, once the store takes a write."""
    message = (f"the tracking store's disk filled up while the sweep recorded ({full}); the sweep stopped and "
               "this run's result was not recorded")
    try:
        # a write that fails while the disk is still full, before anything is closed
        tracker.tag_parent("failure_reason", FailureReason.DISK_FULL.value)
    except Exception as e:
        noted = fault_notes.record(tracker.uri, FailureReason.DISK_FULL.value, message)
        logger.error("the tracking store still cannot be written (%s): %d run(s) stay RUNNING until the next run of "
                     "this command closes them FAILED %s", _first_line(e), len(tracker.claims) + 1,
                     FailureReason.DISK_FULL.value if noted else "driver_lost (no fault note could be kept)")
        return False
    tracker.release_claims(RunState.FAILED, FailureReason.DISK_FULL, message)
    with contextlib.suppress(Exception):
        tracker.tag_parent("message", message)
        tracker.end_parent(RunState.FAILED)
    fault_notes.discard(tracker.uri)
    return True


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _timed_report(tracker: Tracker, plan: Plan, settings: ExecutionSettings, stats: ExecutionStats) -> Report | None:
    t = time.perf_counter()
    try:
        return _write_report(tracker, plan, settings)
    finally:
        stats.report_s = time.perf_counter() - t


def _write_report(tracker: Tracker, plan: Plan, settings: ExecutionSettings) -> Report | None:
    """Table, plots and diagnosis.md on the parent run; a report failure never fails the sweep."""
    from orchestrator.results.regress.alert import alert_on_regression
    from orchestrator.results.report.build import write_report

    try:
        if tracker.parent_run_id is None:
            raise RuntimeError("the tracker has no parent run")
        report = write_report(tracker.client, tracker.parent_run_id, settings.report, sweep=plan.sweep_name,
                              print_summary=False, run_hashes=plan.run_hashes)
        alert_on_regression(tracker.client, tracker.parent_run_id)  # marker line; the schedule's on_regression
        return report
    except Exception:
        logger.exception("could not write the sweep report to parent run %s", tracker.parent_run_id)
        return None
