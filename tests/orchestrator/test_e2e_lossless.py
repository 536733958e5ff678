"""End to end, the lossless check (diagnosis rule (f)) on the reference engine: a sweep of drafter=none,oracle on
SmolLM2-135M (real weights, real engine processes, the session's Ray, MLflow on SQLite in a temp cwd) through the real
entry point; then the same sweep with the engine's test fault (`SPECSWEEP_TEST_FAULT_REPEAT_BONUS`: each verify step
commits a wrong bonus token while its acceptance counts stay those of a working engine). The healthy pipeline passes
the check with equal ids; the broken one keeps a perfect oracle commit length and is caught by the text alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specsweep_common.greedy_output import OUTPUT_IDS_ARTIFACT, GreedyOutput
from workers.reference.speculative import ENV_FAULT_REPEAT_BONUS

pytestmark = pytest.mark.timeout(600)

OVERRIDES = ("model=smollm2-135m", "drafter=none,oracle", "probe=predictable", "context_len=128", "gen_tokens=24",
             "progress=false")


def _sweep(cwd: Path, name: str, session_ray, *extra: str):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    ray = ("cluster.kind=ray", f"cluster.address={session_ray.address}",
           f"cluster.max_concurrent_servers={os.cpu_count() or 1}")
    out = subprocess.run([sys.executable, "-m", "orchestrator", "--multirun", *OVERRIDES, f"sweep_name={name}",
                          *ray, *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("specsweep.role") == "parent")
    children = {r.data.params["cfg.drafter.name"]: r for r in runs if r.data.tags.get("specsweep.role") == "child"}
    dl = cwd / f"dl-{name}"
    diagnosis = Path(client.download_artifacts(parent.info.run_id, "diagnosis.md", str(dl))).read_text()
    outputs = {d: GreedyOutput.from_json(Path(client.download_artifacts(r.info.run_id, OUTPUT_IDS_ARTIFACT,
                                                                         str(dl / d))).read_text())
               for d, r in children.items()}
    return children, outputs, diagnosis


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, session_ray):
    cwd = tmp_path_factory.mktemp("lossless")
    return (_sweep(cwd, "lossless", session_ray),
            _sweep(cwd, "lossless-fault", session_ray, f"+engine.env.{ENV_FAULT_REPEAT_BONUS}=1"))


def test_a_working_pipeline_produces_the_none_runs_tokens_and_passes(sweeps):
    children, outputs, diagnosis = sweeps[0]
    assert set(children) == {"none", "oracle"} and all(r.info.status == "FINISHED" for r in children.values())
    assert children["none"].data.tags["lossless_key"] == children["oracle"].data.tags["lossless_key"]
    assert len(outputs["none"].output_ids) == 24 and len(outputs["none"].top2) == 24 and outputs["oracle"].top2 == ()
    assert outputs["oracle"].output_ids == outputs["none"].output_ids
    assert "(f) speculative text equals the text without speculation (lossless check): 1 of 1 speculative run(s) " \
           "at temperature 0 produce the drafter=none run's tokens" in diagnosis
    assert "## pipeline bug" not in diagnosis


def test_a_broken_pipeline_under_healthy_counters_is_a_pipeline_bug(sweeps):
    children, outputs, diagnosis = sweeps[1]
    oracle = children["oracle"].data.metrics
    assert oracle["commit_len_mean"] == 5.0  # the counters look perfect: rule (a) cannot see it
    k = outputs["oracle"].first_divergence(outputs["none"])
    assert k is not None and k <= 5  # the first verify step's bonus token
    assert "(a) oracle commits num_steps + 1: 1 of 1 oracle run(s)" in diagnosis
    assert "## pipeline bug" in diagnosis and "changed the text" in diagnosis
    assert f"first divergence at output position {k}: token {outputs['oracle'].output_ids[k]} with speculation, " \
           f"{outputs['none'].output_ids[k]} without" in diagnosis
