"""Execution on Ray: one `ServerWorker` actor per ServerGroup; results stream back as they finish.

Public API:

    run_plan(plan: Plan, settings: ExecutionSettings, on_result: Callable[[RunResult], None] | None = None,
             *, track: bool = True, stats: ExecutionStats | None = None,
             multirun_yaml: str | None = None) -> list[RunResult]

Exactly one RunResult per RunSpec of `plan`, in job order. `on_result` is called on the driver for each
result as it arrives. With `track` (the default) the results are also recorded in MLflow
(`orchestrator.tracking.Tracker`): a parent run for this invocation and a child run per result, the parent
closed FINISHED (KILLED on interrupt). `stats`, when given, is filled in (engine starts, start-up seconds,
wall time, the parent run id) for benchmarks and the report.

Ray: an existing connection is used as is; otherwise `cluster.kind=local` starts an embedded
`ray.init()` (logical GPUs when the machine has none but a server asks for some), `cluster.kind=ray`
connects to `cluster.address`. Whatever this call started it shuts down, on every path.

One actor per group starts the engine, runs the group's RunSpecs in order (flushing the cache before
each) and stops the engine (`workers.server_worker.GroupRunner`). Every actor call is its own ObjectRef
and the driver `ray.wait`s on all of them, so one failed run or one dead actor never loses another's
result. A dead actor (node lost, worker killed) re-queues its group's unfinished runs on a fresh actor up
to `cluster.max_retries` times; after that they are FAILED `node_lost`.

Ctrl-C / SIGTERM on the driver: every actor is killed (its engine dies with it: parent-death signal),
unfinished runs become KILLED (`interrupted`) and are recorded, then KeyboardInterrupt propagates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from rich.markdown import Markdown

from orchestrator.progress import SweepProgress
from orchestrator.spec import (ClusterKind, ClusterSettings, EngineKind, ExecutionSettings, FailureReason, RunResult,
                               RunSpec, RunState, ServerGroup)
from workers.server_worker import EngineInfo, GroupRunner

logger = logging.getLogger(__name__)

CPUS_PER_SERVER = 1  # Ray CPUs an actor holds: on a local machine, at most num_cpus engines at once
LOCAL_OBJECT_STORE_MB = 128  # results are small; Ray's default (30% of RAM) only slows start-up
WAIT_TIMEOUT_S = 0.5


@dataclass
class ExecutionStats:
    wall_s: float = 0.0
    ray_init_s: float = 0.0
    ray_shutdown_s: float = 0.0
    tracking_setup_s: float = 0.0  # MLflow import, store/experiment set-up, parent run (overlaps Ray's start)
    ready_s: float = 0.0  # from the call to Ray up, MLflow ready and every actor submitted
    engine_starts: dict[str, int] = field(default_factory=dict)  # group_id -> engine start attempts
    engine_startup_s: dict[str, float] = field(default_factory=dict)  # group_id -> seconds starting engines
    tracking_s: float = 0.0  # driver seconds spent writing MLflow
    parent_run_id: str | None = None  # the MLflow parent run of this invocation (e.g. for the report)

    @property
    def total_engine_starts(self) -> int:
        return sum(self.engine_starts.values())


@ray.remote
class ServerWorker:
    """A thin actor around GroupRunner. Methods run on the actor's main thread, one at a time."""

    def __init__(self, group: ServerGroup, log_dir: str, restarts: int = 1):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.runner = GroupRunner(group.server, log_dir, restarts=restarts)

    def start(self) -> EngineInfo:
        return self.runner.start()

    def run(self, spec: RunSpec, attempt: int = 1) -> RunResult:
        return self.runner.run(spec, attempt)

    def stop(self) -> EngineInfo:
        return self.runner.stop()


# ---------------------------------------------------------------- Ray connection


def _visible_gpus() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def gpus_for(group: ServerGroup, cluster: ClusterSettings) -> int:
    if cluster.gpus_per_server:
        return cluster.gpus_per_server
    server = group.server
    on_gpu = server.engine.kind is EngineKind.SGLANG or server.engine.device == "cuda"
    return server.tp_size * server.nnodes if on_gpu else 0


