"""`python -m orchestrator engine=sglang_cpu ...` as a user runs it: a real subprocess in a temp cwd, local Ray, a
live SGLang server, MLflow on SQLite there; then, on a host without AMX, a speculative point refused before any
work (nothing started, no store written)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workers.sglang.cpu import host_has_amx

SWEEP = ("engine=sglang_cpu", "attention=torch_native", "drafter=none", "page_size=1", "sweep_name=sglang-cpu",
         "hydra.mode=MULTIRUN", "probe=predictable,novel", "context_len=512", "gen_tokens=16", "cluster.num_cpus=2")


def _run(cwd: Path, *overrides: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "orchestrator", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_sweep_on_live_sglang_records_every_point(manifest, tmp_path):
    out = _run(tmp_path, *SWEEP)
    assert out.returncode == 0, out.stderr[-4000:]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    df = mlflow.search_runs(experiment_names=["sglang-cpu"])
    parents, children = df[df["tags.specsweep.role"] == "parent"], df[df["tags.specsweep.role"] == "child"]
    assert len(parents) == 1 and parents.iloc[0]["status"] == "FINISHED"
    assert len(children) == 2 and (children["status"] == "FINISHED").all()
    assert (children["metrics.prompt_tokens"] == 512).all() and (children["metrics.completion_tokens"] == 16).all()
    assert (children["metrics.decode_tok_s"] > 0).all()
    assert (children["tags.sglang.attention_backend"] == "torch_native").all()
    assert children["tags.engine_pid"].nunique() == 1  # one server for both points


def test_speculative_point_is_refused_before_work_without_amx(manifest, tmp_path):
    if host_has_amx():  # on an AMX host the point is valid: its plan is printed, nothing refused
        out = _run(tmp_path, "engine=sglang_cpu", "attention=intel_amx", "drafter=ngram", "page_size=1",
                   "hydra.launcher.dry_run=true")
        assert out.returncode == 0, out.stderr[-3000:]
        return
    out = _run(tmp_path, "engine=sglang_cpu", "attention=torch_native", "drafter=ngram", "page_size=1", timeout=300)
    assert out.returncode != 0
    assert "drafter.algorithm='NGRAM'" in out.stderr + out.stdout and "AMX" in out.stderr + out.stdout
    assert not (tmp_path / "mlflow.db").exists()
