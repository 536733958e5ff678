"""The runners: one server group on one node, its RunSpecs run in order. Plain Python (no Ray): the Ray actors
(`orchestrator.execution.actors`) are thin shells around them, and tests drive them directly.

    runner: JobRunner = GroupRunner(server, log_dir, restarts=1, node_tags={"node_id": ..., "gpu_ids": ...})
    runner.start(node_rank=None) -> EngineInfo   # never raises: a start failure is remembered
    runner.run(spec: RunSpec, attempt=1) -> RunResult   # never raises: failures are data
    runner.stop() -> EngineInfo

`Runner` is the Protocol every runner satisfies (start, stop, info); `JobRunner` adds run(). `GroupRunner` (an
engine: start it, probe it per RunSpec, stop it) and `workers.kernel_runner.KernelRunner` (`job=kernel`: one
verify-kernel shape per RunSpec, no engine) are JobRunners; the Ray actor picks one for its server
(`orchestrator.execution.actors.runner_for`). `FollowerRunner` holds rank > 0 of a multi-node engine: a Runner started
with its NodeRank (rank 0's rendezvous address), stopped, never given a RunSpec.

Failure policy, per run:
- the engine could not start (exit, timeout): every run of the group FAILED `engine_start_failed`, log tail;
- the engine died during a run: that run FAILED `engine_died`, log tail; the next run restarts the engine
  (at most `restarts` times per group; after that the remaining runs are FAILED `engine_died`);
- the engine hung during a run (alive, its health path unanswered for `engine.health_timeout_s`:
  workers.health_watch): killed, that run FAILED `engine_hung`, and the next run restarts it as above;
- an HTTP timeout: `timeout`; a response without the fields we need: `bad_response`.

Multi-node servers: the driver gives rank 0's runner `node_rank=NodeRank(0, n, addr)` (its engine serves HTTP
and is probed) and starts ranks 1..n-1 with `FollowerRunner` (no HTTP, no probes). A multi-node engine is
never restarted in place (the other ranks would need restarting too): it is given `restarts=0`.

Each result's tags carry `engine_start` (which start of this group's engine served it, 1-based) and
`engine_pid`, so a sweep can be checked for exactly one start per ServerSpec.

What differs between engines is the engine's (`workers.adapter.EngineAdapter`, from `workers.registry.adapter_for`):
its argv and env, how its prompt is encoded, and what is read from it around each run (`adapter.observer`: the
`/metrics` counters and `/server_info` limits of both real engines, SGLang's /server_info tags, accept-length
cross-check and plugin counters; see workers/adapter.py and workers/sglang/observe.py). `GroupRunner` has no
engine branches.

GPU engines (SGLang, or the reference engine on cuda): each run is sampled with `workers.telemetry.GpuSampler`
over CUDA_VISIBLE_DEVICES (set by Ray from the actor's GPUs): `gpu_*` metrics and series, GPU name and compute
capability tags.

`metrics.log_patterns` (RunSpec.log_patterns): the engine log lines a run produced are fed to
`workers.log_patterns` (each named group becomes a series; a pattern that matched nothing is a note).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from specsweep_common.spec import Algorithm, RunResult, RunSpec, RunState, ServerSpec
from workers.derived import derived_metrics
from workers.adapter import NodeRank
from workers.engine_process import EngineProcess
from workers.registry import adapter_for
from workers.errors import EngineDied, EngineHung, EngineStartFailed, WorkerError
from workers.health_watch import HealthWatch
from workers.log_patterns import apply_log_patterns, file_size, follow_log, wait_quiet
from workers.measurement import Measurement
from workers.probe import run_probe
from workers.repeats import combine
from workers.telemetry import GpuSampler, gpu_identity

logger = logging.getLogger(__name__)

LOG_TAIL_ARTIFACT = "engine_log_tail.txt"


@dataclass
class EngineInfo:
    group_id: str
    engine_starts: int  # start attempts so far, failed ones included
    alive: bool
    pid: int | None = None
    base_url: str | None = None
    startup_s: float = 0.0  # seconds spent starting engines (all attempts)
    error: str | None = None
    log_path: str = ""
    node: dict[str, str] | None = None  # node_id, node_ip, gpu_ids, node_accelerator (from the Ray actor)
    rank: int = 0
    began_at: float = 0.0  # unix seconds: the first engine start began
    stop_s: float = 0.0  # seconds the last stop() took (SIGTERM to the engine's exit)


@runtime_checkable
class Runner(Protocol):
    """Every runner: one engine (or the GPU) held for a server on this node. start() once (`node_rank` for a
    multi-node server), stop() once; info() at any time. No method raises: failures are remembered in the info."""

    server: ServerSpec
    log_path: Path

    def start(self, node_rank: NodeRank | None = None) -> EngineInfo: ...

    def stop(self) -> EngineInfo: ...

    def info(self) -> EngineInfo: ...


@runtime_checkable
class JobRunner(Runner, Protocol):
    """A runner that the group's RunSpecs are run on, in order (rank 0 of a server)."""

    def run(self, spec: RunSpec, attempt: int = 1) -> RunResult: ...


