"""The runners: one server group on one node, its RunSpecs run in order. Plain Python (no Ray): the Ray actors
(`orchestrator.execution.actors`) are thin shells around them, and tests drive them directly.

    runner: JobRunner = make_runner(server, log_dir, restarts=1, node_tags={"node_id": ..., "gpu_ids": ...})
    runner.start(node_rank=None) -> EngineInfo   # never raises: a start failure is remembered
    runner.run(spec: RunSpec, attempt=1) -> RunResult   # never raises: failures are data
    runner.stop() -> EngineInfo

`Runner` is the Protocol every runner satisfies (start, stop, info); `JobRunner` adds run(). `GroupRunner` (an
engine: start it, probe it per RunSpec, stop it) and `KernelRunner` (`job=kernel`: one verify-kernel shape per
RunSpec, no engine) are JobRunners. `FollowerRunner` holds rank > 0 of a multi-node engine: a Runner started
with its NodeRank (rank 0's rendezvous address), stopped, never given a RunSpec.

Failure policy, per run:
- the engine could not start (exit, timeout): every run of the group FAILED `engine_start_failed`, log tail;
- the engine died during a run: that run FAILED `engine_died`, log tail; the next run restarts the engine
  (at most `restarts` times per group; after that the remaining runs are FAILED `engine_died`);
- an HTTP timeout: `timeout`; a response without the fields we need: `bad_response`.

Multi-node servers: the driver gives rank 0's runner `node_rank=NodeRank(0, n, addr)` (its engine serves HTTP
and is probed) and starts ranks 1..n-1 with `FollowerRunner` (no HTTP, no probes). A multi-node engine is
never restarted in place (the other ranks would need restarting too): it is given `restarts=0`.

Each result's tags carry `engine_start` (which start of this group's engine served it, 1-based) and
`engine_pid`, so a sweep can be checked for exactly one start per ServerSpec.

SGLang: once per engine start the runner reads `/server_info` (the resolved server args): every run of that engine
gets them as `sglang.<key>` tags (backends for prefill/decode/verify, num_steps, topk, draft tokens, ...), and a
note in its message (tag `sglang.changed`) where SGLang runs something other than the config asked
(`workers.sglang.server_arg_changes`, e.g. NGRAM's num_steps). Around each probe it scrapes `/metrics` and, after it,
records `engine_accept_length_metrics` (Prometheus counter deltas), a cross-check of `engine_accept_length` from
meta_info. A failure to read them is a note, never a failed run. `/server_info`'s avg_spec_accept_length is not
recorded: SGLang reports it over complete 40-iteration windows only (workers.sglang_metrics says why).
With `attention=specsweep_verify` it also reads the plugin's dispatch counters from `/metrics` before and after each
run (`workers.plugin_counters`): `plugin_kernel_calls`, `plugin_fallback_calls` and the fallbacks by reason.

Both real engines (SGLang and the reference engine; not the stub): `/metrics` is scraped before each run's flush and
after its last answer, and `verify_step_ms` is Δ target-verify forward seconds ÷ Δ sglang:spec_verify_calls_total
(`workers.engine_counters`: the same counters and formula on both); once per engine start `/server_info` gives the
metrics `max_req_input_len` and `max_total_num_tokens` (SGLang's scheduler limits) of every run of that engine.

GPU engines (SGLang, or the reference engine on cuda): each run is sampled with `workers.telemetry.GpuSampler`
over CUDA_VISIBLE_DEVICES (set by Ray from the actor's GPUs): `gpu_*` metrics and series, GPU name and compute
capability tags.

`metrics.log_patterns` (RunSpec.log_patterns): the engine log lines a run produced (from just before its cache
flush until the log has been quiet for LOG_SETTLE_S after the probe, at most LOG_SETTLE_MAX_S) are fed to
`workers.sglang_metrics.LogPatterns`; each named group becomes a series (MLflow metric, step = match index), renamed
`log_<name>` where the probe already recorded that name. A pattern that matched nothing, or a group that captured
something that is not a number, is a note in the run's message.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from specsweep_vocab.spec import Algorithm, EngineKind, FailureReason, JobKind, RunResult, RunSpec, RunState, ServerSpec
from specsweep_vocab.sglang_facts import SGLANG_VERSIONS
from workers.engine import EngineProcess, NodeRank
from workers.derived import derived_metrics
from workers.engine_counters import Scrape, parse_scrape, read_limits, verify_timing
from workers.errors import BadResponse, EngineDied, EngineStartFailed, ProbeTimeout, WorkerError
from workers.probe import ProbeClient, run_probe
from workers.plugin_counters import read_dispatch, record_dispatch
from workers.sglang import max_draft_depth, reported_server_args, server_arg_changes, server_arg_tags, uses_plugin
from workers.sglang_metrics import LogPatterns, accept_length_from_counters, follow_log
from workers.telemetry import GpuSampler, gpu_identity

logger = logging.getLogger(__name__)

LOG_TAIL_ARTIFACT = "engine_log_tail.txt"
LOG_SETTLE_S = 0.1  # log_patterns: the engine log must be this long without growth after a run ...
LOG_SETTLE_MAX_S = 1.0  # ... waiting at most this long for lines the engine writes after its response
LOG_SERIES_PREFIX = "log_"  # a group named like a series or metric the probe already recorded


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
        self.host = socket.gethostname()
        # GPU engines: NVML telemetry over the GPUs Ray gave this actor (CUDA_VISIBLE_DEVICES)
        self.on_gpu = server.on_gpu
        self.gpu_tags = self._gpu_tags() if self.on_gpu else {}
        self.sglang = server.engine.kind is EngineKind.SGLANG
        self.plugin = self.sglang and uses_plugin(server)  # specsweep_verify: its dispatch counters per run
        self.server_args: SGLangServerArgs | None = None  # /server_info of the engine now running (SGLang)
        # /metrics counters (verify_step_ms) and /server_info limits, the same on both engines (engine_counters)
        self.counted = server.engine.kind in (EngineKind.SGLANG, EngineKind.REFERENCE)
        self.limits: tuple[int | None, dict[str, float]] | None = None  # (engine pid, its limits)

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
        try:
            self._ensure_engine()
            engine = self.engine
            pid = engine.pid if engine is not None else None
            if engine is None or pid is None:
                raise RuntimeError(f"group {self.group_id}: no spawned engine after _ensure_engine()")
            result.tags.update(engine_start=str(self.engine_starts), engine_pid=str(pid))
            args = self._server_args(engine) if self.sglang else None
            limits = self._limits(engine) if self.counted else {}
            before = scrape_metrics(engine.base_url) if self.counted else None
            dispatch_before = read_dispatch(engine.base_url) if self.plugin else None
            if spec.log_patterns:  # the run's own lines: from just before its flush
                log_offset = _file_size(self.log_path)
            sampler = self._sampler() if self.on_gpu else None
            try:
                m = run_probe(engine.base_url, spec.probe, _prompt_kind(self.server.engine.kind),
                              expect_spec=self.server.drafter.algorithm is not Algorithm.NONE,
                              timeout_s=self.server.engine.request_timeout_s, model_path=_prompt_model(self.server),
                              version=self.server.engine.version if self.sglang and self.server.engine.version
                              in SGLANG_VERSIONS else None, max_depth=self._max_depth(args))
            finally:
                samples = sampler.stop() if sampler else None
            after = scrape_metrics(engine.base_url) if before is not None else None
            m.notes += verify_timing(before, after, m.metrics)  # verify_step_ms, both engines
            m.metrics.update(limits)
            if args is not None:
                result.tags.update(args.tags)
                m.notes += args.notes
                m.notes += engine_cross_checks(engine.base_url, before, m.metrics, after=after)
            if self.plugin:
                m.notes += record_dispatch(engine.base_url, dispatch_before, m.metrics)
            result.metrics, result.series, result.engine_time_s = m.metrics, m.series, m.engine_time_s
            result.metrics.update(derived_metrics(result.metrics, self.server.model, on_gpu=self.on_gpu))
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

    def _server_args(self, engine: EngineProcess) -> "SGLangServerArgs":
        if self.server_args is None or self.server_args.pid != engine.pid:
            self.server_args = read_server_args(engine.base_url, self.server, engine.pid)
            for note in self.server_args.notes:
                logger.warning("group %s: %s", self.group_id, note)
        return self.server_args

    def _limits(self, engine: EngineProcess) -> dict[str, float]:
        """max_req_input_len and max_total_num_tokens from /server_info, read once per engine start."""
        if self.limits is None or self.limits[0] != engine.pid:
            self.limits = (engine.pid, read_limits(engine.base_url))
        return self.limits[1]

    def _max_depth(self, args: "SGLangServerArgs | None") -> int | None:
        if args is not None:
            return max_draft_depth(args.reported) if args.reported else None
        d = self.server.drafter
        return d.num_steps if d.algorithm is not Algorithm.NONE and d.num_steps > 0 else None

    def _log_series(self, spec: RunSpec, offset: int, result: RunResult) -> None:
        """`metrics.log_patterns` over the log lines this run produced; never fails the run it observes."""
        try:
            if self.engine is not None and self.engine.alive:
                _wait_quiet(self.log_path)
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
        """A broken request to an engine that has exited (or is exiting) is the engine dying."""
        if isinstance(e, EngineStartFailed) or self.engine is None:
            return e
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


KERNEL_LOG_ARTIFACT = "kernel_log_tail.txt"
REPO_ROOT = Path(__file__).resolve().parent.parent


class KernelRunner:
    """A kernel-job group (`job=kernel`): no engine; each RunSpec is one verify-kernel shape, run in a subprocess
    `python -m workers.kernel_job --one '<KernelSpec json>'` (TRITON_INTERPRET=1 on cpu, set before triton is
    imported), one at a time on the GPU(s) Ray gave this actor. A `JobRunner`; never raises."""

    def __init__(self, server: ServerSpec, log_dir: str | os.PathLike, *, node_tags: dict[str, str] | None = None):
        self.server = server
        self.node_tags = dict(node_tags or {})
        self.group_id = server.key
        self.log_path = Path(log_dir) / f"kernel-{self.group_id}.log"
        self.host = socket.gethostname()
        self.began_at = 0.0
        self.on_gpu = server.engine.device == "cuda"

    def start(self, node_rank: NodeRank | None = None) -> EngineInfo:
        self.began_at = self.began_at or time.time()
        return self.info()

    def stop(self) -> EngineInfo:
        return self.info()

    def info(self) -> EngineInfo:
        return EngineInfo(group_id=self.group_id, engine_starts=0, alive=True, log_path=str(self.log_path),
                          node=dict(self.node_tags), began_at=self.began_at)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(dict(self.server.engine.env))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        if self.server.engine.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        return env

    def run(self, spec: RunSpec, attempt: int = 1) -> RunResult:
        result = RunResult(run=spec, state=RunState.FINISHED, started_at=time.time(),
                           tags={"server_group": self.group_id, "job": JobKind.KERNEL.value, "host": self.host,
                                 "attempt": str(attempt), **self.node_tags})
        assert spec.kernel is not None, "a kernel group holds kernel RunSpecs only"
        cmd = [sys.executable, "-m", "workers.kernel_job", "--one", spec.kernel.to_json()]
        timeout = self.server.engine.request_timeout_s
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, env=self._env(), capture_output=True, text=True, timeout=timeout)
            with open(self.log_path, "a") as log:
                log.write(f"== run {spec.job_index} {spec.name}\n{out.stderr}")
            if out.returncode != 0:
                raise RuntimeError(f"kernel_job exited with code {out.returncode}: "
                                   f"{(out.stderr.strip().splitlines() or [''])[-1][:500]}")
            answer = json.loads(out.stdout.strip().splitlines()[-1])
            metrics = {k: float(v) for k, v in answer["metrics"].items()}
            result.tags["device"] = answer.get("device", "")
            result.tags["kernel"] = answer.get("kernel", "")  # which verify kernel ran: gluon (MLA, sm_90) / triton
            result.metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
            if not math.isfinite(metrics.get("rel_err", math.nan)):
                result.state, result.reason = RunState.FAILED, FailureReason.BAD_RESPONSE
                result.message = f"kernel output is not finite (rel_err={metrics.get('rel_err')})"
        except subprocess.TimeoutExpired as e:
            result.state, result.reason = RunState.FAILED, FailureReason.TIMEOUT
            result.message = f"kernel shape ran past engine.request_timeout_s={timeout:g}"
            tail = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            result.artifacts[KERNEL_LOG_ARTIFACT] = tail[-20000:]
        except Exception as e:  # a shape the kernel refuses is data, not the end of the sweep
            result.state, result.reason = RunState.FAILED, FailureReason.WORKER_ERROR
            result.message = f"{type(e).__name__}: {e}"
            if "out" in locals():
                result.artifacts[KERNEL_LOG_ARTIFACT] = (out.stderr or "")[-20000:]
        result.engine_time_s = time.perf_counter() - t0
        if result.reason:
            result.tags["failure_reason"] = result.reason.value
            logger.warning("kernel run %d (%s) FAILED: %s", spec.job_index, spec.name, result.message)
        result.ended_at = time.time()
        return result


def make_runner(server: ServerSpec, log_dir: str | os.PathLike, *, restarts: int = 1,
                node_tags: dict[str, str] | None = None) -> JobRunner:
    """The runner for a group: an engine (GroupRunner) or kernel shapes (KernelRunner)."""
    if server.job is JobKind.KERNEL:
        return KernelRunner(server, log_dir, node_tags=node_tags)
    return GroupRunner(server, log_dir, restarts=restarts, node_tags=node_tags)


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


@dataclass
class SGLangServerArgs:
    """What one SGLang engine start reported in /server_info."""

    pid: int | None
    reported: dict  # workers.sglang.reported_server_args; {} when /server_info could not be read
    tags: dict[str, str]  # sglang.<key>, sglang.changed
    notes: list[str]  # for each run's message


def read_server_args(base_url: str, server: ServerSpec, pid: int | None = None) -> SGLangServerArgs:
    """/server_info once: the resolved args as tags, and a note per value SGLang changed from the config's."""
    client = ProbeClient(base_url, timeout_s=30.0)
    try:
        info = client.server_info()
    except (BadResponse, ProbeTimeout, ValueError) as e:
        return SGLangServerArgs(pid, {}, {}, [f"/server_info not read: {e}"])
    finally:
        client.close()
    reported = reported_server_args(info)
    changes = server_arg_changes(server, info)
    tags = server_arg_tags(reported)
    if changes:
        tags["sglang.changed"] = "; ".join(changes)
    return SGLangServerArgs(pid, reported, tags, changes)


