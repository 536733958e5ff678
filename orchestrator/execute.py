"""Execution on Ray: one `ServerWorker` actor per ServerGroup; results stream back as they finish.

Public API:

    run_plan(plan: Plan, settings: ExecutionSettings, on_result: Callable[[RunResult], None] | None = None,
             *, track: bool = True, stats: ExecutionStats | None = None,
             multirun_yaml: str | None = None, tracker: Tracker | None = None) -> list[RunResult]

Exactly one RunResult per RunSpec of `plan`, in job order. `on_result` is called on the driver for each
result as it arrives. With `track` (the default) the results are also recorded in MLflow
(`orchestrator.tracking.Tracker`): a parent run for this invocation and a child run per result, the parent
closed FINISHED (KILLED on interrupt). `stats`, when given, is filled in (engine starts, start-up seconds,
wall time, the parent run id) for benchmarks and the report.

Ray: an existing connection is used as is; otherwise `cluster.kind=local` starts an embedded Ray of its own,
listening on 127.0.0.1 only (`orchestrator.local_ray`; logical GPUs when the machine has none but a server asks
for some), `cluster.kind=ray`
connects to `cluster.address`. Whatever this call started it shuts down, on every path (`shutdown_ray`).

Overlap (see `run_plan`): a background thread imports what Ray's first remote call needs while Ray starts, sets up
MLflow once the actors are submitted, and writes the report once every run has its result, while the engines stop
and Ray shuts down. `ExecutionStats.marks` times the phases (`orchestrator.bench --breakdown`).

Preflight (`orchestrator.preflight`): once Ray is up and before MLflow or any engine, every group must be
placeable on the empty cluster (GPUs per node, node count, accelerator label); else `PreflightError` names
each group that never fits and what the cluster has, and nothing is recorded.

Placement: one placement group per server, one bundle per node {GPU: tp_size / nnodes, CPU: k}
(STRICT_PACK on one node, STRICT_SPREAD over several), the accelerator as a bundle label selector (or a
custom resource on older clusters). Groups are launched longest expected work first, at most
`cluster.max_concurrent_servers` at once; placement groups the cluster cannot fit yet stay pending in Ray.
Rank 0 (`ServerWorker`, bundle 0) starts the engine, runs the group's RunSpecs in order (flushing the
cache before each) and stops it (`workers.runners.GroupRunner`); a multi-node server has a
`NodeWorker` on each other bundle, started with rank 0's rendezvous address. Every actor call is its own
ObjectRef and the driver `ray.wait`s on all of them, so one failed run or one dead actor never loses
another's result.

Node loss (an actor of the slot died): the run in flight is recorded as a FAILED `node_lost` attempt
(tag `retried=true`; tags `node_id`, `node_ip`, `engine_pid`, `engine_log` and the `engine_log_tail.txt` artifact
when the driver can read that node's log) and the group's unfinished runs go back to the front of the queue on a fresh
placement group, where the group resumes; a run whose node was lost more than `cluster.max_retries`
times ends FAILED `node_lost`.

Ctrl-C / SIGTERM on the driver: every actor is killed (its engine dies with it: parent-death signal),
unfinished and queued runs become KILLED (`interrupted`) and are recorded, then KeyboardInterrupt propagates
(for SIGTERM its subclass `Terminated`, on which `python -m orchestrator` exits 143);
the same command again resumes (FINISHED runs are skipped). A second Ctrl-C while stopping skips the report but
never the closing of the parent run and of claims without a result.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import (PlacementGroup, placement_group, placement_group_table,
                                     remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.local_ray import init_local_ray
from orchestrator.preflight import Preflight, expected_work, gpus_per_node, run_preflight
from orchestrator.settings import ClusterKind, ClusterSettings, ExecutionSettings
from specsweep_vocab.spec import FailureReason, RunResult, RunSpec, RunState, ServerGroup
from workers.engine import NodeRank, free_port, read_log_tail
from workers.runners import LOG_TAIL_ARTIFACT, EngineInfo, FollowerRunner, engine_log_path, make_runner

if TYPE_CHECKING:  # driver-only (rich): the actors' worker processes import this module and never need it
    from orchestrator.progress import SweepProgress

logger = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_MB = 128  # results are small; Ray's default (30% of RAM) only slows start-up
WAIT_TIMEOUT_S = 0.5


@dataclass
class ExecutionStats:
    wall_s: float = 0.0
    ray_init_s: float = 0.0
    ray_shutdown_s: float = 0.0
    tracking_setup_s: float = 0.0  # from the call to MLflow ready (import, store, parent run; overlaps the engine start)
    ready_s: float = 0.0  # from the call to Ray up, MLflow ready and every actor submitted
    report_s: float = 0.0  # writing the report (a thread: overlaps the engine stop and Ray's shutdown)
    engine_starts: dict[str, int] = field(default_factory=dict)  # group_id -> engine start attempts
    engine_startup_s: dict[str, float] = field(default_factory=dict)  # group_id -> seconds starting engines
    engine_stop_s: dict[str, float] = field(default_factory=dict)  # group_id -> seconds stopping its engine
    marks: dict[str, float] = field(default_factory=dict)  # phase -> seconds from the call (ray_up, submitted, ...)
    tracking_s: float = 0.0  # driver seconds spent writing MLflow
    parent_run_id: str | None = None  # the MLflow parent run of this invocation (e.g. for the report)
    slots: list["SlotRecord"] = field(default_factory=list)  # where and when each server ran
    attempts_retried: int = 0  # failed attempts (node lost mid-run) that were re-queued

    @property
    def total_engine_starts(self) -> int:
        return sum(self.engine_starts.values())


@ray.remote
class ServerWorker:
    """Rank 0 of a server (the only rank on one node): a thin actor around GroupRunner. Methods run on the
    actor's main thread, one at a time (the engine's parent-death signal follows that thread)."""

    def __init__(self, group: ServerGroup, log_dir: str, restarts: int = 1):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.runner = make_runner(group.server, log_dir, restarts=restarts, node_tags=node_tags())

    def dist_init_addr(self) -> str:
        """rank 0's rendezvous address for a multi-node server: this node's IP and a free port."""
        ip = ray.util.get_node_ip_address()
        return f"{ip}:{free_port('0.0.0.0')}"

    def start(self, dist_init_addr: str | None = None) -> EngineInfo:
        rank = NodeRank(0, self.runner.server.nnodes, dist_init_addr) if dist_init_addr else None
        return self.runner.start(rank)

    def run(self, spec: RunSpec, attempt: int = 1) -> RunResult:
        return self.runner.run(spec, attempt)

    def stop(self) -> EngineInfo:
        return self.runner.stop()


@ray.remote
class NodeWorker:
    """Rank > 0 of a multi-node server, in bundle `rank` of the group's placement group."""

    def __init__(self, group: ServerGroup, log_dir: str, rank: int):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.runner = FollowerRunner(group.server, log_dir, rank, node_tags=node_tags())

    def start(self, dist_init_addr: str) -> EngineInfo:
        return self.runner.start(dist_init_addr)

    def stop(self) -> EngineInfo:
        return self.runner.stop()