class GroupRunner:
    """An engine group: starts the engine, probes it once per RunSpec (restarting a dead engine within the
    budget), stops it."""

    def __init__(self, server: ServerSpec, log_dir: str | os.PathLike, *, restarts: int = 1,
                 grace_s: float = 10.0, node_tags: dict[str, str] | None = None):
        self.server = server
        self.node_tags = dict(node_tags or {})
        self.node_rank: NodeRank | None = None
        self.began_at = 0.0
        self.group_id = server.key
        self.log_path = engine_log_path(log_dir, server)
        self.restarts_left = restarts
        self.grace_s = grace_s
        self.engine: EngineProcess | None = None
        self.engine_starts = 0
        self.startup_s = 0.0
        self.start_error: EngineStartFailed | None = None
        self.dead_error: EngineDied | None = None  # the engine died and the restart budget is spent
        self.watch: HealthWatch | None = None  # the latest run's (workers.health_watch)
        self.host = socket.gethostname()
        # GPU engines: NVML telemetry over the GPUs Ray gave this actor (CUDA_VISIBLE_DEVICES)
        self.on_gpu = server.on_gpu
        self.gpu_tags = self._gpu_tags() if self.on_gpu else {}
        self.adapter = adapter_for(server.engine.kind)
        self.observer = self.adapter.observer(server)  # what is read from the engine around each run
        self.weights: tuple[float | None] | None = None  # (weight bytes per forward,) once read, on a GPU

    # -- engine lifecycle

    def start(self, node_rank: NodeRank | None = None) -> EngineInfo:
        if node_rank is not None:
            self.node_rank = node_rank
        if self.engine is None and self.start_error is None:
            self._start_engine()
        return self.info()

    def _start_engine(self) -> None:
        self.engine_starts += 1
        self.began_at = self.began_at or time.time()
        self.engine = EngineProcess.for_server(self.server, self.log_path, grace_s=self.grace_s,
                                               node_rank=self.node_rank, env=_engine_env(self.node_tags))
        t0 = time.perf_counter()
        try:
            self.engine.start()
        except EngineStartFailed as e:
            self.start_error = e
            self.engine = None
            logger.error("group %s: engine start %d failed: %s", self.group_id, self.engine_starts, e.message)
        finally:
            self.startup_s += time.perf_counter() - t0

    def stop(self) -> EngineInfo:
        t0 = time.perf_counter()
        if self.engine is not None:
            self.engine.stop()
        info = self.info()
        info.stop_s = time.perf_counter() - t0
        self.engine = None
        return info

    def info(self) -> EngineInfo:
        e = self.engine
        return EngineInfo(group_id=self.group_id, engine_starts=self.engine_starts, alive=bool(e and e.alive),
                          pid=e.pid if e else None, base_url=e.base_url if e else None, startup_s=self.startup_s,
                          error=self.start_error.message if self.start_error else None,
                          log_path=str(self.log_path), node=dict(self.node_tags), began_at=self.began_at)

    # -- runs

    def run(self, spec: RunSpec, attempt: int = 1) -> RunResult:
        result = RunResult(run=spec, state=RunState.FINISHED, started_at=time.time(),
                           tags=self._tags(attempt))
        log_offset: int | None = None
        self.watch = None
        try:
            self._ensure_engine()
            engine = self.engine
            pid = engine.pid if engine is not None else None
            if engine is None or pid is None:
                raise RuntimeError(f"group {self.group_id}: no spawned engine after _ensure_engine()")
            result.tags.update(engine_start=str(self.engine_starts), engine_pid=str(pid))
            self.watch = HealthWatch(engine, self.server.engine.health_timeout_s)
            with self.watch:  # a hung engine is killed (and the run fails engine_hung): never a wait for ever
                if spec.log_patterns:  # the run's own lines: from just before its flush
                    log_offset = file_size(self.log_path)
                sampler = self._sampler() if self.on_gpu else None
                try:
                    m, repeat_tags = combine([self._probe(engine.base_url, pid, spec, r, result.tags)
                                              for r in range(spec.probe.repeats)])
                finally:
                    samples = sampler.stop() if sampler else None
            if self.watch.hung:  # killed while the run's last reads were answered in time: the run is still lost
                raise EngineHung(self.watch.hung, self.engine.log_tail() if self.engine else "")
            result.metrics, result.series, result.engine_time_s = m.metrics, m.series, m.engine_time_s
            result.tags.update(repeat_tags)
            if sampler is not None and samples is not None and sampler.available:  # NVML missing or no GPU: nothing recorded
                result.metrics.update(samples.metrics())
                result.series.update(samples.series())
            result.artifacts.update(m.artifacts)
            if m.notes:
                result.message = "; ".join(m.notes)
        except WorkerError as e:
            e = self._explain(e)
            result.state, result.reason, result.message = RunState.FAILED, e.reason, e.message
            tail = e.log_tail or (self.engine.log_tail() if self.engine else "")
            if tail:
                result.artifacts[LOG_TAIL_ARTIFACT] = tail
            logger.warning("run %d (%s) FAILED %s: %s", spec.job_index, spec.name, e.reason.value, e.message)
        if log_offset is not None:
            self._log_series(spec, log_offset, result)
        result.tags["engine_start"] = result.tags.get("engine_start", str(self.engine_starts))
        if result.reason:
            result.tags["failure_reason"] = result.reason.value
        result.ended_at = time.time()
        return result

    def _probe(self, base_url: str, pid: int, spec: RunSpec, repeat: int, tags: dict[str, str]) -> Measurement:
        """One of the run's probe.repeats prompts, measured as a whole run is: the observer's counters around it
        (verify_step_ms of this prompt alone) and the derived figures."""
        self.observer.before_run(base_url, pid)
        m = run_probe(base_url, spec.probe, self.adapter.prompt_kind,
                      expect_spec=self.server.drafter.algorithm is not Algorithm.NONE,
                      timeout_s=self.server.engine.request_timeout_s, model_path=self.adapter.prompt_model(self.server),
                      repeat=repeat, **self.observer.probe_kwargs())
        m.notes += self.observer.after_run(base_url, m.metrics, tags)
        m.metrics.update(derived_metrics(m.metrics, self.server.model, on_gpu=self.on_gpu,
                                         weight_bytes=self._weight_bytes()))
        return m

    def _weight_bytes(self) -> float | None:
        """The weights one forward reads, from the engine's reading of the model's shape (GPU runs only: the floor
        needs the node's measured ceiling); read once per runner."""
        if self.on_gpu and self.weights is None:
            self.weights = (self.adapter.weight_bytes(self.server.model),)
        return self.weights[0] if self.weights else None

    def _log_series(self, spec: RunSpec, offset: int, result: RunResult) -> None:
        """`metrics.log_patterns` over the log lines this run produced; never fails the run it observes."""
        try:
            if self.engine is not None and self.engine.alive:
                wait_quiet(self.log_path)
            lines, _ = follow_log(self.log_path, offset)
            notes = apply_log_patterns(spec.log_patterns, lines, result)
        except Exception as e:  # a log we cannot read must not turn a FINISHED probe into a failure
            logger.warning("run %d: metrics.log_patterns not applied: %s", spec.job_index, e)
            notes = [f"metrics.log_patterns not applied: {type(e).__name__}: {e}"]
        if notes:
            result.message = "; ".join(filter(None, [result.message, *notes]))

    def _ensure_engine(self) -> None:
        if self.start_error is not None:
            raise self.start_error
        if self.dead_error is not None:
            raise EngineDied(f"{self.dead_error.message}; the group's restart budget is spent",
                             self.dead_error.log_tail)
        if self.engine is None:
            self._start_engine()
        elif not self.engine.alive:
            died = EngineDied(f"engine pid {self.engine.pid} exited with code {self.engine.poll()} between runs",
                              self.engine.log_tail())
            self.engine.stop()
            if self.restarts_left <= 0:
                self.engine, self.dead_error = None, died
                raise died
            self.restarts_left -= 1
            logger.warning("group %s: %s; restarting it", self.group_id, died.message)
            self._start_engine()
        if self.start_error is not None:
            raise self.start_error

    def _explain(self, e: WorkerError) -> WorkerError:
        """A broken request to an engine that has exited (or is exiting) is the engine dying, or its being killed as
        hung (workers.health_watch)."""
        if isinstance(e, EngineStartFailed) or self.engine is None:
            return e
        if self.watch is not None and self.watch.hung and not isinstance(e, EngineHung):
            return EngineHung(f"{self.watch.hung} (the run's request: {e.message})", self.engine.log_tail())
        deadline = time.monotonic() + 2.0
        while self.engine.alive and time.monotonic() < deadline and not isinstance(e, EngineDied):
            time.sleep(0.05)
        if not self.engine.alive and not isinstance(e, EngineDied):
            return EngineDied(f"engine pid {self.engine.pid} exited with code {self.engine.poll()} "
                              f"during the run ({e.message})", self.engine.log_tail())
        return e

    def _tags(self, attempt: int) -> dict[str, str]:
        s = self.server
        return {"server_group": self.group_id, "engine": s.engine.kind.value, "engine_version": s.engine.version,
                "host": self.host, "attempt": str(attempt), **self.node_tags, **self.gpu_tags}

    def _sampler(self) -> GpuSampler | None:
        try:
            return GpuSampler(os.environ.get("CUDA_VISIBLE_DEVICES")).start()
        except Exception as e:  # an NVML error must not fail the run it only observes
            logger.warning("GPU telemetry failed to start for group %s: %s", self.group_id, e)
            return None

    def _gpu_tags(self) -> dict[str, str]:
        try:
            return gpu_identity(os.environ.get("CUDA_VISIBLE_DEVICES"))
        except Exception as e:  # NVML present but unhappy: the run goes on without GPU tags
            logger.warning("no GPU identity for group %s: %s", self.group_id, e)
            return {}