def scrape_metrics(base_url: str) -> Scrape | None:
    """/metrics samples (summed over labels, and labelled: `engine_counters.Scrape`), or None when they cannot be
    read (the caller then skips what needs them)."""
    client = ProbeClient(base_url, timeout_s=30.0)
    try:
        return parse_scrape(client.metrics_text())
    except (BadResponse, ProbeTimeout, ValueError) as e:
        logger.warning("%s: /metrics not read: %s", base_url, e)
        return None
    finally:
        client.close()


def engine_cross_checks(base_url: str, before: dict[str, float] | None, metrics: dict[str, float],
                        after: dict[str, float] | None = None) -> list[str]:
    """After a probe: engine_accept_length_metrics (/metrics deltas from `before` to `after`, scraped now when not
    given) into `metrics`; notes for what failed."""
    notes = []
    after = after if after is not None else scrape_metrics(base_url)
    value = accept_length_from_counters(before, after) if before is not None and after is not None else None
    if value is not None:
        metrics["engine_accept_length_metrics"] = value
    elif "verify_steps" in metrics:
        notes.append("/metrics gave no accept length for the run (no counters or no verify call)")
    return notes


def apply_log_patterns(patterns: tuple[str, ...] | list[str], lines: list[str], result: RunResult) -> list[str]:
    """Feed one run's engine log lines to `LogPatterns(patterns)` and add each non-empty group series to
    `result.series` (as `log_<name>` where the name is already one of its series or metrics). Returns notes for
    the run's message: patterns that matched no line, groups that captured values that are not numbers."""
    matcher = LogPatterns(patterns).feed_all(lines)
    notes = []
    for i, hits in enumerate(matcher.matches):
        if not hits:
            notes.append(f"metrics.log_patterns[{i}] matched none of the run's {len(lines)} engine log line(s)")
    for name, values in matcher.series.items():
        if values:
            key = LOG_SERIES_PREFIX + name if name in result.series or name in result.metrics else name
            if key != name:
                logger.info("log pattern group %r recorded as %r: the probe already records %r", name, key, name)
            result.series[key] = values
        bad = matcher.not_numbers.get(name)
        if bad:
            notes.append(f"metrics.log_patterns group {name!r} captured {bad[0]} value(s) that are not numbers "
                         f"(e.g. {bad[1]!r}); only numbers become series")
    return notes


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _wait_quiet(path: Path, quiet_s: float = LOG_SETTLE_S, max_s: float = LOG_SETTLE_MAX_S) -> None:
    """Until `path` has not grown for `quiet_s` (lines an engine writes just after answering), at most `max_s`."""
    deadline = time.monotonic() + max_s
    size = _file_size(path)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _file_size(path)
        if now == size:
            return
        size = now


def _prompt_kind(kind: EngineKind) -> EngineKind:
    """The stub engine takes the reference engine's byte-tokenised input_ids (no model tokenizer to load)."""
    return EngineKind.REFERENCE if kind is EngineKind.STUB else kind


def _prompt_model(server) -> str | None:
    """The model whose tokenizer builds the prompt; None for the stub engine (byte ids, no model to load)."""
    return None if server.engine.kind is EngineKind.STUB else server.model.path


def _engine_env(node_tags: dict[str, str]) -> dict[str, str]:
    return {"SPECSWEEP_NODE_ID": node_tags["node_id"]} if "node_id" in node_tags else {}
