"""`KernelRunner`: the JobRunner of a kernel-job group (`job=kernel`): no engine; each RunSpec is one
verify-kernel shape, measured in a subprocess (workers.kernel_job) on the GPU(s) Ray gave the actor, or through
the Triton interpreter on cpu. A kernel shape the kernel refuses, a timeout or a non-finite output is a FAILED run,
never an exception."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from specsweep_common.spec import FailureReason, JobKind, RunResult, RunSpec, RunState, ServerSpec
from workers.adapter import NodeRank
from workers.runners import EngineInfo

logger = logging.getLogger(__name__)

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