def node_tags() -> dict[str, str]:
    """Where this actor runs: Ray node id and IP, its GPUs (CUDA_VISIBLE_DEVICES, set by Ray), the node's
    accelerator label."""
    ctx = ray.get_runtime_context()
    tags = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "gpu_ids": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    with contextlib.suppress(Exception):
        labels = ctx.get_node_labels()
        for key, value in labels.items():
            if not key.startswith("ray.io/"):
                tags[f"node_label.{key}"] = str(value)
    return tags


# ---------------------------------------------------------------- Ray connection


def _visible_gpus() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def gpus_for(group: ServerGroup, cluster: ClusterSettings) -> int:
    """GPUs the group's server needs on each of its nodes."""
    return gpus_per_node(group.server, cluster)


def connect_ray(cluster: ClusterSettings, gpus_needed: int = 0) -> bool:
    """Connect or start Ray; True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    common: dict[str, Any] = dict(namespace=cluster.namespace, log_to_driver=False, configure_logging=False,
                  runtime_env=cluster.runtime_env)
    if cluster.kind is ClusterKind.RAY:
        ray.init(address=cluster.address or "auto", **common)
        return True
    if os.environ.get("RAY_ADDRESS", "local") != "local":
        # A sweep submitted as a Ray Job (orchestrator.schedule) runs inside that job's cluster.
        ray.init(**common)
        return True
    num_gpus = cluster.num_gpus if cluster.num_gpus is not None else max(_visible_gpus(), gpus_needed)
    mb = cluster.object_store_memory_mb or LOCAL_OBJECT_STORE_MB
    # its own Ray on loopback, never one already on the machine (orchestrator.local_ray)
    init_local_ray(num_cpus=cluster.num_cpus, num_gpus=num_gpus, object_store_memory=mb * 2**20,
                   include_dashboard=cluster.include_dashboard, **common)
    return True


def shutdown_ray() -> None:
    """`ray.shutdown()`, without Ray's 1 s stall on its autoscaler monitor when this process started the Ray.

    Ray stops the processes of the node it started one after another, raylet and GCS first, each with SIGTERM
    and up to 1 s of grace before SIGKILL. The autoscaler monitor's SIGTERM handler reports its "failure" to the
    GCS, which is gone by then, so it never exits within the grace and is SIGKILLed after a full second (Ray
    2.60: 1.0 of the 1.4 s of `ray.shutdown()` on a 2-core VM). The monitor holds no state and a single-node
    embedded Ray never autoscales: it gets that SIGKILL up front (and is reaped), then `ray.shutdown()` stops
    everything else exactly as before. Connected to a Ray started elsewhere, this is plain `ray.shutdown()`."""
    with contextlib.suppress(Exception):  # Ray internals: if they are not as expected, plain ray.shutdown()
        from ray._private import ray_constants
        from ray._private.worker import _global_node as node

        if node is not None and node.head:
            for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
                if info.process.poll() is None:
                    info.process.kill()
                    info.process.wait(timeout=5)
    ray.shutdown()


def _bundle_nodes(pg: PlacementGroup) -> list[str]:
    try:
        where = placement_group_table(pg).get("bundles_to_node_id") or {}
    except Exception:  # a table read must never fail the sweep; the tag is only missing
        return []
    return [where[i] for i in sorted(where)]


@contextlib.contextmanager
def ray_session(cluster: ClusterSettings, groups: Sequence[ServerGroup]):
    """Connect (or reuse) Ray and run the preflight; shuts down only what it started. Yields the Preflight."""
    gpus = max((gpus_for(g, cluster) for g in groups), default=0)
    started = connect_ray(cluster, gpus)
    try:
        yield run_preflight(groups, cluster)
    finally:
        if started:
            shutdown_ray()


# ---------------------------------------------------------------- the driver loop


@dataclass
class _Slot:
    """One placement group and its actors serving one group; a group gets a fresh slot (attempt + 1) after
    a node of its slot was lost."""

    group: ServerGroup
    attempt: int
    pg: PlacementGroup
    actor: ray.actor.ActorHandle  # rank 0
    followers: list[ray.actor.ActorHandle]  # ranks 1..nnodes-1
    runs: dict[ray.ObjectRef, RunSpec]
    submitted_at: float
    up: bool = False  # rank 0's engine answered /health
    started: bool = False  # rank 0's start() returned (the engine is up or failed for good)
    closed: bool = False
    last_progress: float = 0.0  # when the previous run ended (or the engine came up)
    bundle_nodes: list[str] = field(default_factory=list)  # node id of each rank (multi-node servers)
    stops_left: int = 0
    engine: EngineInfo | None = None  # what rank 0's start() returned: node, pid
    engine_pid: str = ""  # the engine serving the latest run (a restart changes it)


@dataclass(frozen=True)
class SlotRecord:
    """When and where one slot ran, for tests and benchmarks (unix seconds)."""

    group_id: str
    attempt: int
    node_ids: tuple[str, ...]
    submitted_at: float
    began_at: float  # the engine start began (the placement group was ready and the actor up)
    ended_at: float  # the engine was stopped
    runs: int


class _Driver:
    def __init__(self, settings: ExecutionSettings, log_dir: Path, progress: SweepProgress,
                 emit: Callable[[RunResult], None], note_attempt: Callable[[RunResult], None],
                 stats: ExecutionStats, preflight: Preflight, shield=contextlib.nullcontext):
        self.settings = settings
        self.cluster = settings.cluster
        self.log_dir = log_dir
        self.progress = progress
        self.emit = emit
        self.note_attempt = note_attempt
        self.stats = stats
        self.preflight = preflight
        self.shield = shield  # no KeyboardInterrupt while a result is being handled and recorded
        self.queue: list[tuple[ServerGroup, tuple[RunSpec, ...], int]] = []  # longest expected first
        self.slots: list[_Slot] = []
        self.refs: dict[ray.ObjectRef, tuple[_Slot, str]] = {}  # ref -> (slot, start|fstart|run|stop|fstop)
        self.run_losses: dict[int, int] = {}  # job_index -> times its node was lost while it ran
        self.start_losses: dict[str, int] = {}  # group_id -> times a node was lost before its engine was up

    # -- queueing

    def enqueue(self, groups: Sequence[ServerGroup]) -> None:
        ordered = sorted(groups, key=lambda g: (-expected_work(g), g.runs[0].job_index))
        self.queue += [(g, g.runs, 1) for g in ordered]

    def active(self) -> int:
        return sum(not s.closed for s in self.slots)

    def schedule(self) -> None:
        """Launch queued groups up to max_concurrent_servers; Ray holds the ones the cluster cannot fit yet
        (their placement groups stay pending) and places them, in creation order, as others finish."""
        cap = self.cluster.max_concurrent_servers
        while self.queue and (cap is None or self.active() < cap):
            group, runs, attempt = self.queue.pop(0)
            self.launch(group, runs, attempt)

    def launch(self, group: ServerGroup, runs: tuple[RunSpec, ...], attempt: int) -> None:
        needs = self.preflight.needs(group.server, self.cluster)
        pg = placement_group(needs.bundles(), strategy=needs.strategy, bundle_label_selector=needs.label_selector())
        part = ServerGroup(group.server, runs)
        log_dir = str(self.log_dir)

        def on_bundle(actor_cls, index: int):
            return actor_cls.options(num_cpus=needs.cpus_per_node, num_gpus=needs.gpus_per_node, max_restarts=0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index))

        restarts = 1 if needs.nnodes == 1 else 0  # a multi-node engine is never restarted by rank 0 alone
        actor = on_bundle(ServerWorker, 0).remote(part, log_dir, restarts)
        followers = [on_bundle(NodeWorker, i).remote(part, log_dir, i) for i in range(1, needs.nnodes)]
        slot = _Slot(group, attempt, pg, actor, followers, {}, submitted_at=time.time())
        if followers:
            addr = actor.dist_init_addr.remote()
            for f in followers:
                self.refs[f.start.remote(addr)] = (slot, "fstart")
            start_ref = actor.start.remote(addr)
        else:
            start_ref = actor.start.remote()
        self.refs[start_ref] = (slot, "start")
        slot.runs = {actor.run.remote(spec, attempt): spec for spec in runs}
        self.refs.update({ref: (slot, "run") for ref in slot.runs})
        self.refs[actor.stop.remote()] = (slot, "stop")
        self.slots.append(slot)
        logger.info("server %s (attempt %d, %d run(s)): placement group %s %s", group.group_id, attempt, len(runs),
                    needs.strategy, needs.bundles())

    # -- the loop

    def loop(self) -> None:
        self.schedule()
        while self.refs or self.queue:
            if not self.refs:
                self.schedule()
                continue
            ready, rest = ray.wait(list(self.refs), num_returns=1, timeout=WAIT_TIMEOUT_S)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            done = set(ready)
            # in submission order: an actor's start, runs and stop that finished together (the driver was busy,
            # e.g. setting up MLflow) are handled as they happened, start before stop
            for ref in [r for r in self.refs if r in done]:
                if ref in self.refs:  # a lost slot drops its other refs
                    with self.shield():
                        self.handle(ref)
            self.schedule()

    def handle(self, ref: ray.ObjectRef) -> None:
        slot, kind = self.refs.pop(ref)
        try:
            value = ray.get(ref, timeout=60)
        except RayActorError as e:
            if kind == "fstop":  # a follower that died while stopping: nothing is lost
                self._follower_stopped(slot)
            else:
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
                    self.finish(slot, None)
                elif kind == "fstop":
                    self._follower_stopped(slot)
            return
        if kind == "start":
            self.record(slot, value)
            slot.started, slot.last_progress = True, time.time()
            slot.engine, slot.engine_pid = value, str(value.pid or "")
            if slot.followers:
                slot.bundle_nodes = _bundle_nodes(slot.pg)
            if value.alive:
                slot.up = True
                self.progress.server_up()
        elif kind == "fstart":
            if value.error:
                logger.error("server %s rank %d: %s", slot.group.group_id, value.rank, value.error)
        elif kind == "run":
            slot.runs.pop(ref)
            slot.last_progress = time.time()
            slot.engine_pid = value.tags.get("engine_pid", slot.engine_pid)
            if slot.bundle_nodes:
                value.tags["server_node_ids"] = ",".join(slot.bundle_nodes)  # rank order
            self.emit(value)
        elif kind == "stop":
            self.record(slot, value)
            self.finish(slot, value)
        else:
            self._follower_stopped(slot)

    def record(self, slot: _Slot, info: EngineInfo) -> None:
        gid = slot.group.group_id
        key = gid if slot.attempt == 1 else f"{gid}#{slot.attempt}"
        self.stats.engine_starts[key] = info.engine_starts
        self.stats.engine_startup_s[key] = info.startup_s
        self.stats.engine_stop_s[key] = info.stop_s

    def finish(self, slot: _Slot, info: EngineInfo | None) -> None:
        """rank 0 stopped its engine: stop the other ranks, then free the placement group."""
        if info is not None:
            node = (info.node or {}).get("node_id", "")
            self.stats.slots.append(SlotRecord(slot.group.group_id, slot.attempt, tuple(slot.bundle_nodes) or (node,),
                                               slot.submitted_at, info.began_at, time.time(),
                                               len(slot.group.runs)))
        slot.stops_left = len(slot.followers)
        for f in slot.followers:
            self.refs[f.stop.remote()] = (slot, "fstop")
        if not slot.followers:
            self.close(slot)

    def _follower_stopped(self, slot: _Slot) -> None:
        slot.stops_left -= 1
        if slot.stops_left <= 0:
            self.close(slot)

    def close(self, slot: _Slot) -> None:
        if slot.closed:
            return
        slot.closed = True
        if slot.up:
            slot.up = False
            self.progress.server_down()
        for actor in (slot.actor, *slot.followers):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(slot.pg)  # frees its bundles for a pending group

    # -- faults

    def lost(self, slot: _Slot, error: Exception) -> None:
        """A node of this slot died (or its actor was killed). The run in flight, if any, is charged one loss
        and recorded as a FAILED attempt; the group's unfinished runs go back to the front of the queue on a
        fresh placement group while their loss budget (cluster.max_retries) lasts."""
        for ref in [r for r, (s, _) in self.refs.items() if s is slot]:
            del self.refs[ref]
        unfinished = sorted(slot.runs.values(), key=lambda r: r.job_index)
        slot.runs.clear()
        where, artifacts = self._lost_context(slot) if unfinished else ({}, {})
        self.close(slot)
        if not unfinished:
            return
        gid, now = slot.group.group_id, time.time()
        logger.warning("server %s: node or worker lost (%s); %d run(s) unfinished", gid, type(error).__name__,
                       len(unfinished))
        budget = self.cluster.max_retries
        tags = {"attempt": str(slot.attempt), "server_group": gid, "failure_reason": FailureReason.NODE_LOST.value,
                **where}
        message = f"node lost: {str(error)[-1000:]}"
        if slot.started:
            victim = unfinished[0]  # runs go in job order: the first unfinished one was in flight
            losses = self.run_losses[victim.job_index] = self.run_losses.get(victim.job_index, 0) + 1
            failed = RunResult(run=victim, state=RunState.FAILED, reason=FailureReason.NODE_LOST,
                               message=f"{message} (loss {losses} of this run)", started_at=slot.last_progress,
                               ended_at=now, tags=dict(tags), artifacts=dict(artifacts))
            if losses > budget:
                self.emit(failed)
                unfinished = unfinished[1:]
            else:
                failed.tags["retried"] = "true"  # a later attempt of the same RunSpec follows
                self.note_attempt(failed)
        else:
            self.start_losses[gid] = self.start_losses.get(gid, 0) + 1
            if self.start_losses[gid] > budget:
                for spec in unfinished:
                    self.emit(RunResult(run=spec, state=RunState.FAILED, reason=FailureReason.NODE_LOST,
                                        message=f"{message} (lost {self.start_losses[gid]} times before its "
                                                f"engine was up)", started_at=now, ended_at=now, tags=dict(tags),
                                        artifacts=dict(artifacts)))
                return
        if unfinished:
            self.queue.insert(0, (slot.group, tuple(unfinished), slot.attempt + 1))

    def _lost_context(self, slot: _Slot) -> tuple[dict[str, str], dict[str, str]]:
        """Tags and artifacts for a lost slot's runs: the node (id, IP), the engine's pid and log path, and the
        log's tail when the driver can read it (the same host or a shared file system; else the path says where)."""
        node = dict(slot.engine.node or {}) if slot.engine else {}
        tags = {key: node[key] for key in ("node_id", "node_ip") if node.get(key)}
        if "node_id" not in tags and (nodes := slot.bundle_nodes or _bundle_nodes(slot.pg)):
            tags["node_id"] = nodes[0]  # rank 0's bundle: the start never returned
        if slot.engine_pid:
            tags["engine_pid"] = slot.engine_pid
        log = engine_log_path(self.log_dir, slot.group.server)
        tags["engine_log"] = str(log)
        tail = read_log_tail(log)
        return tags, ({LOG_TAIL_ARTIFACT: tail} if tail else {})

    def interrupt(self) -> None:
        """Kill every actor (engines die with them); every unfinished or queued run becomes KILLED."""
        now = time.time()

        def killed(spec: RunSpec, attempt: int, gid: str) -> None:
            self.emit(RunResult(run=spec, state=RunState.KILLED, reason=FailureReason.INTERRUPTED,
                                message="the sweep was interrupted", started_at=now, ended_at=now,
                                tags={"attempt": str(attempt), "server_group": gid}))

        for slot in self.slots:
            for actor in (slot.actor, *slot.followers):
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            with contextlib.suppress(Exception):
                remove_placement_group(slot.pg)
            for spec in sorted(slot.runs.values(), key=lambda r: r.job_index):
                killed(spec, slot.attempt, slot.group.group_id)
            slot.runs.clear()
        for group, runs, attempt in self.queue:
            for spec in runs:
                killed(spec, attempt, group.group_id)
        self.queue.clear()
        self.refs.clear()


