"""One planned sweep, run: the checks before anything starts, then Ray, the claims on the MLflow store and the
execution.

    preflight_before_start(plan, settings, *, dry_run)   before Ray or MLflow: what the config alone rules out,
                                                         this machine's GPUs (cluster=local), the tracking store
    sweep_plan(plan, settings) -> SweepResult              Ray and its preflight; under the store's lock: lost drivers
                                                         closed, resume, claims; then `execute_plan`

Exit codes: `ClusterCannotFit` and `TrackingUnreachable` are Hydra's compact errors (one line, exit 1, nothing
started or recorded).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

from hydra.errors import CompactHydraException

from orchestrator.config.plan import Plan, plan_resume
from orchestrator.config.settings import ClusterKind, ExecutionSettings
from specsweep_common.spec import FailureReason, RunResult, RunSpec, RunState

if TYPE_CHECKING:
    from orchestrator.results.tracking import Tracker

log = logging.getLogger(__name__)


class ClusterCannotFit(CompactHydraException):
    """The preflight found servers the Ray cluster can never place: exit 1, nothing launched or recorded."""


class RayDidNotStart(CompactHydraException):
    """Ray could not start or be reached (orchestrator.execution.ray_connection.RayStartFailed): exit 1, one line."""


class TrackingUnreachable(CompactHydraException):
    """tracking.uri does not answer: exit 1 before Ray, MLflow or any engine starts."""


class StoreDiskFull(CompactHydraException):
    """The tracking store's disk filled up while the sweep recorded (orchestrator.execution.recording.StoreFull):
    the sweep stopped, exit 1, one line saying where its runs stand."""


class ResourceUnusable(CompactHydraException):
    """The working directory or cluster.address cannot serve the sweep: exit 1 before Ray starts."""


def _on_this_machine(settings: ExecutionSettings) -> bool:
    """cluster=local starts its own Ray here, unless the driver is a Ray Job (RAY_ADDRESS) or Ray is already up."""
    ray = sys.modules.get("ray")
    return (settings.cluster.kind is ClusterKind.LOCAL and os.environ.get("RAY_ADDRESS", "local") == "local"
            and not (ray is not None and ray.is_initialized()))


def preflight_before_start(plan: Plan, settings: ExecutionSettings, *, dry_run: bool) -> None:
    """Before Ray or MLflow start: what the config alone rules out (cluster.gpus_per_node), with cluster=local
    the GPUs really on this machine, and (not in a dry run) whether tracking.uri answers within 10 s."""
    from orchestrator.execution.preflight import PreflightError, check_declared, check_local_placement
    from orchestrator.results.store_probe import probe_tracking
    from orchestrator.execution.resources import ray_address_problem, work_dir_problem
    from specsweep_common.redact import redact_text

    try:
        if problems := check_declared(plan.groups, settings.cluster):
            raise PreflightError(problems, f"cluster.gpus_per_node={settings.cluster.gpus_per_node} (declared)")
        if _on_this_machine(settings):
            check_local_placement(plan.groups, settings.cluster)
    except PreflightError as e:
        raise ClusterCannotFit(str(e)) from None
    if dry_run:
        return
    if why := work_dir_problem(settings.work_dir, plan.num_runs):
        raise ResourceUnusable(f"{why}; nothing was started")
    if settings.cluster.kind is ClusterKind.RAY and (why := ray_address_problem(settings.cluster.address)):
        raise ResourceUnusable(f"{why}; nothing was started")
    if why := probe_tracking(settings.tracking_uri):
        raise TrackingUnreachable(f"tracking.uri={redact_text(settings.tracking_uri)!r} cannot be reached: "
                                  f"{redact_text(why)}; "
                                  "nothing was started")


@dataclass
class SweepResult:
    """What `sweep_plan` did: the results, how many FINISHED runs resume skipped, the plan that ran, and the
    runs left to another live driver that held them (job index -> which driver)."""

    results: list[RunResult]
    skipped: int
    ran: Plan
    held: dict[int, str] = field(default_factory=dict)

    def __iter__(self):  # results, skipped, ran = sweep_plan(...)
        return iter((self.results, self.skipped, self.ran))


def sweep_plan(plan: Plan, settings: ExecutionSettings, *, parent_tags: dict[str, str] | None = None) -> SweepResult:
    """Ray and the cluster preflight (ClusterCannotFit before MLflow is touched), then, under the store's lock
    (orchestrator.results.store_lock): close RUNNING runs of drivers that are gone (`driver_lost`), skip run_hashes
    FINISHED (with `resume`) or claimed by another live driver, begin the parent and claim the rest; then the runs,
    on the same Ray connection (`execute_plan` neither connects nor runs the preflight again).

    MLflow's import (≈ 1.7 s) runs in a thread while Ray starts; it writes nothing (the store is only opened
    after the preflight). `parent_tags`: extra tags of the parent run (a tune nests each round's parent under its
    own run with `mlflow.parentRunId`)."""
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.progress import set_phase
    from orchestrator.execution.preflight import PreflightError
    from orchestrator.execution.ray_connection import RayStartFailed, ray_connection
    from orchestrator.execution.recording import StoreFull, warm_mlflow

    threading.Thread(target=warm_mlflow, args=(settings.tracking_uri,), name="mlflow-import", daemon=True).start()
    set_phase("starting Ray")
    try:
        with ray_connection(settings.cluster, plan.groups) as connection:
            from orchestrator.results.tracking import Tracker, experiment_for

            set_phase("opening the MLflow store (resume, claims)")
            experiment = experiment_for(settings, plan)
            tracker = Tracker.from_settings(settings, plan)
            todo, skipped, held = _claim(plan, settings, tracker, experiment, parent_tags)
            if not todo.groups:
                log.info("nothing to run")
                return SweepResult([], skipped, todo, held)
            try:
                results = execute_plan(todo, settings, tracker=tracker, connection=connection)
            except StoreFull as e:  # execute_plan closed its runs disk_full, or left the reason to the next driver
                raise StoreDiskFull(_disk_full_line(e, experiment)) from None
            except BaseException as e:  # execute_plan closes what it was given; this covers a failure before it began
                _abandon(tracker, e)
                raise
            log.info("results: MLflow experiment %r in %s; browse with `mlflow ui --backend-store-uri %s` "
                     "(or `make ui`), report with `python -m orchestrator.report %s`", experiment,
                     tracker.redact(settings.tracking_uri), tracker.redact(settings.tracking_uri), experiment)
            log_held(plan.runs, held)
            return SweepResult(results, skipped, todo, held)
    except PreflightError as e:
        raise ClusterCannotFit(str(e)) from None
    except RayStartFailed as e:
        raise RayDidNotStart(str(e)) from None


def _claim(plan: Plan, settings: ExecutionSettings, tracker: Tracker, experiment: str,
           parent_tags: dict[str, str] | None = None) -> tuple[Plan, int, dict[int, str]]:
    """Under the store's lock: close lost drivers' runs, leave out FINISHED (with `resume`) and held points, begin
    the parent and claim the rest. Returns the plan to run, how many FINISHED runs it skips, and the runs another
    live driver holds (job index -> which driver)."""
    from orchestrator.results import fault_notes

    with tracker.store_lock():
        tracker.reap_lost_drivers()
        todo, skipped = plan_resume(plan, tracker.finished_run_hashes()) if settings.resume else (plan, 0)
        if skipped:
            log.info("resume: skipping %d run(s) already FINISHED in experiment %r (resume=false re-runs them)",
                     skipped, experiment)
        claims = tracker.live_claims()
        todo = replace(plan_resume(todo, claims)[0], resumed=todo.resumed)  # held: not FINISHED yet
        ran = {r.job_index for r in todo.runs}
        held = {r.job_index: claims[r.run_hash] for r in plan.runs if r.job_index not in ran and r.run_hash in claims}
        log_held(plan.runs, held)
        try:
            if todo.groups:
                fault_notes.prepare(settings.tracking_uri)  # room for why its runs may stay RUNNING (a full disk)
                tracker.begin_parent(todo, work_dir=settings.work_dir, tags=parent_tags)
                tracker.claim(todo.runs)
        except BaseException as e:  # e.g. Ctrl-C while claiming: nothing of this driver stays RUNNING
            _abandon(tracker, e)
            raise
    return todo, skipped, held


def _disk_full_line(e: BaseException, experiment: str) -> str:
    where = (f"its runs are closed FAILED {FailureReason.DISK_FULL.value}" if getattr(e, "closed", False) else
             f"the store could not be written again before this driver ended: its runs stay RUNNING until the next "
             f"run of this command, which closes them FAILED {FailureReason.DISK_FULL.value}")
    return (f"the tracking store's disk is full ({e}): the sweep stopped, its engines too; {where}; free space, then "
            f"run the same command again to resume (experiment {experiment!r})")


def _abandon(tracker: Tracker, error: BaseException) -> None:
    state = RunState.KILLED if isinstance(error, KeyboardInterrupt) else RunState.FAILED
    with contextlib.suppress(Exception):
        tracker.release_claims(state, FailureReason.INTERRUPTED if state is RunState.KILLED
                               else FailureReason.WORKER_ERROR, f"the driver stopped: {type(error).__name__}")
        tracker.end_parent(state)


def log_held(runs: Sequence[RunSpec], held: dict[int, str]) -> None:
    """The runs this driver left to other drivers: one line, then each run and who holds it."""
    if not held:
        return
    log.info("skipped %d run(s) another driver is running (it records them): %s", len(held),
             "; ".join(f"#{r.job_index} {r.name} [{held[r.job_index]}]" for r in runs if r.job_index in held))
