"""For real: one firing through a local Ray job server runs the smoke sweep; its parent run is tagged.

Its own module: the embedded Ray this command starts needs the dashboard agent's port, which the
job-server fixture of test_schedule.py holds while that module runs.
"""

from __future__ import annotations

import os
from pathlib import Path


from orchestrator.schedules.state import FiringStatus, StateStore


def write(directory: Path, name: str, text: str) -> None:
    (directory / f"{name}.yaml").write_text(text)


def test_fire_runs_the_smoke_sweep_as_a_ray_job_and_tags_its_parent(tmp_path):
    """For real: `schedule fire` in a fresh directory starts a local Ray with its job server, submits the
    smoke sweep as a Ray Job, waits for it, and the sweep's MLflow parent run carries the schedule tags."""
    import subprocess
    import sys

    import mlflow

    sched_dir = tmp_path / "schedules"
    sched_dir.mkdir()
    write(sched_dir, "smoke-nightly", "cron: '0 3 * * *'\noverrides: ['+sweep=smoke', 'context_len=64,128', "
          "'drafter=oracle']\nmisfire_grace: 600\n")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "orchestrator.schedule", "--schedule-dir", str(sched_dir),
                          "--state", str(tmp_path / "schedule.db"), "fire", "smoke-nightly"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ended SUCCEEDED" in out.stderr

    state = StateStore(tmp_path / "schedule.db")
    (firing,) = state.history("smoke-nightly")
    assert firing.status is FiringStatus.SUBMITTED and firing.submission_id.startswith("smoke-nightly-")

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["smoke"])
    parents = runs[runs["tags.specsweep.role"] == "parent"]
    children = runs[runs["tags.specsweep.role"] == "child"]
    assert len(parents) == 1 and parents.iloc[0]["status"] == "FINISHED"
    assert parents.iloc[0]["tags.schedule"] == "smoke-nightly"
    assert parents.iloc[0]["tags.scheduled_time"] == firing.scheduled_time.isoformat()
    assert len(children) == 4 and (children["status"] == "FINISHED").all()  # 2 contexts x 2 probes x oracle