class Terminated(KeyboardInterrupt):
    """SIGTERM on the driver: cleaned up as Ctrl-C is, then `python -m orchestrator` exits 143 (128 + SIGTERM),
    not as if interrupted by SIGINT."""

    exit_code = 128 + signal.SIGTERM


def _interrupt(signum: int) -> KeyboardInterrupt:
    return Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt(f"signal {signum}")


class _Interrupts:
    """SIGINT and SIGTERM raise KeyboardInterrupt (SIGTERM: its subclass Terminated), but never inside `shield()`
    (a result being recorded in MLflow, the interrupt being cleaned up): there the signal waits for the shield
    to end."""

    last: int | None = None  # the latest signal handled, by any instance

    def __init__(self):
        self.depth = 0
        self.pending: int | None = None

    def handler(self, signum, frame):
        _Interrupts.last = signum
        if self.depth:
            self.pending = signum
            return
        raise _interrupt(signum)

    @contextlib.contextmanager
    def shield(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise _interrupt(signum)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Yields `shield()` (a context manager); signal handlers only on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield contextlib.nullcontext
        return
    interrupts = _Interrupts()
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield interrupts.shield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_plan(plan, settings: ExecutionSettings, on_result: Callable[[RunResult], None] | None = None, *,
             track: bool = True, stats: ExecutionStats | None = None,
             multirun_yaml: str | None = None, tracker=None) -> list[RunResult]:
    """Run every RunSpec of `plan` (an orchestrator.plan.Plan); see the module docstring.

    `multirun_yaml`: the text of Hydra's `<sweep dir>/multirun.yaml`, stored on the parent run.
    `tracker`: an `orchestrator.tracking.Tracker` whose parent run is already begun (the launcher's, holding this
    plan's claims); results are recorded there and no set-up thread runs. Claims still without a result at the end
    are closed (KILLED when interrupted, else FAILED), and the parent is closed even on a second Ctrl-C.

    Timeline (what overlaps what): Ray starts (or is reused) → preflight → every actor is submitted → MLflow is
    set up in a thread (import, store, experiment, parent run) while the actors' workers start their engines;
    results arrive and are recorded as they finish → once every run has its result, the report is written in
    that thread while the engines stop and Ray shuts down → the parent run is closed.
    """
    from orchestrator.progress import SweepProgress

    stats = stats if stats is not None else ExecutionStats()
    results: dict[int, RunResult] = {}
    if plan.num_runs == 0:
        return []
    if track:
        from orchestrator.tracking import experiment_for

        experiment_for(settings, plan)  # ValueError (stub mixed with a real engine) before anything starts
    t0 = time.perf_counter()

    def mark(phase: str) -> None:
        stats.marks[phase] = time.perf_counter() - t0

    # MLflow set-up (import, schema, parent run: seconds) runs in a background thread; it opens the store only once
    # the preflight has passed (a sweep that cannot fit leaves no trace) and the actors are submitted. Its import
    # (1.7 s of CPU) waits for that too when this call starts Ray: on 2 cores it would otherwise slow Ray's start,
    # whose raylet registration sits right at Ray's 1 s polling step (ray.init then takes a whole second longer).
    # With Ray already up there is no start-up to protect: MLflow's import begins at once (it writes nothing).
    pool = ThreadPoolExecutor(1, thread_name_prefix="sweep-bg")  # one thread: imports, MLflow set-up, report
    pool.submit(_warm_imports)  # while Ray starts
    gate = _Gate()
    early = settings.tracking_uri if ray.is_initialized() else None
    setup = None
    if tracker is not None:
        stats.parent_run_id = tracker.parent_run_id
    elif track:
        setup = pool.submit(_open_tracker, plan, settings, multirun_yaml, stats, t0, gate, early)
    report_job = None  # the report, written in `pool` once every run has its result
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
            start_report()
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

    def start_report() -> None:
        """Every run has its result and is recorded: nothing more can reach the child runs the report reads, so
        it is written now, in the background thread, while the engines stop and Ray shuts down."""
        nonlocal report_job
        if report_job is None and tracker is not None and len(results) == plan.num_runs:
            mark("runs_recorded")
            report_job = pool.submit(_timed_report, tracker, plan, settings, stats)

    def tracker_ready():
        nonlocal tracker
        tracker = setup.result()
        while backlog and tracker is not None:
            record(backlog.pop(0))
        start_report()

    def note_attempt(result: RunResult) -> None:
        """A failed attempt whose run was re-queued: recorded in MLflow, not a result of the sweep."""
        stats.attempts_retried += 1
        if tracker is not None:
            record(result)
        elif setup is not None:
            backlog.append(result)

    started_ray, driver, status = False, None, RunState.FINISHED
    try:
        _Interrupts.last = None
        with _sigterm_as_interrupt() as shield, progress:
            try:
                t = time.perf_counter()
                gpus = max((gpus_for(g, settings.cluster) for g in plan.groups), default=0)
                started_ray = connect_ray(settings.cluster, gpus)
                stats.ray_init_s = time.perf_counter() - t
                mark("ray_up")
                fit = run_preflight(plan.groups, settings.cluster)  # PreflightError: nothing launched
                logger.info("running %d run(s) on %d server(s); engine logs in %s", plan.num_runs,
                            len(plan.groups), log_dir)
                driver = _Driver(settings, log_dir, progress, emit, note_attempt, stats, fit, shield)
                driver.enqueue(plan.groups)
                driver.schedule()
                mark("submitted")
                gate.open(True)
                if setup is not None:
                    with shield():
                        tracker_ready()
                stats.ready_s = time.perf_counter() - t0
                mark("tracker_ready")
                driver.loop()
                mark("loop_done")
            except BaseException as e:
                gate.open(False)
                status = RunState.KILLED if isinstance(e, KeyboardInterrupt) else RunState.FAILED
                if driver is not None:
                    logger.warning("%s: stopping %d server(s)", "interrupted" if status is RunState.KILLED
                                   else f"execution failed ({type(e).__name__})", len(driver.slots))
                    with shield():
                        driver.interrupt()
                if type(e) is KeyboardInterrupt and _Interrupts.last == signal.SIGTERM:
                    raise _interrupt(signal.SIGTERM) from e  # Ray's ray.wait turns our Terminated into its own
                raise
    finally:
        report = None
        try:
            if started_ray:
                logger.info("stopping Ray")
                t = time.perf_counter()
                shutdown_ray()
                stats.ray_shutdown_s = time.perf_counter() - t
                mark("ray_down")
            stats.wall_s = time.perf_counter() - t0
            if tracker is None and setup is not None:
                with contextlib.suppress(Exception):  # set-up raised: that error is already propagating
                    tracker_ready()
            if tracker is not None:
                if status is not RunState.FINISHED:
                    logger.warning("writing the report of the runs that ended (Ctrl-C again skips it; the MLflow "
                                   "runs are closed either way)")
                if report_job is None and results:  # not every run has a result (interrupted, failed)
                    report_job = pool.submit(_timed_report, tracker, plan, settings, stats)
                report = report_job.result() if report_job is not None else None
                mark("report_done")
        except KeyboardInterrupt:  # a second Ctrl-C while stopping: the runs are still closed below
            status = RunState.KILLED
            logger.warning("interrupted again: closing the MLflow runs without the report")
            raise
        finally:
            with _sigterm_as_interrupt() as shield, shield():  # a third Ctrl-C waits for the runs to be closed
                _close_tracking(tracker, status, results.values(), stats)
            pool.shutdown(wait=False)
        mark("end")
        progress.summary(list(results.values()))
        if report is not None and settings.progress:
            from rich.markdown import Markdown

            progress.console.print(Markdown(report.diagnosis_md))
    return [results[r.job_index] for r in plan.runs if r.job_index in results]


# What Ray's first remote call imports to build the driver's serialization context (its arrow and pydantic
# serializers): 0.2 s right after ray.init, on the sweep's critical path, when they are installed (MLflow brings
# pyarrow and numpy). Imported in the background thread while Ray starts instead; a missing one is skipped.
WARM_IMPORTS = ("pyarrow", "pyarrow.json", "pydantic", "starlette.datastructures")


def _warm_imports() -> None:
    for name in WARM_IMPORTS:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class _Gate:
    """Opened once by the driver thread: True lets the MLflow set-up proceed, False cancels it."""

    def __init__(self):
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


def _open_tracker(plan, settings: ExecutionSettings, multirun_yaml: str | None, stats: ExecutionStats, t0: float,
                  gate: _Gate | None = None, early_import_uri: str | None = None):
    from orchestrator.tracking import Tracker  # light: MLflow itself loads in from_settings (or warm_mlflow)

    if early_import_uri is not None:
        warm_mlflow(early_import_uri)
    if gate is not None and not gate.wait():
        return None
    tracker = Tracker.from_settings(settings, plan)
    stats.parent_run_id = tracker.begin_parent(plan, work_dir=settings.work_dir, multirun_yaml=multirun_yaml)
    stats.tracking_setup_s = time.perf_counter() - t0
    return tracker


def _close_tracking(tracker, status: RunState, results, stats: ExecutionStats) -> None:
    """Parent metrics, claims left without a result, the parent's status: each attempted, none masks the sweep's
    own outcome."""
    if tracker is None:
        return
    try:
        tracker.log_parent_metrics(_parent_metrics(results, stats))
    except Exception:
        logger.exception("could not log the parent run's metrics in MLflow")
    try:
        if status is RunState.FINISHED:
            tracker.release_claims(RunState.FAILED, FailureReason.WORKER_ERROR, "execution returned no result")
        else:
            tracker.release_claims(status, FailureReason.INTERRUPTED, "the sweep was interrupted")
        tracker.end_parent(status)
    except Exception:
        logger.exception("could not close the parent run in MLflow")


def _timed_report(tracker, plan, settings: ExecutionSettings, stats: ExecutionStats):
    t = time.perf_counter()
    try:
        return _write_report(tracker, plan, settings)
    finally:
        stats.report_s = time.perf_counter() - t


def _write_report(tracker, plan, settings: ExecutionSettings):
    """Table, plots and diagnosis.md on the parent run; a report failure never fails the sweep."""
    from orchestrator.report import write_report

    try:
        return write_report(tracker.client, tracker.parent_run_id, settings.report, sweep=plan.sweep_name,
                            print_summary=False, run_hashes=plan.run_hashes)
    except Exception:
        logger.exception("could not write the sweep report to parent run %s", tracker.parent_run_id)
        return None


def _parent_metrics(results, stats: ExecutionStats) -> dict[str, float]:
    results = list(results)
    count = {s: sum(r.state is s for r in results) for s in RunState}
    return {"runs_finished": float(count[RunState.FINISHED]), "runs_failed": float(count[RunState.FAILED]),
            "runs_killed": float(count[RunState.KILLED]), "engine_starts": float(stats.total_engine_starts),
            "servers": float(len({r.run.server.key for r in results})), "wall_s": stats.wall_s}
