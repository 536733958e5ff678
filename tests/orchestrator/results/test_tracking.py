"""Tracker against a real MLflow SQLite store in a temp dir: layout, statuses, batching, resume hashes."""

from __future__ import annotations

import time

import pytest

from orchestrator.config.plan import Plan
from specsweep_common.spec import FailureReason, ProbeKind, RunResult, RunState
from orchestrator.config.param_encoding import flatten, param_value
from orchestrator.results.tracking import Tracker
from tools.testing import tiny_group, tiny_run, tiny_server

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


def _plan(runs, base=None):
    server = runs[0].server
    return Plan(sweep_name="exp", groups=(tiny_group(server, runs),), base_config=base or {"a": {"b": 1}},
                overrides=("context_len=1,2",))


def _result(spec, state=RunState.FINISHED, **kw):
    now = time.time()
    return RunResult(run=spec, state=state, started_at=now - 1, ended_at=now, **kw)


def test_parent_and_children_layout(store, tmp_path):
    server = tiny_server("oracle")
    a, b, c = (tiny_run(server, i, ProbeKind.NOVEL if i else ProbeKind.PREDICTABLE) for i in range(3))
    tracker = Tracker(store, "exp")
    base = {"model": {"name": "tiny", "layers": 4}, "gen_tokens": 8, **{f"k{i}": i for i in range(150)}}
    with tracker.start_parent(_plan([a, b, c], base), work_dir=tmp_path) as parent_id:
        ok = tracker.log_result(_result(a, metrics={"commit_len_mean": 5.0, "prompt_tokens": 64.0},
                                        series={"commit_len": [5.0, 5.0, 4.0]},
                                        artifacts={"continuation.txt": "xyz", "steps.csv": "step\n0\n"},
                                        tags={"engine_start": "1", "attempt": "1"}))
        failed = tracker.log_result(_result(b, RunState.FAILED, reason=FailureReason.ENGINE_DIED, message="died",
                                            artifacts={"engine_log_tail.txt": "Traceback: boom"}))
        killed = tracker.log_result(_result(c, RunState.KILLED, reason=FailureReason.INTERRUPTED))
    client = mlflow.MlflowClient(store)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["specsweep.role"] == "parent"
    assert parent.data.params["cfg.model.name"] == "tiny" and parent.data.params["cfg.k149"] == "149"  # > 100: batched
    assert parent.data.params["overrides"] == "context_len=1,2"
    assert {f.path for f in client.list_artifacts(parent_id)} >= {"config.yaml", "overrides.txt"}
    assert parent.info.artifact_uri.startswith(str(tmp_path / "mlartifacts"))

    run = client.get_run(ok)
    assert run.info.status == "FINISHED" and run.info.run_name == a.name
    assert run.data.tags["mlflow.parentRunId"] == parent_id and run.data.tags["run_hash"] == a.run_hash
    assert run.data.tags["server_group"] == server.key and run.data.tags["engine"] == "reference"
    assert run.data.params["cfg.probe"] == "predictable" and run.data.metrics["commit_len_mean"] == 5.0
    history = client.get_metric_history(ok, "commit_len")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(0, 5.0), (1, 5.0), (2, 4.0)]
    assert {f.path for f in client.list_artifacts(ok)} == {"continuation.txt", "steps.csv"}

    run = client.get_run(failed)
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == "engine_died"
    path = client.download_artifacts(failed, "engine_log_tail.txt", str(tmp_path))
    assert open(path).read() == "Traceback: boom"
    assert client.get_run(killed).info.status == "KILLED"

    assert Tracker(store, "exp").finished_run_hashes() == {a.run_hash}


def test_interrupted_parent_is_killed(store):
    server = tiny_server("none")
    tracker = Tracker(store, "exp")
    with pytest.raises(KeyboardInterrupt):
        with tracker.start_parent(_plan([tiny_run(server, 0)])) as parent_id:
            raise KeyboardInterrupt
    assert mlflow.MlflowClient(store).get_run(parent_id).info.status == "KILLED"


def test_resume_hashes_are_per_experiment(store):
    server = tiny_server("none")
    spec = tiny_run(server, 0)
    t1 = Tracker(store, "one")
    t1.log_result(_result(spec))
    assert t1.finished_run_hashes() == {spec.run_hash}
    assert Tracker(store, "two").finished_run_hashes() == set()