class FollowerRunner:
    """Rank > 0 of a multi-node server: its engine process on this node, started and stopped, never probed."""

    def __init__(self, server: ServerSpec, log_dir: str | os.PathLike, rank: int, *, grace_s: float = 10.0,
                 node_tags: dict[str, str] | None = None):
        self.server = server
        self.rank = rank
        self.node_tags = dict(node_tags or {})
        self.log_path = Path(log_dir) / f"engine-{server.key}-rank{rank}.log"
        self.grace_s = grace_s
        self.engine: EngineProcess | None = None
        self.error: str | None = None
        self.began_at = 0.0

    def start(self, node_rank: NodeRank | None = None) -> EngineInfo:
        if node_rank is None or node_rank.rank != self.rank:
            raise ValueError(f"rank {self.rank} of a multi-node server starts with its NodeRank "
                             f"(rank 0's rendezvous address), got {node_rank}")
        self.began_at = time.time()
        self.engine = EngineProcess.for_server(self.server, self.log_path, grace_s=self.grace_s,
                                               node_rank=node_rank, env=_engine_env(self.node_tags))
        try:
            self.engine.start()
        except EngineStartFailed as e:
            self.error = e.message
            logger.error("group %s rank %d: engine start failed: %s", self.server.key, self.rank, e.message)
        return self.info()

    def stop(self) -> EngineInfo:
        if self.engine is not None:
            self.engine.stop()
        return self.info()

    def info(self) -> EngineInfo:
        e = self.engine
        return EngineInfo(group_id=self.server.key, engine_starts=1 if e else 0, alive=bool(e and e.alive),
                          pid=e.pid if e else None, error=self.error, log_path=str(self.log_path),
                          node=dict(self.node_tags), rank=self.rank, began_at=self.began_at)


def engine_log_path(log_dir: str | os.PathLike, server: ServerSpec) -> Path:
    """Where a group's (rank 0) engine logs, on the node that runs it; the driver reads it after a node loss."""
    return Path(log_dir) / f"engine-{server.key}.log"


def _engine_env(node_tags: dict[str, str]) -> dict[str, str]:
    return {"SPECSWEEP_NODE_ID": node_tags["node_id"]} if "node_id" in node_tags else {}
