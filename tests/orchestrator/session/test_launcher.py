"""The specsweep launcher in-process, with the execution edge swapped out (no Ray, MLflow, engine).

Hydra's `LauncherTestSuite` is not reused: it runs arbitrary task functions over Hydra's own test
configs, while this launcher never calls the task function; it plans every job of our schema as one
sweep. Discovery is tested as the suite would, and the launcher's contract (one JobReturn per job, in
job order, failures as data, all-or-nothing validation) is tested below.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.launcher import Launcher

from hydra_plugins.specsweep_launcher.specsweep_launcher import SpecsweepLauncher
from orchestrator.config.jobs import expand_grid, plan_jobs
from orchestrator.config.schema import register_configs
from orchestrator.config.config_error import ConfigError
from orchestrator.session import sweep as sweep_module
from orchestrator.session.launcher import InvalidConfig
from orchestrator.session.outcomes import NotRun, outcomes
from specsweep_common.spec import FailureReason, RunResult, RunState


def test_discovery():
    assert SpecsweepLauncher.__name__ in [p.__name__ for p in Plugins.instance().discover(Launcher)]


@pytest.fixture
def fake_execution(monkeypatch):
    """Every third run FAILED; records what execution received."""
    seen = {}

    def sweep_plan(plan, settings):
        seen["plan"], seen["settings"] = plan, settings
        results = [RunResult(run=r, state=RunState.FAILED if r.job_index % 3 == 0 else RunState.FINISHED,
                             reason=FailureReason.ENGINE_DIED if r.job_index % 3 == 0 else None,
                             metrics={"commit_len_mean": 5.0}) for r in plan.runs]
        return sweep_module.SweepResult(results[::-1], 0, plan)  # results stream back in any order

    monkeypatch.setattr(sweep_module, "sweep_plan", sweep_plan)
    return seen


def sweep(runner, tmp_path, *overrides):
    register_configs()
    with runner(calling_file=None, calling_module="orchestrator", task_function=None, config_path="pkg://conf",
                config_name="config", overrides=list(overrides), temp_dir=str(tmp_path)) as s:
        assert len(s.returns) == 1  # one batch: the launcher sees the whole sweep at once
        return s.returns[0]


def test_smoke_sweep_one_jobreturn_per_job_in_order(hydra_sweep_runner, fake_execution, tmp_path):
    returns = sweep(hydra_sweep_runner, tmp_path, "+sweep=smoke")
    plan, settings = fake_execution["plan"], fake_execution["settings"]
    assert plan.num_runs == 8 and len(plan.groups) == 2 and plan.sweep_name == "smoke"
    assert settings.experiment_name == "smoke" and settings.resume
    assert settings.tracking_uri.startswith("sqlite:////") and settings.tracking_uri.endswith("/mlflow.db")
    assert len(returns) == 8
    for i, ret in enumerate(returns):
        assert ret.status is JobStatus.COMPLETED  # a FAILED run is data, not a failed Hydra job
        result = ret.return_value
        assert isinstance(result, RunResult) and result.run.job_index == i
        assert result.state is (RunState.FAILED if i % 3 == 0 else RunState.FINISHED)
        assert list(ret.overrides) == list(result.run.overrides)
    assert returns[0].overrides == ["context_len=256", "probe=predictable", "drafter=ngram", "+sweep=smoke"]


def test_dropped_points_are_not_run(hydra_sweep_runner, fake_execution, tmp_path):
    returns = sweep(hydra_sweep_runner, tmp_path, "+sweep=smoke", "context_len=1024,65536")
    assert fake_execution["plan"].num_runs == 4
    dropped = [r.return_value for r in returns if isinstance(r.return_value, NotRun)]
    assert len(dropped) == 4 and all("dropped" in d.reason for d in dropped)


def test_invalid_points_fail_before_execution(hydra_sweep_runner, fake_execution, tmp_path):
    with pytest.raises(InvalidConfig) as e:
        sweep(hydra_sweep_runner, tmp_path, "+sweep=smoke", "page_size=0,16", "gen_tokens=0")
    assert "plan" not in fake_execution
    text = str(e.value)
    assert "24 problem(s) in 16 grid point(s)" in text  # gen_tokens=0 everywhere, page_size=0 in 8
    assert text.count("page_size=0: allowed an integer in [1, 4096]") == 8


def test_sweep_level_keys_cannot_vary(hydra_sweep_runner, fake_execution, tmp_path):
    with pytest.raises(InvalidConfig, match="sweep_name.*one value for the whole sweep"):
        sweep(hydra_sweep_runner, tmp_path, "+sweep=smoke", "sweep_name=a,b")


def test_dry_run_starts_nothing(hydra_sweep_runner, monkeypatch, tmp_path):
    monkeypatch.setattr(sweep_module, "sweep_plan", lambda *a: pytest.fail("dry run executed"))
    returns = sweep(hydra_sweep_runner, tmp_path, "+sweep=smoke", "hydra.launcher.dry_run=true")
    assert [r.return_value.reason for r in returns] == ["dry run"] * 8


def test_plan_jobs_from_python(tmp_path):
    jobs = expand_grid({"context_len": [256, 1024], "drafter": ["ngram", "oracle"]},
                                     "sweep_name=bench", "gen_tokens=4")
    assert jobs[1] == ["context_len=256", "drafter=oracle", "sweep_name=bench", "gen_tokens=4"]
    plan, settings = plan_jobs(jobs, cwd=str(tmp_path))
    assert plan.num_runs == 4 and len(plan.groups) == 2 and settings.experiment_name == "bench"
    assert settings.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(ConfigError, match="page_size"):
        plan_jobs([["page_size=0"]])


def test_run_sweep_resume_skips_finished(monkeypatch, tmp_path):
    """The edge with MLflow and Ray swapped out: FINISHED hashes never reach execution."""
    import orchestrator.execution.execute
    import orchestrator.results.tracking

    plan, settings = plan_jobs(expand_grid({"drafter": ["ngram", "oracle"]}),
                                             cwd=str(tmp_path))
    finished = {plan.groups[0].runs[0].run_hash}
    monkeypatch.setattr(orchestrator.results.tracking.Tracker, "finished_run_hashes", lambda self: finished)
    ran = []
    monkeypatch.setattr(orchestrator.execution.execute, "execute_plan", lambda p, s, tracker=None, connection=None: ran.append(p) or
                        [RunResult(run=r, state=RunState.FINISHED) for r in p.runs])
    results, skipped, ran_plan = sweep_module.sweep_plan(plan, settings)
    assert skipped == 1 and len(results) == 1 and ran_plan.num_runs == 1 and ran == [ran_plan]
    assert ran_plan.resumed == tuple(finished) and set(ran_plan.run_hashes) == {r.run_hash for r in plan.runs}
    out = outcomes(plan.runs, plan, ran_plan, results)
    assert isinstance(out[0], NotRun) and "resume" in out[0].reason and out[1].state is RunState.FINISHED
    results, skipped, _ = sweep_module.sweep_plan(plan, replace(settings, resume=False))
    assert skipped == 0 and len(results) == 2


def test_run_sweep_connects_ray_and_runs_the_preflight_once(monkeypatch, tmp_path):
    """The launcher's Ray connection (connect, preflight) is the one `execute_plan` runs on: neither happens twice."""
    from orchestrator.execution import ray_connection

    calls = {"connect": 0, "preflight": 0}
    real_connect, real_preflight = ray_connection.connect_ray, ray_connection.check_placement

    def connect(*args, **kw):
        calls["connect"] += 1
        return real_connect(*args, **kw)

    def preflight(*args, **kw):
        calls["preflight"] += 1
        return real_preflight(*args, **kw)

    monkeypatch.setattr(ray_connection, "connect_ray", connect)
    monkeypatch.setattr(ray_connection, "check_placement", preflight)
    plan, settings = plan_jobs(expand_grid(
        {"context_len": [256, 512]}, "engine=stub", "engine.stub.token_s=0.001", "engine.stub.startup_s=0",
        "sweep_name=once", "gen_tokens=8", "progress=false", "cluster.num_cpus=2"), cwd=str(tmp_path))
    results, skipped, _ = sweep_module.sweep_plan(plan, settings)
    assert [r.state for r in results] == [RunState.FINISHED, RunState.FINISHED] and skipped == 0
    assert calls == {"connect": 1, "preflight": 1}


