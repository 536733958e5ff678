"""The Recorder (orchestrator/execution/recording.py) as a unit, against a real MLflow SQLite store in tmp_path and
no Ray: results that arrive before MLflow is set up are held and recorded once it is, a sweep that fails before its
actors were submitted leaves no trace in the store, a duplicate result is dropped, a failed attempt is recorded but
is no result of the sweep, and closing releases the claims that never got a result."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest

from orchestrator.config.plan import Plan
from orchestrator.config.settings import ExecutionSettings, TrackingSettings
from orchestrator.execution.progress import SweepProgress
from orchestrator.execution.recording import Recorder, close_tracking, open_tracker
from orchestrator.execution.stats import ExecutionStats
from orchestrator.results.store_layout import PARENT_TAG, ROLE_CHILD, ROLE_TAG, RUN_HASH_TAG
from specsweep_common.spec import FailureReason, ProbeKind, RunResult, RunState
from tools.testing import tiny_group, tiny_run, tiny_server

mlflow = pytest.importorskip("mlflow")


def _settings(tmp_path) -> ExecutionSettings:
    return ExecutionSettings(sweep_name="rec", work_dir=str(tmp_path), progress=False,
                             tracking=TrackingSettings(uri=f"sqlite:///{tmp_path}/mlflow.db"))


def _plan(n: int = 2) -> Plan:
    server = tiny_server("oracle")
    runs = [tiny_run(server, i, ProbeKind.NOVEL if i % 2 else ProbeKind.PREDICTABLE) for i in range(n)]
    return Plan(sweep_name="rec", groups=(tiny_group(server, runs),), base_config={"gen_tokens": 8},
                overrides=("probe=predictable,novel",))


def _result(spec, state=RunState.FINISHED, **kw) -> RunResult:
    now = time.time()
    metrics = {"commit_len_mean": 5.0, "decode_tok_s": 100.0 + spec.job_index} if state is RunState.FINISHED else {}
    return RunResult(run=spec, state=state, started_at=now - 1, ended_at=now, metrics=metrics, **kw)


def _recorder(tmp_path, plan: Plan, *, track: bool = True, tracker=None, on_result=None) -> Recorder:
    return Recorder(plan, _settings(tmp_path), ExecutionStats(), SweepProgress(plan.num_runs, enabled=False),
                    on_result, track=track, tracker=tracker, multirun_yaml=None, ray_up=False)


def _children(client, parent_id: str) -> list:
    exp = client.get_run(parent_id).info.experiment_id
    return client.search_runs([exp], f"tags.`{PARENT_TAG}` = '{parent_id}'")


def test_results_before_mlflow_is_ready_are_recorded_once_it_is(tmp_path):
    plan = _plan(2)
    seen: list[RunResult] = []
    rec = _recorder(tmp_path, plan, on_result=seen.append)
    for spec in plan.runs:
        rec.emit(_result(spec))
    assert rec.tracker is None and len(rec.backlog) == 2  # the set-up waits for the actors' submission
    assert [r.run.job_index for r in seen] == [0, 1]  # the caller hears of each result at once
    with rec.outcome():
        rec.start_tracking(shield=contextlib.nullcontext)
    assert rec.tracker is not None and rec.backlog == [] and rec.stats.parent_run_id
    report = rec.close()
    assert report is not None and rec.status is RunState.FINISHED

    client = mlflow.MlflowClient(_settings(tmp_path).tracking_uri)
    parent = client.get_run(rec.stats.parent_run_id)
    assert parent.info.status == "FINISHED"
    children = _children(client, parent.info.run_id)
    assert sorted(c.data.tags[RUN_HASH_TAG] for c in children) == sorted(r.run_hash for r in plan.runs)
    assert all(c.info.status == "FINISHED" and c.data.tags[ROLE_TAG] == ROLE_CHILD for c in children)
    assert sorted(c.data.metrics["decode_tok_s"] for c in children) == [100.0, 101.0]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"report"}
    assert [r.run.job_index for r in rec.in_job_order()] == [0, 1]


def test_a_sweep_that_fails_before_its_actors_were_submitted_leaves_no_trace(tmp_path):
    plan = _plan(1)
    rec = _recorder(tmp_path, plan)
    with pytest.raises(RuntimeError, match="cannot fit"), rec.outcome():
        raise RuntimeError("the cluster cannot fit the server")
    assert rec.close() is None and rec.status is RunState.FAILED and rec.tracker is None
    client = mlflow.MlflowClient(_settings(tmp_path).tracking_uri)
    assert client.get_experiment_by_name("rec") is None  # the set-up never began: no experiment, no parent


def test_an_interrupt_ends_the_sweep_killed(tmp_path):
    rec = _recorder(tmp_path, _plan(1), track=False)
    with pytest.raises(KeyboardInterrupt), rec.outcome():
        raise KeyboardInterrupt
    assert rec.status is RunState.KILLED and rec.close() is None


def test_a_duplicate_result_is_dropped_and_logged(tmp_path, caplog):
    plan = _plan(1)
    seen: list[RunResult] = []
    rec = _recorder(tmp_path, plan, track=False, on_result=seen.append)
    first = _result(plan.runs[0])
    rec.emit(first)
    with caplog.at_level(logging.ERROR, logger="orchestrator.execution.recording"):
        rec.emit(_result(plan.runs[0], RunState.FAILED, reason=FailureReason.WORKER_ERROR))
    assert rec.results == {0: first} and seen == [first] and rec.progress.done == 1
    assert "duplicate result for job 0 ignored" in caplog.text


def test_with_the_launchers_tracker_each_result_is_recorded_as_it_comes(tmp_path):
    plan = _plan(2)
    settings, stats = _settings(tmp_path), ExecutionStats()
    tracker = open_tracker(plan, settings, None, stats)  # what the launcher set up: parent begun, runs claimed
    assert tracker is not None
    tracker.claim(plan.runs)
    rec = _recorder(tmp_path, plan, tracker=tracker)
    assert rec.setup is None and rec.stats.parent_run_id == tracker.parent_run_id

    lost = _result(plan.runs[0], RunState.FAILED, reason=FailureReason.NODE_LOST, tags={"retried": "true"})
    rec.note_attempt(lost)  # re-queued: recorded, not a result
    rec.emit(_result(plan.runs[0]))
    assert rec.stats.attempts_retried == 1 and list(rec.results) == [0] and rec.report_job is None
    rec.close()  # run 1 never got a result: its claim is closed FAILED

    client = mlflow.MlflowClient(settings.tracking_uri)
    by_hash: dict[str, list] = {}
    for c in _children(client, tracker.parent_run_id):
        by_hash.setdefault(c.data.tags[RUN_HASH_TAG], []).append(c)
    first, second = plan.runs
    assert sorted(c.info.status for c in by_hash[first.run_hash]) == ["FAILED", "FINISHED"]
    assert [c.info.status for c in by_hash[second.run_hash]] == ["FAILED"]
    assert by_hash[second.run_hash][0].data.tags["failure_reason"] == FailureReason.WORKER_ERROR.value
    assert client.get_run(tracker.parent_run_id).info.status == "FINISHED"


def test_close_tracking_without_a_tracker_has_nothing_to_close():
    assert close_tracking(None, RunState.FINISHED, [], ExecutionStats()) is True
