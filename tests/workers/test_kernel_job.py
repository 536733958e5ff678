"""workers/kernel_job.py: one shape through the Triton interpreter in its own process (`--one`), and the standalone
command line mapped onto the orchestrator's sweep (the sweep itself: tests/orchestrator/test_kernel_sweep.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from specsweep_common.spec import KernelSpec
from workers.kernel_job import CPU_OVERRIDES, standalone_argv

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (interpreter); GPU: the H200 run")

SHAPE = KernelSpec(layout="gqa-small", num_q_heads=8, num_kv_heads=2, head_dim=32, v_head_dim=32, mla=False,
                   prefix=70, tokens=4, page_size=16, dtype="float32", device="cpu")


def _one(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env_extra
    return subprocess.run([sys.executable, "-m", "workers.kernel_job", "--one", SHAPE.to_json()], env=env,
                          capture_output=True, text=True, timeout=120)


def test_one_shape_prints_metrics():
    out = _one({"TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    m = answer["metrics"]
    assert m["time_us"] > 0 and m["gbs"] > 0 and m["rel_err"] < 1e-3
    assert answer["device"] == "cpu (triton interpreter)"


def test_one_shape_on_cpu_needs_the_interpreter():
    out = _one({})
    assert out.returncode != 0 and "TRITON_INTERPRET=1" in out.stderr


def test_spec_json_round_trip():
    assert KernelSpec.from_json(SHAPE.to_json()) == SHAPE


def test_standalone_maps_onto_the_orchestrator_sweep():
    cmd = standalone_argv(["conf/sweep/verify_kernel.yaml", "tracking.uri=sqlite:///x.db"], cuda=False)
    assert cmd[1:4] == ["-m", "orchestrator", "+sweep=verify_kernel"]
    assert list(CPU_OVERRIDES) == cmd[4:4 + len(CPU_OVERRIDES)] and cmd[-1] == "tracking.uri=sqlite:///x.db"
    assert standalone_argv([], cuda=True)[3:] == ["+sweep=verify_kernel"]