def connect_ray(cluster: ClusterSettings, gpus_needed: int = 0) -> bool:
    """Connect or start Ray; True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    common = dict(namespace=cluster.namespace, log_to_driver=False, configure_logging=False)
    if cluster.kind is ClusterKind.RAY:
        ray.init(address=cluster.address or "auto", **common)
        return True
    if os.environ.get("RAY_ADDRESS"):
        # A sweep submitted as a Ray Job (orchestrator.schedule) runs inside that job's cluster.
        ray.init(**common)
        return True
    num_gpus = cluster.num_gpus if cluster.num_gpus is not None else max(_visible_gpus(), gpus_needed)
    mb = cluster.object_store_memory_mb or LOCAL_OBJECT_STORE_MB
    ray.init(num_cpus=cluster.num_cpus, num_gpus=num_gpus, object_store_memory=mb * 2**20,
             include_dashboard=cluster.include_dashboard, **common)
    return True


# ---------------------------------------------------------------- the driver loop


@dataclass
class _Slot:
    """One actor serving one group; a group gets a fresh slot (attempt + 1) after its actor died."""

    group: ServerGroup
    attempt: int
    actor: ray.actor.ActorHandle
    runs: dict[ray.ObjectRef, RunSpec]
    start_ref: ray.ObjectRef
    stop_ref: ray.ObjectRef
    up: bool = False
    closed: bool = False


class _Driver:
    def __init__(self, settings: ExecutionSettings, log_dir: Path, progress: SweepProgress,
                 emit: Callable[[RunResult], None], stats: ExecutionStats):
        self.settings = settings
        self.log_dir = log_dir
        self.progress = progress
        self.emit = emit
        self.stats = stats
        self.slots: list[_Slot] = []
        self.refs: dict[ray.ObjectRef, tuple[_Slot, str]] = {}  # ref -> (slot, "start" | "run" | "stop")

    def submit(self, group: ServerGroup, runs: tuple[RunSpec, ...], attempt: int = 1) -> None:
        gpus = gpus_for(group, self.settings.cluster)
        have = ray.cluster_resources().get("GPU", 0)
        if gpus > have:  # Ray would queue the actor forever
            now = time.time()
            for spec in runs:
                self.emit(RunResult(run=spec, state=RunState.FAILED, reason=FailureReason.ENGINE_START_FAILED,
                                    message=f"the server needs {gpus} GPU(s); the Ray cluster has {have:g}",
                                    started_at=now, ended_at=now, tags={"server_group": group.group_id}))
            return
        actor = ServerWorker.options(num_cpus=CPUS_PER_SERVER, num_gpus=gpus, max_restarts=0,
                                     name=None).remote(ServerGroup(group.server, runs), str(self.log_dir))
        start_ref = actor.start.remote()
        run_refs = {actor.run.remote(spec, attempt): spec for spec in runs}
        stop_ref = actor.stop.remote()
        slot = _Slot(group, attempt, actor, run_refs, start_ref, stop_ref)
        self.slots.append(slot)
        self.refs[start_ref] = (slot, "start")
        self.refs.update({ref: (slot, "run") for ref in run_refs})
        self.refs[stop_ref] = (slot, "stop")

    def loop(self) -> None:
        while self.refs:
            ready, rest = ray.wait(list(self.refs), num_returns=1, timeout=WAIT_TIMEOUT_S)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref in ready:
                if ref in self.refs:  # a lost slot drops its other refs
                    self.handle(ref)

    def handle(self, ref: ray.ObjectRef) -> None:
        slot, kind = self.refs.pop(ref)
        try:
            value = ray.get(ref, timeout=60)
        except RayActorError as e:
            self.lost(slot, e)
            return
        except (RayTaskError, GetTimeoutError) as e:  # a bug in the worker, not the engine
            if kind == "run":
                spec = slot.runs.pop(ref)
                self.emit(RunResult(run=spec, state=RunState.FAILED, reason=FailureReason.WORKER_ERROR,
                                    message=str(e)[-2000:], started_at=time.time(), ended_at=time.time(),
                                    tags={"attempt": str(slot.attempt), "server_group": slot.group.group_id}))
            else:
                logger.error("server %s: %s failed: %s", slot.group.group_id, kind, e)
                if kind == "stop":
                    self.close(slot)
            return
        if kind == "start":
            self.record(slot, value)
            if value.alive:
                slot.up = True
                self.progress.server_up()
        elif kind == "run":
            slot.runs.pop(ref)
            self.emit(value)
        else:
            self.record(slot, value)
            self.close(slot)

    def record(self, slot: _Slot, info: EngineInfo) -> None:
        gid = slot.group.group_id
        key = gid if slot.attempt == 1 else f"{gid}#{slot.attempt}"
        self.stats.engine_starts[key] = info.engine_starts
        self.stats.engine_startup_s[key] = info.startup_s

    def close(self, slot: _Slot) -> None:
        if slot.closed:
            return
        slot.closed = True
        if slot.up:
            slot.up = False
            self.progress.server_down()
        ray.kill(slot.actor, no_restart=True)  # frees its CPUs for a queued group

    def lost(self, slot: _Slot, error: Exception) -> None:
        for ref in [r for r, (s, _) in self.refs.items() if s is slot]:
            del self.refs[ref]
        unfinished = tuple(sorted(slot.runs.values(), key=lambda r: r.job_index))
        slot.runs.clear()
        self.close(slot)
        if not unfinished:
            return
        retries = self.settings.cluster.max_retries
        logger.warning("server %s: worker lost (%s); %d run(s) unfinished", slot.group.group_id,
                       type(error).__name__, len(unfinished))
        if slot.attempt <= retries:
            self.submit(slot.group, unfinished, slot.attempt + 1)
            return
        now = time.time()
        for spec in unfinished:
            self.emit(RunResult(run=spec, state=RunState.FAILED, reason=FailureReason.NODE_LOST,
                                message=f"worker lost {slot.attempt} time(s): {str(error)[-1000:]}",
                                started_at=now, ended_at=now,
                                tags={"attempt": str(slot.attempt), "server_group": slot.group.group_id}))

    def interrupt(self) -> None:
        """Kill every actor (engines die with them); every unfinished run becomes KILLED."""
        now = time.time()
        for slot in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)
            for spec in sorted(slot.runs.values(), key=lambda r: r.job_index):
                self.emit(RunResult(run=spec, state=RunState.KILLED, reason=FailureReason.INTERRUPTED,
                                    message="the sweep was interrupted", started_at=now, ended_at=now,
                                    tags={"attempt": str(slot.attempt), "server_group": slot.group.group_id}))
            slot.runs.clear()
        self.refs.clear()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_plan(plan, settings: ExecutionSettings, on_result: Callable[[RunResult], None] | None = None, *,
             track: bool = True, stats: ExecutionStats | None = None,
             multirun_yaml: str | None = None) -> list[RunResult]:
    """Run every RunSpec of `plan` (an orchestrator.plan.Plan); see the module docstring.

    `multirun_yaml`: the text of Hydra's `<sweep dir>/multirun.yaml`, stored on the parent run.
    """
    stats = stats if stats is not None else ExecutionStats()
    results: dict[int, RunResult] = {}
    if plan.num_runs == 0:
        return []
    t0 = time.perf_counter()
    # MLflow set-up (import, schema, parent run) overlaps Ray's start-up: both take seconds
    pool = ThreadPoolExecutor(1, thread_name_prefix="mlflow-setup")
    setup = pool.submit(_open_tracker, plan, settings, multirun_yaml, stats, t0) if track else None
    tracker = None
    backlog: list[RunResult] = []  # results that came before MLflow was ready
    log_dir = Path(settings.work_dir).resolve() / "logs" / "engines" / f"{plan.sweep_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    progress = SweepProgress(plan.num_runs, enabled=settings.progress)

    def emit(result: RunResult) -> None:
        if result.run.job_index in results:
            logger.error("duplicate result for job %d ignored", result.run.job_index)
            return
        results[result.run.job_index] = result
        progress.add(result)
        if tracker is not None:
            record(result)
        elif setup is not None:
            backlog.append(result)
        if on_result is not None:
            on_result(result)

    def record(result: RunResult) -> None:
        t = time.perf_counter()
        try:
            tracker.log_result(result)
        except Exception:  # MLflow trouble must not lose the other results; loud, not silent
            logger.exception("could not record run %d (%s) in MLflow", result.run.job_index, result.run.name)
        stats.tracking_s += time.perf_counter() - t

    def tracker_ready():
        nonlocal tracker
        tracker = setup.result()
        while backlog:
            record(backlog.pop(0))

    started_ray, driver, status = False, None, RunState.FINISHED
    try:
        with _sigterm_as_interrupt(), progress:
            try:
                t = time.perf_counter()
                gpus = max((gpus_for(g, settings.cluster) for g in plan.groups), default=0)
                started_ray = connect_ray(settings.cluster, gpus)
                stats.ray_init_s = time.perf_counter() - t
                logger.info("running %d run(s) on %d server(s); engine logs in %s", plan.num_runs,
                            len(plan.groups), log_dir)
                driver = _Driver(settings, log_dir, progress, emit, stats)
                for group in plan.groups:
                    driver.submit(group, group.runs)
                if setup is not None:
                    tracker_ready()
                stats.ready_s = time.perf_counter() - t0
                driver.loop()
            except BaseException as e:
                status = RunState.KILLED if isinstance(e, KeyboardInterrupt) else RunState.FAILED
                if driver is not None:
                    logger.warning("%s: stopping %d server(s)", "interrupted" if status is RunState.KILLED
                                   else f"execution failed ({type(e).__name__})", len(driver.slots))
                    driver.interrupt()
                raise
    finally:
        if started_ray:
            t = time.perf_counter()
            ray.shutdown()
            stats.ray_shutdown_s = time.perf_counter() - t
        stats.wall_s = time.perf_counter() - t0
        if tracker is None and setup is not None:
            with contextlib.suppress(Exception):  # set-up raised: that error is already propagating
                tracker_ready()
        pool.shutdown(wait=False)
        report = None
        if tracker is not None:
            try:
                tracker.log_parent_metrics(_parent_metrics(results.values(), stats))
                report = _write_report(tracker, plan, settings) if results else None
                tracker.end_parent(status)
            except Exception:  # never mask the sweep's own outcome
                logger.exception("could not close the parent run in MLflow")
        progress.summary(list(results.values()))
        if report is not None and settings.progress:
            progress.console.print(Markdown(report.diagnosis_md))
    return [results[r.job_index] for r in plan.runs if r.job_index in results]


def _open_tracker(plan, settings: ExecutionSettings, multirun_yaml: str | None, stats: ExecutionStats, t0: float):
    from orchestrator.tracking import Tracker

    tracker = Tracker.from_settings(settings)
    stats.parent_run_id = tracker.begin_parent(plan, work_dir=settings.work_dir, multirun_yaml=multirun_yaml)
    stats.tracking_setup_s = time.perf_counter() - t0
    return tracker


def _write_report(tracker, plan, settings: ExecutionSettings):
    """Table, plots and diagnosis.md on the parent run; a report failure never fails the sweep."""
    from orchestrator.report import write_report

    try:
        return write_report(tracker.client, tracker.parent_run_id, settings.report, sweep=plan.sweep_name,
                            print_summary=False)
    except Exception:
        logger.exception("could not write the sweep report to parent run %s", tracker.parent_run_id)
        return None


def _parent_metrics(results, stats: ExecutionStats) -> dict[str, float]:
    results = list(results)
    count = {s: sum(r.state is s for r in results) for s in RunState}
    return {"runs_finished": float(count[RunState.FINISHED]), "runs_failed": float(count[RunState.FAILED]),
            "runs_killed": float(count[RunState.KILLED]), "engine_starts": float(stats.total_engine_starts),
            "servers": float(len({r.run.server.key for r in results})), "wall_s": stats.wall_s}
