"""End to end: a sweep over probe.concurrency = 1, 4 on the reference engine through the real entry point
(`python -m orchestrator +sweep=concurrency`, a subprocess: Hydra launcher, the session's Ray, reference engines, MLflow on
SQLite in a temp cwd); MLflow is read back. Four requests of a run really share the engine's batched steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)

OVERRIDES = ("probe.concurrency=1,4", "drafter=ngram,oracle", "gen_tokens=16", "context_len=128")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, session_ray):
    cwd = tmp_path_factory.mktemp("concurrency")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    # the session's Ray (tests/conftest.py) instead of a Ray of its own; at most as many servers at once as this
    # machine's CPUs, what the sweep's own Ray (cluster.num_cpus unset) would allow
    ray = ("cluster.kind=ray", f"cluster.address={session_ray.address}",
           f"cluster.max_concurrent_servers={os.cpu_count() or 1}")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "+sweep=concurrency", *OVERRIDES, *ray], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=540)
    return cwd, out


def test_concurrency_sweep_records_aggregate_and_per_request_figures(sweep):
    import mlflow

    cwd, out = sweep
    assert out.returncode == 0, out.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{cwd}/mlflow.db")
    df = mlflow.search_runs(experiment_names=["concurrency"])
    children = df[df["tags.specsweep.role"] == "child"]
    assert len(children) == 4 and (children["status"] == "FINISHED").all()
    assert children["tags.server_group"].nunique() == 2  # concurrency is a probe axis: one engine per drafter
    conc = children["params.cfg.probe.concurrency"].astype(int)
    assert sorted(conc) == [1, 1, 4, 4]
    for m in ("throughput_tok_s", "decode_tok_s", "commit_len_mean", "completion_tokens", "batch_size_mean"):
        assert children[f"metrics.{m}"].notna().all(), m
    assert (children["metrics.completion_tokens"] == 16).all()  # per request
    assert (children["metrics.requests"] == conc).all()
    # the engine batched the 4 requests (one step serves several), and ran the single request alone
    assert (children.loc[conc == 4, "metrics.batch_size_mean"] > 1).all()
    assert (children.loc[conc == 1, "metrics.batch_size_mean"] == 1).all()
    oracle = children[children["params.cfg.drafter.is_oracle"].str.lower() == "true"]
    steps = oracle["params.cfg.drafter.num_steps"].astype(int)
    assert (oracle["metrics.commit_len_mean"] == steps + 1).all()  # batching loses no draft
    # aggregate throughput counts every request's tokens: N requests in about the time of a few
    assert (children["metrics.throughput_tok_s"] > 0).all()
    four = children[conc == 4]
    assert (four["metrics.throughput_tok_s"] > four["metrics.decode_tok_s"]).all()


def test_concurrency_sweep_report_plots_throughput_vs_concurrency(sweep):
    from mlflow import MlflowClient

    cwd, out = sweep
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("concurrency")
    parent = client.search_runs([exp.experiment_id], "tags.`specsweep.role` = 'parent'")[0]
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/throughput_vs_concurrency.png" in names