def test_stub_engine_sweeps_get_their_own_experiment_and_never_mix_with_real_engines(tmp_path):
    from orchestrator.results.tracking import experiment_for

    plan, settings = plan_jobs([["engine=stub", "sweep_name=probe"]], cwd=str(tmp_path))
    assert experiment_for(settings, plan) == "probe-stub"
    plan, settings = plan_jobs([["sweep_name=probe"]], cwd=str(tmp_path))
    assert experiment_for(settings, plan) == "probe"
    plan, settings = plan_jobs([["engine=stub", "sweep_name=probe", "tracking.experiment_name=mine"]],
                                             cwd=str(tmp_path))
    assert experiment_for(settings, plan) == "mine-stub"
    with pytest.raises(ConfigError) as e:
        plan_jobs(expand_grid({"engine": ["stub", "reference"]}), cwd=str(tmp_path))
    assert "engine.kind=['reference', 'stub']" in str(e.value) and "<sweep_name>-stub" in str(e.value)


def test_a_large_dry_run_lists_each_servers_first_runs_and_counts_the_rest(tmp_path, caplog, monkeypatch):
    """Past DRY_RUN_LISTED runs the plan is summarised per server at INFO (every run still at DEBUG); below it every
    run is listed. Each job is NotRun either way."""
    import logging

    from orchestrator.session import outcomes

    jobs = expand_grid({"context_len": [256, 512, 1024], "drafter": ["ngram", "oracle"]}, "sweep_name=dry",
                       "gen_tokens=4")
    plan, _ = plan_jobs(jobs, cwd=str(tmp_path))
    assert [len(g.runs) for g in plan.groups] == [3, 3]
    with caplog.at_level(logging.INFO, logger=outcomes.__name__):
        assert {o.reason for o in outcomes.dry_run_outcomes(plan).values()} == {"dry run"}
    assert sum("run_hash=" in m for m in caplog.messages) == 6 and "more run(s)" not in caplog.text
    caplog.clear()
    monkeypatch.setattr(outcomes, "DRY_RUN_LISTED", 5)  # the 6-run plan now counts as large
    monkeypatch.setattr(outcomes, "DRY_RUN_PER_SERVER", 1)
    with caplog.at_level(logging.DEBUG, logger=outcomes.__name__):
        outcomes.dry_run_outcomes(plan)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sum("run_hash=" in m for m in info) == 2  # one a server
    assert sum("and 2 more run(s) of this server (all 6 runs" in m for m in info) == 2
    assert sum("run_hash=" in r.getMessage() for r in caplog.records) == 6  # the rest at DEBUG
