"""The driver loop of one `execute_plan` call: server slots on Ray, every actor call its own ObjectRef, `ray.wait`.

    Driver(settings, log_dir, progress, emit, note_attempt, stats, preflight, shield)
        .submit(groups)       queue the groups, longest expected work first, and start up to
                              `cluster.max_concurrent_servers` of them
        .loop()               handle every ObjectRef as it finishes until every run has its result
        .stop_all_on_error()  a context manager: on any exception (Ctrl-C included) kill every actor and emit the
                              unfinished and queued runs as KILLED, then re-raise

A slot is one placement group (one bundle per node {GPU: tp_size / nnodes, CPU: k}, STRICT_PACK on one node,
STRICT_SPREAD over several, the accelerator as a bundle label selector or a custom resource) with a `ServerWorker`
on bundle 0 and a `NodeWorker` on each other bundle. Rank 0 gets `start`, one `run` per RunSpec and `stop` as
separate calls; placement groups the cluster cannot fit yet stay pending in Ray. One failed run or one dead actor
never loses another's result.

Node loss (an actor of the slot died): the run in flight is recorded as a FAILED `node_lost` attempt (tag
`retried=true`; tags `node_id`, `node_ip`, `engine_pid`, `engine_log` and the `engine_log_tail.txt` artifact when
the driver can read that node's log) and the group's unfinished runs go back to the front of the queue on a fresh
placement group; a run whose node was lost more than `cluster.max_retries` times ends FAILED `node_lost`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.execution.actors import NodeWorker, ServerWorker
from orchestrator.execution.preflight import Preflight, expected_work
from orchestrator.execution.ray_connection import bounded_ray_call, bundle_nodes
from orchestrator.config.settings import ExecutionSettings
from orchestrator.execution.signals import Shield
from orchestrator.execution.stats import ExecutionStats, SlotRecord
from specsweep_common.spec import FailureReason, RunResult, RunSpec, RunState, ServerGroup
from workers.engine_process import read_log_tail
from workers.runners import LOG_TAIL_ARTIFACT, EngineInfo, engine_log_path

if TYPE_CHECKING:  # rich: imported by execute_plan, on the driver only
    from orchestrator.execution.progress import SweepProgress

logger = logging.getLogger(__name__)

WAIT_TIMEOUT_S = 0.5


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


class Driver:
    """The slots and the queue of one sweep; `emit` gets each run's final result, `note_attempt` each failed
    attempt whose run was re-queued."""

    def __init__(self, settings: ExecutionSettings, log_dir: Path, progress: SweepProgress,
                 emit: Callable[[RunResult], None], note_attempt: Callable[[RunResult], None],
                 stats: ExecutionStats, preflight: Preflight, shield: Shield = contextlib.nullcontext):
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

    def submit(self, groups: Sequence[ServerGroup]) -> None:
        """Queue the groups and start as many as `cluster.max_concurrent_servers` allows."""
        self.enqueue(groups)
        self.schedule()

    def enqueue(self, groups: Sequence[ServerGroup]) -> None:
        ordered = sorted(groups, key=lambda g: (-expected_work(g), g.runs[0].job_index))
        self.queue += [(g, g.runs, 1) for g in ordered]

    def active(self) -> int:
        return sum(not s.closed for s in self.slots)

    def schedule(self) -> None:
        """Start queued groups up to max_concurrent_servers; Ray holds the ones the cluster cannot fit yet
        (their placement groups stay pending) and places them, in creation order, as others finish."""
        cap = self.cluster.max_concurrent_servers
        while self.queue and (cap is None or self.active() < cap):
            group, runs, attempt = self.queue.pop(0)
            self.start(group, runs, attempt)

    def start(self, group: ServerGroup, runs: tuple[RunSpec, ...], attempt: int) -> None:
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
        wait_s = slot.group.server.engine.request_timeout_s  # a ready result (ray.wait): only its transfer is waited
        try:
            value = ray.get(ref, timeout=wait_s)
        except RayActorError as e:
            if kind == "fstop":  # a follower that died while stopping: nothing is lost
                self._follower_stopped(slot)
            else:
                self.lost(slot, e)
            return
        except (RayTaskError, GetTimeoutError) as e:  # a bug in the worker, not the engine
            if isinstance(e, GetTimeoutError):
                e = GetTimeoutError(f"the {kind} result was not fetched within engine.request_timeout_s={wait_s:g}")
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
                slot.bundle_nodes = bundle_nodes(slot.pg)
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
        if "node_id" not in tags and (nodes := slot.bundle_nodes or bundle_nodes(slot.pg)):
            tags["node_id"] = nodes[0]  # rank 0's bundle: the start never returned
        if slot.engine_pid:
            tags["engine_pid"] = slot.engine_pid
        log = engine_log_path(self.log_dir, slot.group.server)
        tags["engine_log"] = str(log)
        tail = read_log_tail(log)
        return tags, ({LOG_TAIL_ARTIFACT: tail} if tail else {})

    @contextlib.contextmanager
    def stop_all_on_error(self) -> Iterator[None]:
        """Any exception (Ctrl-C, SIGTERM, a driver bug): every actor killed, every unfinished run KILLED, re-raised."""
        try:
            yield
        except BaseException as e:
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"execution failed ({type(e).__name__})"
            logger.warning("%s: stopping %d server(s)", why, len(self.slots))
            with self.shield():
                self.interrupt()
            raise

    def interrupt(self) -> None:
        """Kill every actor (engines die with them; within RAY_STOP_WAIT_S, else Ray is abandoned and its processes
        killed: the engines die with their actors' workers), every unfinished or queued run becomes KILLED."""
        now = time.time()

        def killed(spec: RunSpec, attempt: int, gid: str) -> None:
            self.emit(RunResult(run=spec, state=RunState.KILLED, reason=FailureReason.INTERRUPTED,
                                message="the sweep was interrupted", started_at=now, ended_at=now,
                                tags={"attempt": str(attempt), "server_group": gid}))

        slots = list(self.slots)

        def kill_all() -> None:  # a Ray whose GCS the same signal stopped would hold each call 60 s: bounded
            for slot in slots:
                for actor in (slot.actor, *slot.followers):
                    with contextlib.suppress(Exception):
                        ray.kill(actor, no_restart=True)
                with contextlib.suppress(Exception):
                    remove_placement_group(slot.pg)

        bounded_ray_call(kill_all, f"killing {len(slots)} server(s)")
        for slot in self.slots:
            for spec in sorted(slot.runs.values(), key=lambda r: r.job_index):
                killed(spec, slot.attempt, slot.group.group_id)
            slot.runs.clear()
        for group, runs, attempt in self.queue:
            for spec in runs:
                killed(spec, attempt, group.group_id)
        self.queue.clear()
        self.refs.clear()
