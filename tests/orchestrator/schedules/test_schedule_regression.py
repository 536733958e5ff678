"""For real: a cron firing (the daemon's clock moved past a minute boundary, as test_schedule.py does) submits the
sweep as a Ray Job; the sweep compares itself with its history, finds the seeded regression, logs the marker that
`fire --fail-on-regression` exits on, and runs the schedule's `on_regression` argv exactly once; more passes of the
daemon, and a second daemon on the same state, fire nothing more.

Its own module: it starts its own local Ray with the job server (see test_schedule_fire.py).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time

from orchestrator.config.jobs import plan_jobs
from orchestrator.results.regress.alert import REGRESSION_MARK
from orchestrator.results.tracking import Tracker
from orchestrator.schedule import EXIT_REGRESSION, _wait, regression_exit
from orchestrator.schedules.definition import UTC, Schedule
from orchestrator.schedules.ray_jobs import RayJobBackend, job_server
from orchestrator.schedules.scheduler import Scheduler
from orchestrator.schedules.state import StateStore
from specsweep_common.spec import RunResult, RunState

T0 = dt.datetime(2026, 1, 1, 2, 0, 30, tzinfo=UTC)
APPEND = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"


def test_cron_firing_runs_the_comparison_and_on_regression_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the embedded Ray's jobs run here (Hydra's multirun folder, logs)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    overrides = ("+sweep=smoke", "context_len=256", "probe=novel", "drafter=oracle", "resume=false",
                 f"tracking.uri=sqlite:///{tmp_path}/mlflow.db")
    # history: one earlier FINISHED run of the same point committing more than the oracle can (num_steps + 1): an
    # exact metric is judged against one baseline run (a noisy one needs 2 earlier runs: docs/schedule.md), and far
    # faster than any CPU run can be (shown, not judged)
    plan, settings = plan_jobs([list(overrides)], cwd=str(tmp_path))
    (spec,) = plan.runs
    tracker = Tracker.from_settings(settings, plan)
    tracker.begin_parent(plan)
    tracker.log_result(RunResult(run=spec, state=RunState.FINISHED, metrics={"decode_tok_s": 1e9,
                                                                     "commit_len_mean": 99.0}))
    tracker.end_parent(RunState.FINISHED)

    called = tmp_path / "on_regression.txt"
    schedule = Schedule(name="regress-nightly", cron="* * * * *", timezone="UTC", overrides=overrides,
                        on_regression=(sys.executable, "-c", APPEND, str(called)))
    state = tmp_path / "state.db"
    with job_server(None) as url:
        clock = [T0]
        backend = RayJobBackend(url)
        daemon = Scheduler([schedule], StateStore(state), backend, lambda: clock[0])
        daemon.tick()  # first seen: no back-fill
        for _ in range(8):  # 02:00:30 -> 02:01:10: the 02:01 firing, then more passes inside the same minute
            clock[0] += dt.timedelta(seconds=5)
            daemon.tick()
        Scheduler([schedule], StateStore(state), backend, lambda: clock[0]).tick()  # a second daemon, same state
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(url)
        jobs = [j.submission_id for j in client.list_jobs() if (j.submission_id or "").startswith("regress-nightly-")]
        assert jobs == ["regress-nightly-20260101T020100Z"]
        deadline = time.monotonic() + 540
        while not client.get_job_status(jobs[0]).is_terminal():
            assert time.monotonic() < deadline, "the sweep job did not end"
            time.sleep(2)
        logs = client.get_job_logs(jobs[0])
        assert client.get_job_status(jobs[0]).value == "SUCCEEDED", logs[-3000:]
        # what `specsweep-schedule fire NAME --fail-on-regression` returns once the job has ended
        assert _wait(backend, jobs[0], fail_on_regression=True) == EXIT_REGRESSION
        assert _wait(backend, jobs[0]) == 0
    assert REGRESSION_MARK in logs and regression_exit(logs) == EXIT_REGRESSION, logs[-4000:]
    (path,) = called.read_text().splitlines()  # exactly once
    assert path.endswith("diagnosis.md") and open(path).read().startswith("# Changes since the last 1 FINISHED")
    from mlflow import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parents = [r for r in c.search_runs([tracker.experiment_id], "tags.`specsweep.role` = 'parent'")
               if r.data.tags.get("schedule") == "regress-nightly"]
    assert len(parents) == 1 and parents[0].data.tags["regression"] == "commit_len_mean on 1 point(s)"
    assert os.path.exists(path)
