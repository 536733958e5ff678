"""KernelRunner (`job=kernel`): each RunSpec is one verify-kernel shape measured in its own `workers.kernel_job`
subprocess (here through the Triton interpreter); a shape past its time limit is a FAILED run with the subprocess'
log tail, never an exception."""

from __future__ import annotations

import dataclasses

from orchestrator.config.jobs import expand_grid, plan_jobs
from specsweep_common.spec import FailureReason, RunState
from workers.kernel_runner import KERNEL_LOG_ARTIFACT, KernelRunner
from workers.runners import JobRunner


def _group(tmp_path):
    jobs = expand_grid({"kernel.prefix": [33]}, "job=kernel", "engine.device=cpu", "kernel.layout=gqa-small",
                       "kernel.dtype=float32", "kernel.tokens=2", "page_size=16")
    plan, _ = plan_jobs(jobs, cwd=str(tmp_path))
    (group,) = plan.groups
    return group


def test_a_shape_runs_in_its_own_process_and_returns_its_metrics(tmp_path):
    group = _group(tmp_path)
    runner = KernelRunner(group.server, tmp_path, node_tags={"node_id": "n1"})
    assert isinstance(runner, JobRunner)
    info = runner.start()
    assert info.engine_starts == 0 and info.alive  # no engine: nothing to start
    (spec,) = group.runs
    r = runner.run(spec)
    assert r.state is RunState.FINISHED, r.message
    assert r.metrics["time_us"] > 0 and r.metrics["gbs"] > 0 and r.metrics["rel_err"] < 1e-3
    assert r.tags["job"] == "kernel" and r.tags["node_id"] == "n1" and r.tags["device"] == "cpu (triton interpreter)"
    assert r.engine_time_s > 0 and r.ended_at >= r.started_at
    assert f"== run {spec.job_index} {spec.name}" in runner.log_path.read_text()


def test_a_shape_past_its_time_limit_is_a_failed_run_not_an_exception(tmp_path):
    group = _group(tmp_path)
    server = dataclasses.replace(group.server, engine=dataclasses.replace(group.server.engine, request_timeout_s=0.05))
    r = KernelRunner(server, tmp_path).run(group.runs[0])
    assert r.state is RunState.FAILED and r.reason is FailureReason.TIMEOUT
    assert "engine.request_timeout_s=0.05" in r.message and r.tags["failure_reason"] == "timeout"
    assert KERNEL_LOG_ARTIFACT in r.artifacts
