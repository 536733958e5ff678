"""Kernel jobs end to end: `python -m orchestrator +sweep=verify_kernel` with the small CPU grid as a real
subprocess in a temp cwd (Hydra grid -> our launcher -> typed `job: kernel` configs -> validation -> one group ->
local Ray -> `python -m workers.kernel_job --one` per shape through the Triton interpreter), then MLflow is read
back: one FINISHED child per shape with the kernel metrics, the report's kernel table on the parent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.jobs import expand_grid, plan_jobs
from specsweep_common.spec import JobKind
from orchestrator.config.config_error import ConfigError

CPU_GRID = ("engine.device=cpu", "kernel.layout=gqa-small", "kernel.dtype=float32", "kernel.prefix=33,300",
            "kernel.tokens=1,8", "page_size=16")
SHAPES = 4


def _env() -> dict[str, str]:
    # RAY_ADDRESS=local: a fresh embedded Ray even while another process's `ray start` cluster runs on this host
    # (a bare ray.init() would join that one)
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": "local"}


def _cpu_jobs(**axes) -> list[list[str]]:
    base = {"kernel.prefix": [33, 300], "kernel.tokens": [1, 8]} | axes
    return expand_grid(base, "job=kernel", "engine.device=cpu", "kernel.layout=gqa-small", "kernel.dtype=float32")


def test_kernel_plan_is_one_group_with_shape_hashes(tmp_path):
    plan, settings = plan_jobs(_cpu_jobs(), cwd=str(tmp_path))
    assert len(plan.groups) == 1 and plan.num_runs == SHAPES  # one device: one actor, the shapes in turn
    (group,) = plan.groups
    assert group.server.job is JobKind.KERNEL
    assert {r.kernel.prefix for r in group.runs} == {33, 300}
    assert len({r.run_hash for r in group.runs}) == SHAPES
    again, _ = plan_jobs(_cpu_jobs(), cwd=str(tmp_path))  # the hash is the shape's, stable across plans
    assert [r.run_hash for r in again.runs] == [r.run_hash for r in plan.runs]
    assert plan.runs[0].name == "layout=gqa-small prefix=33 T=1 page=16 dtype=float32"


def test_bf16_on_cpu_is_refused_with_key_value_allowed(tmp_path):
    jobs = expand_grid({"kernel.prefix": [33]}, "job=kernel", "engine.device=cpu", "kernel.layout=gqa-small",
                       "kernel.dtype=bfloat16")
    with pytest.raises(ConfigError) as e:
        plan_jobs(jobs, cwd=str(tmp_path))
    (p,) = e.value.problems
    assert (p.key, p.value) == ("kernel.dtype", "bfloat16") and "float32" in p.allowed


def test_bad_kernel_shape_is_refused(tmp_path):
    jobs = expand_grid({"kernel.layout": ["nope", "gqa"]}, "job=kernel", "engine.device=cuda",
                       "kernel.num_kv_heads=3")
    with pytest.raises(ConfigError) as e:
        plan_jobs(jobs, cwd=str(tmp_path))
    keys = {(p.key, p.value) for p in e.value.problems}
    assert ("kernel.layout", "nope") in keys and ("kernel.num_kv_heads", 3) in keys


def test_kernel_sweep_through_the_orchestrator(tmp_path):
    out = subprocess.run([sys.executable, "-m", "orchestrator", "+sweep=verify_kernel", *CPU_GRID], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("verify_kernel")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("specsweep.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("specsweep.role") == "child"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == SHAPES
    assert len({r.data.tags["run_hash"] for r in children}) == SHAPES
    for run in children:
        assert run.info.status == "FINISHED", run.data.tags.get("message")
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.data.tags["job"] == "kernel" and run.data.tags["device"] == "cpu (triton interpreter)"
        assert run.data.tags["kernel"] == "triton"  # the Gluon MLA kernel runs on sm_90 GPUs only
        m = run.data.metrics
        assert m["time_us"] > 0 and m["gbs"] > 0 and m["kv_bytes"] > 0
        assert m["rel_err"] < 1e-3  # fp32 through the interpreter
        assert "floor_frac" not in m  # no measured ceiling on CPU
        assert run.data.params["cfg.kernel.layout"] == "gqa-small" and run.data.params["cfg.job"] == "kernel"
    names = sorted(r.info.run_name for r in children)
    assert names[0] == "layout=gqa-small prefix=300 T=1 page=16 dtype=float32"
    # the report ran on kernel children: a kernel table, no engine diagnosis
    diag = Path(client.download_artifacts(parents[0].info.run_id, "diagnosis.md", str(tmp_path))).read_text()
    assert "## Kernel runs" in diag and "rel_err" in diag and "oracle" not in diag.lower()
    # the final table on the console shows the kernel's columns, not the engine's
    header = next(line for line in out.stderr.splitlines() if "state" in line and "reason" in line)
    assert all(col in header for col in ("time_us", "gbs", "floor_frac", "rel_err")), header
    assert "commit_len_mean" not in header and "decode_tok_s" not in header
    # resume: the same command again skips every shape
    again = subprocess.run([sys.executable, "-m", "orchestrator", "+sweep=verify_kernel", *CPU_GRID], cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len([r for r in client.search_runs([exp.experiment_id])
                if r.data.tags.get("specsweep.role") == "child"]) == SHAPES
