"""execute_plan on a real local Ray with the real reference engine: streaming results, one engine start per
server, start failure, an engine killed mid-probe, a worker (actor) killed mid-run, MLflow recording."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest

from orchestrator.config.plan import Plan
from orchestrator.config.settings import ExecutionSettings, TrackingSettings
from specsweep_common.spec import FailureReason, ProbeKind, RunState
from tools.testing import pid_alive, tiny_group, tiny_run, tiny_server, wait_for_request
from workers.runners import LOG_TAIL_ARTIFACT


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray(session_ray):
    """This process as a driver of the session's Ray (tests/conftest.py); yields the pid its engines run below."""
    if ray.is_initialized():  # left over from another module, with other settings
        ray.shutdown()
    ray.init(address=session_ray.address, log_to_driver=False, configure_logging=False)
    yield session_ray.pid
    ray.shutdown()  # disconnects; the session's Ray stays up


def _settings(tmp_path, **kw) -> ExecutionSettings:
    return ExecutionSettings(sweep_name="t", work_dir=str(tmp_path), progress=False,
                             tracking=TrackingSettings(uri=f"sqlite:///{tmp_path}/mlflow.db"), **kw)


def _plan(*groups) -> Plan:
    return Plan(sweep_name="t", groups=tuple(groups), base_config={"gen_tokens": 8}, overrides=("x=1",))


def test_results_stream_back_one_engine_per_server(local_ray, tmp_path):
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    oracle, ngram = tiny_server("oracle", num_steps=3), tiny_server("ngram")
    g1 = tiny_group(oracle, [tiny_run(oracle, 0, gen_tokens=9), tiny_run(oracle, 2, ProbeKind.NOVEL, gen_tokens=9)])
    g2 = tiny_group(ngram, [tiny_run(ngram, 1), tiny_run(ngram, 3, ProbeKind.NOVEL)])
    seen, stats = [], ExecutionStats()
    results = execute_plan(_plan(g1, g2), _settings(tmp_path), on_result=seen.append, track=False, stats=stats)
    assert [r.run.job_index for r in results] == [0, 1, 2, 3] and len(seen) == 4
    assert all(r.state is RunState.FINISHED for r in results), [r.message for r in results]
    assert stats.engine_starts == {oracle.key: 1, ngram.key: 1}
    for r in results:
        assert r.metrics["prompt_tokens"] == 64 and r.metrics["commit_len_mean"] >= 1
        assert r.tags["engine_start"] == "1" and r.tags["server_group"] == r.run.server.key
        assert "continuation.txt" in r.artifacts and "steps.csv" in r.artifacts
    assert results[0].metrics["commit_len_mean"] == 4.0 == results[2].metrics["commit_len_mean"]


def test_start_failure_fails_only_that_group(local_ray, tmp_path):
    from orchestrator.execution.execute import execute_plan

    good = tiny_server("none")
    bad = dataclasses.replace(good, drafter=dataclasses.replace(tiny_server("oracle").drafter,
                                                                 draft_model_path="no-such-model"))
    plan = _plan(tiny_group(bad, [tiny_run(bad, 0), tiny_run(bad, 1)]), tiny_group(good, [tiny_run(good, 2)]))
    results = execute_plan(plan, _settings(tmp_path), track=False)
    assert [r.state for r in results] == [RunState.FAILED, RunState.FAILED, RunState.FINISHED]
    for r in results[:2]:
        assert r.reason is FailureReason.ENGINE_START_FAILED
        assert "no-such-model" in r.artifacts[LOG_TAIL_ARTIFACT]


def test_engine_killed_mid_probe_fails_that_run_and_restarts(local_ray, tmp_path):
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    server = tiny_server("none", server_context_len=8192)
    runs = [tiny_run(server, 10), tiny_run(server, 11, context_len=4000, gen_tokens=2000), tiny_run(server, 12)]
    killed = []

    def killer():
        pid = wait_for_request(local_ray, finished=1)  # run11: the engine's second
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    stats = ExecutionStats()
    results = execute_plan(_plan(tiny_group(server, runs)), _settings(tmp_path), track=False, stats=stats)
    t.join(5)
    assert killed
    first, victim, last = results
    assert first.state is RunState.FINISHED and last.state is RunState.FINISHED
    assert victim.state is RunState.FAILED and victim.reason is FailureReason.ENGINE_DIED, victim.message
    assert "workers.reference" in victim.artifacts[LOG_TAIL_ARTIFACT]
    assert last.tags["engine_start"] == "2" and stats.total_engine_starts == 2


