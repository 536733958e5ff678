"""A tiny verify-kernel sweep end to end on CPU (Triton interpreter): one MLflow child run per shape with
time_us, gbs and rel_err, under one parent run."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from workers.kernel_job import expand_grid, run_kernel_sweep

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (interpreter); GPU: the H200 run")

TINY = {"job": "kernel", "sweep_name": "verify_kernel_test", "cpu_dtype": "float32",
        "grid": {"layout": ["gqa-small"], "prefix": [33, 70], "tokens": [1, 4], "page_size": [1, 16]}}


def test_repo_sweep_file_expands():
    conf = yaml.safe_load(Path("conf/sweep/verify_kernel.yaml").read_text())
    assert conf["job"] == "kernel"
    assert len(expand_grid(conf["grid"])) == 2 * 3 * 4 * 2
    assert len(expand_grid(conf["cpu_grid"])) == 8


def test_engine_conf_is_refused():
    with pytest.raises(ValueError, match="not a kernel job"):
        run_kernel_sweep({"job": "engine", "grid": {}})


def test_tiny_kernel_sweep_lands_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    results = run_kernel_sweep(TINY, Tracker(uri, "verify_kernel_test"))
    assert [r["state"] for r in results] == ["FINISHED"] * 8
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("verify_kernel_test")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("specsweep.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("specsweep.role") == "child"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 8
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        m = run.data.metrics
        assert m["time_us"] > 0 and m["gbs"] > 0
        assert m["rel_err"] < 1e-3  # fp32 through the interpreter (tl.dot in fp32)
        assert "floor_frac" not in m  # no measured ceiling on CPU
    names = sorted(r.info.run_name for r in children)
    assert names[0] == "layout=gqa-small prefix=33 T=1 page=1"
    assert {r.data.params["page_size"] for r in children} == {"1", "16"}