def test_parent_params_are_the_base_config_flattened_to_json_values():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x", "e": None, "f": {}}, leaf=param_value) == {
        "a.b": "1", "a.c": "[1, 2]", "d": "x", "e": "null", "f": "{}"}


def test_experiment_opens_in_runs_view_with_axes_and_a_saved_view(store):
    """MLflow 3's UI: the experiment-kind tag (runs view, not GenAI), the swept keys as `axis.*` tags on each point,
    `sweep.axes` on the parent, and a saved view whose columns are the axes and the answering metrics."""
    import dataclasses
    import json

    from orchestrator.results.ui_view import view_url

    server = tiny_server("ngram")
    runs = [dataclasses.replace(tiny_run(server, i, kind), overrides=(f"context_len={ctx}", f"probe={kind.value}",
                                                                      "+sweep=probe"))
            for i, (ctx, kind) in enumerate([(1024, ProbeKind.PREDICTABLE), (8160, ProbeKind.NOVEL)])]
    tracker = Tracker(store, "exp")
    with tracker.start_parent(_plan(runs)) as parent_id:
        child = tracker.log_result(_result(runs[1], metrics={"commit_len_mean": 2.5}))
    client = mlflow.MlflowClient(store)
    exp = client.get_experiment(tracker.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_run(parent_id).data.tags["sweep.axes"] == "context_len probe"
    tags = client.get_run(child).data.tags
    assert (tags["axis.context_len"], tags["axis.probe"], tags["sweep.axes"]) == ("8160", "novel", "context_len probe")
    assert "axis.sweep" not in tags  # a key with one value is no axis
    view = json.loads(exp.tags["mlflow.sharedViewState.specsweep"])
    assert view["selectedColumns"][1:3] == ["tags.`axis.context_len`", "tags.`axis.probe`"]
    assert "metrics.`commit_len_mean`" in view["selectedColumns"] and "decode_tok_s" in str(view["selectedColumns"])
    assert view_url("http://h:5000/", tracker.experiment_id).endswith(
        f"/#/experiments/{tracker.experiment_id}/runs?viewStateShareKey=specsweep")


def test_axes_come_first_and_the_config_sits_under_one_prefix_that_old_runs_lack(store):
    """A child's params: `axis.<key>` per swept key, the config under `cfg.`, `overrides`; nothing else. Read back
    through the schema they give what a run recorded before the prefix gives; run_hash and point_key are the
    RunSpec's (the prefix is MLflow's layout only)."""
    import dataclasses

    from orchestrator.config.params import RunParams, config_params
    from orchestrator.config.weights_scope import dummy_weights_reason
    from specsweep_common.point_key import point_key

    server = tiny_server("ngram")
    runs = [dataclasses.replace(
        tiny_run(server, i, kind, context_len=ctx), overrides=(f"context_len={ctx}", f"probe={kind.value}"),
        params=(("context_len", str(ctx)), ("probe.kind", kind.value), ("drafter.name", "ngram"),
                ("drafter.is_oracle", "false"), ("model.path", "tiny"), ("page_size", "16")))
        for i, (ctx, kind) in enumerate([(64, ProbeKind.PREDICTABLE), (128, ProbeKind.NOVEL)])]
    tracker = Tracker(store, "exp")
    with tracker.start_parent(_plan(runs)):
        child = tracker.log_result(_result(runs[1], metrics={"commit_len_mean": 2.5}))
    run = mlflow.MlflowClient(store).get_run(child)
    params = run.data.params
    assert sorted(params)[:2] == ["axis.context_len", "axis.probe"]  # first in the run page's params table
    assert (params["axis.context_len"], params["axis.probe"]) == ("128", "novel")
    assert set(params) == {"axis.context_len", "axis.probe", "overrides"} | {f"cfg.{k}" for k, _ in runs[1].params}
    old_layout = dict(runs[1].params)  # as runs were recorded until 2026-12-03
    assert config_params(params) == old_layout and config_params(old_layout) == old_layout
    assert RunParams.read(params) == RunParams.read(old_layout) and RunParams.read(params).drafter == "ngram"
    assert dummy_weights_reason(config_params(params)) == dummy_weights_reason(old_layout) != ""
    tags = run.data.tags
    assert tags["run_hash"] == runs[1].run_hash and tags["point_key"] == point_key(server, runs[1].probe)
    assert tags["mlflow.runType"] == "evaluation"  # the UI opens the parent expanded (ui_view.py)