def test_lost_worker_requeues_unfinished_runs(local_ray, tmp_path):
    from orchestrator.execution.execute import execute_plan

    server = tiny_server("none", server_context_len=8192, seed=1)
    runs = [tiny_run(server, 20, context_len=4000, gen_tokens=2000), tiny_run(server, 21)]
    victims = []

    def kill_actor():
        engine_pid = wait_for_request(local_ray, finished=0)  # run20: the engine's first
        with open(f"/proc/{engine_pid}/stat") as f:
            actor_pid = int(f.read().split(")")[-1].split()[1])
        time.sleep(0.2)
        os.kill(actor_pid, signal.SIGKILL)
        victims.append(engine_pid)

    t = threading.Thread(target=kill_actor, daemon=True)
    t.start()
    plan = _plan(tiny_group(server, runs))
    settings = _settings(tmp_path, cluster=dataclasses.replace(_settings(tmp_path).cluster, max_retries=1))
    results = execute_plan(plan, settings, track=False)
    t.join(5)
    assert victims
    deadline = time.monotonic() + 10
    while pid_alive(victims[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(victims[0]), "the engine outlived its killed actor"
    assert [r.state for r in results] == [RunState.FINISHED, RunState.FINISHED], [r.message for r in results]
    assert [r.tags["attempt"] for r in results] == ["2", "2"]


def test_results_are_recorded_in_mlflow(local_ray, tmp_path):
    from mlflow import MlflowClient

    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats
    from orchestrator.results.tracking import Tracker

    server = tiny_server("oracle", num_steps=2)
    plan = _plan(tiny_group(server, [tiny_run(server, 0), tiny_run(server, 1, ProbeKind.NOVEL)]))
    settings = _settings(tmp_path)
    stats = ExecutionStats()
    execute_plan(plan, settings, stats=stats)
    client = MlflowClient(settings.tracking_uri)
    exp = client.get_experiment_by_name("t")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("specsweep.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("specsweep.role") == "child"]
    assert len(parents) == 1 and len(children) == 2 and parents[0].info.run_id == stats.parent_run_id
    assert parents[0].info.status == "FINISHED" and parents[0].data.metrics["engine_starts"] == 1
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    assert all(c.data.metrics["commit_len_mean"] == 3.0 for c in children)
    assert Tracker(settings.tracking_uri, "t").finished_run_hashes() == {r.run_hash for r in plan.runs}
    # the report is written in the background once every run is recorded, and is on the parent all the same
    names = {a.path for a in client.list_artifacts(stats.parent_run_id)}
    assert "diagnosis.md" in names and stats.report_s > 0
    m = stats.marks  # the phases in order; the engine's stop is timed by its worker
    assert m["ray_up"] <= m["submitted"] <= m["tracker_ready"] <= m["runs_recorded"] <= m["loop_done"] <= m["end"]
    assert stats.engine_stop_s[server.key] > 0 and stats.engine_startup_s[server.key] > 0


def test_results_wait_for_a_slow_mlflow_set_up_and_are_handled_in_order(local_ray, tmp_path, monkeypatch):
    """MLflow ready only after the whole group (start, runs, stop) finished: every result is still recorded, and the
    driver handles the actor's calls in the order they ran (start before stop: no server left counted up)."""
    from mlflow import MlflowClient

    from orchestrator.execution import recording
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    real = recording.open_tracker

    def slow(*args, **kw):
        tracker = real(*args, **kw)
        time.sleep(8)  # the tiny engine starts, serves both runs and stops meanwhile
        return tracker

    monkeypatch.setattr(recording, "open_tracker", slow)
    server = tiny_server("none", seed=2)
    plan = _plan(tiny_group(server, [tiny_run(server, 0), tiny_run(server, 1)]))
    stats, settings = ExecutionStats(), _settings(tmp_path)
    seen = []
    results = execute_plan(plan, settings, stats=stats, on_result=seen.append)
    assert [r.state for r in results] == [RunState.FINISHED, RunState.FINISHED]
    assert stats.engine_stop_s[server.key] > 0  # the stop's info, not the start's, was handled last
    client = MlflowClient(settings.tracking_uri)
    children = client.search_runs([client.get_experiment_by_name("t").experiment_id],
                                  filter_string="tags.`specsweep.role` = 'child'")
    assert len(children) == 2 and len(seen) == 2


def test_server_needing_more_gpus_than_the_cluster_has_fails_preflight(local_ray, tmp_path):
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.preflight import PreflightError

    server = tiny_server("none")
    settings = _settings(tmp_path, cluster=dataclasses.replace(_settings(tmp_path).cluster, gpus_per_server=4))
    t0 = time.monotonic()
    with pytest.raises(PreflightError) as e:
        execute_plan(_plan(tiny_group(server, [tiny_run(server, 0)])), settings)
    assert server.key in str(e.value) and "4 GPU" in str(e.value) and "no GPU" in str(e.value)
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "logs").exists()  # no engine-log folder for a plan that never started
    from mlflow import MlflowClient  # the preflight runs before MLflow: nothing recorded

    if (tmp_path / "mlflow.db").exists():
        assert MlflowClient(settings.tracking_uri).get_experiment_by_name("t") is None
