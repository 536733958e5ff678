"""End to end: `specsweep +tune=stub` as a real subprocess in a temp cwd (real Hydra sweeper, local Ray, stub engine
processes on real ports, MLflow and the Optuna study on SQLite there), then the store read back; then the same
command with a larger budget resumes the study instead of starting over; and an invalid tune starts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *filter(None, [os.environ.get("PYTHONPATH")])])
POINTS = 2  # conf/tune/stub.yaml: batch sizes 1 and 4 at one context


def _tune(cwd: Path, *overrides: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", "PYTHONPATH": PYTHONPATH}
    return subprocess.run([sys.executable, "-m", "orchestrator", "+tune=stub", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _store(cwd: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{cwd}/mlflow.db")
    df = mlflow.search_runs(experiment_names=["tune-stub-stub"])
    role = df["tags.specsweep.role"]
    return df[role == "tune"], df[role == "parent"], df[role == "child"]


def _study(cwd: Path):
    import optuna

    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{cwd}/optuna.db")
    return optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{cwd}/optuna.db")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("tune")
    return cwd, _tune(cwd, "hydra.sweeper.tune.trials=3")


def test_tune_measures_its_budget_confirms_the_leaders_and_records_the_answer(tuned):
    cwd, out = tuned
    assert out.returncode == 0, out.stderr[-4000:]
    tune, rounds, children = _store(cwd)
    assert len(tune) == 1 and tune.iloc[0]["status"] == "FINISHED"
    run_id = tune.iloc[0]["run_id"]
    assert (rounds["tags.mlflow.parentRunId"] == run_id).all() and len(rounds) >= 2  # search round(s) + leaders
    assert (children["status"] == "FINISHED").all()
    assert children["tags.run_hash"].nunique() == len(children)  # no point measured twice
    study = _study(cwd)
    measured = [t for t in study.trials if t.user_attrs.get("measured")]
    assert len(measured) == 3 and all(len(t.values) == POINTS for t in measured)
    # search runs: 3 configurations x 2 points; leaders: repeats=3 runs, one per (leader, point)
    search = children[children["params.cfg.probe.repeats"] == "1"]
    leaders = children[children["params.cfg.probe.repeats"] == "3"]
    assert len(search) == 3 * POINTS and 1 <= len(leaders) <= POINTS * 3
    # the answer: one row per batch size, on the tune's run and in the log
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    answer = Path(client.download_artifacts(run_id, "tune/answer.md", str(cwd))).read_text()
    rows = [ln for ln in answer.splitlines() if ln.startswith("| 64 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "4"]
    assert "tune/load_curves_ctx64.png" in [a.path for a in client.list_artifacts(run_id, "tune")]
    assert "the answer per batch size" in out.stderr + out.stdout
    # the stub commits num_steps + 1 whatever the text: a winner that speculates beats no speculation
    assert tune.iloc[0]["metrics.winner_tok_s.ctx64.bs1"] > 0


def test_the_same_command_with_a_larger_budget_resumes_the_study(tuned):
    cwd, first = tuned
    assert first.returncode == 0
    _, _, before = _store(cwd)
    out = _tune(cwd, "hydra.sweeper.tune.trials=4")
    assert out.returncode == 0, out.stderr[-4000:]
    tune, _, after = _store(cwd)
    assert len(tune) == 1  # the same tune run, resumed
    measured = [t for t in _study(cwd).trials if t.user_attrs.get("measured")]
    assert len(measured) == 4
    new_search = set(after[after["params.cfg.probe.repeats"] == "1"]["tags.run_hash"]) - \
        set(before[before["params.cfg.probe.repeats"] == "1"]["tags.run_hash"])
    assert len(new_search) == POINTS  # one new configuration, the first three not run again
    assert after["tags.run_hash"].nunique() == len(after)


def test_an_invalid_tune_names_the_key_and_starts_nothing(tmp_path):
    out = _tune(tmp_path, "hydra.sweeper.tune.space={page_size:[0,16]}", timeout=120)
    assert out.returncode == 1
    assert "hydra.sweeper.tune.space.page_size=0" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "optuna.db").exists()
    out = _tune(tmp_path, "page_size=1,16", timeout=120)
    assert out.returncode == 1 and "page_size" in out.stderr and "hydra.sweeper.tune.space" in out.stderr
