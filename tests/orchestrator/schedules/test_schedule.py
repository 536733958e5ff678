"""Scheduled sweeps: loading/validation (pure) and the daemon against a real local Ray job server."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.schedules.definition import (UTC, Schedule, ScheduleError, default_schedule_dir, load_schedules,
                                               parse_schedule)
from orchestrator.schedules.state import FiringStatus, StateStore, daemon_lock
from orchestrator.schedules.ray_jobs import RayJobBackend, wait_for_job_server
from orchestrator.schedules.scheduler import Scheduler
from tools.testing import scaled
from workers.engine_process import free_port

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def write(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / f"{name}.yaml").write_text(text)


# --- loading -------------------------------------------------------------------------------------


def test_shipped_schedules_load():
    schedules = load_schedules()
    assert schedules and all(s.sweep for s in schedules)
    assert "nightly-longctx" in {s.name for s in schedules}


def test_schedules_live_outside_hydras_config_root():
    import importlib.resources

    from orchestrator.config.overrides import config_groups

    conf = Path(str(importlib.resources.files("conf")))
    assert default_schedule_dir() == Path(str(importlib.resources.files("orchestrator"))) / "schedules"
    assert conf not in default_schedule_dir().parents and not (conf / "schedule").exists()
    assert "schedule" not in config_groups() and "sweep" in config_groups()


def test_bad_cron_fails_at_load_naming_the_schedule(tmp_path):
    write(tmp_path, "ok", "cron: '*/5 * * * *'\noverrides: ['+sweep=smoke']\n")
    write(tmp_path, "broken", "name: nightly-broken\ncron: '61 2 * * *'\noverrides: ['+sweep=smoke']\n")
    with pytest.raises(ScheduleError) as e:
        load_schedules(tmp_path)
    msg = str(e.value)
    assert "nightly-broken" in msg and "cron='61 2 * * *'" in msg and "5-field cron" in msg
    assert "'ok'" not in msg


@pytest.mark.parametrize(
    "body, key, value",
    [
        ("cron: '0 2 * *'\noverrides: ['+sweep=smoke']", "cron", "'0 2 * *'"),
        ("cron: '0 2 * * *'\noverrides: ['+sweep=nosuch']", "sweep", "'nosuch'"),
        ("cron: '0 2 * * *'\noverrides: ['page_size=16']", "overrides", "['page_size=16']"),
        ("cron: '0 2 * * *'\ntimezone: Mars/Olympus\noverrides: ['+sweep=smoke']", "timezone", "'Mars/Olympus'"),
        ("cron: '0 2 * * *'\nmisfire_grace: -5\noverrides: ['+sweep=smoke']", "misfire_grace", "-5"),
        ("cron: '0 2 * * *'\noverrides: ['+sweep=smoke']\nallow_overlap: maybe", "allow_overlap", "'maybe'"),
        ("cron: '0 2 * * *'\noverrides: ['+sweep=smoke']\nretries: 3", "retries", "3"),
    ],
)
def test_each_bad_key_is_named_with_value_and_allowed(tmp_path, body, key, value):
    write(tmp_path, "s1", body)
    with pytest.raises(ScheduleError) as e:
        load_schedules(tmp_path)
    assert "schedule 's1'" in str(e.value)
    assert f"{key}={value}" in str(e.value)
    assert "allowed:" in str(e.value)


@pytest.mark.parametrize("overrides, needle", [
    ("['+sweep=smoke', 'page_size=0']", "page_size=0 is invalid; allowed: an integer in [1, 4096] (in 8 grid points)"),
    ("['+sweep=smoke', 'contxt_len=5']", "contxt_len='5' is invalid; allowed: a top-level key"),
    ("['+sweep=smoke', 'context_len=40000']", "context_len=40000 is invalid; allowed: at least one grid point"),
    ("['+sweep=smoke', 'attention=bogus']", "Could not find 'attention/bogus'"),
    ("['+sweep=smoke', 'context_len=64,128', 'page_size=0']", "page_size=0 is invalid; allowed: an integer in [1, 4096] (in 8"),
])
def test_overrides_checked_with_the_sweeps_own_rules(tmp_path, overrides, needle):
    write(tmp_path, "ok", "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'page_size=1']\n")
    write(tmp_path, "nightly", f"cron: '0 2 * * *'\noverrides: {overrides}\n")
    with pytest.raises(ScheduleError) as e:
        load_schedules(tmp_path)
    assert str(e.value).startswith(f"schedule 'nightly' ({tmp_path}/nightly.yaml): ") and needle in str(e.value)
    assert "'ok'" not in str(e.value)


def test_sweep_axes_in_a_schedules_overrides_are_expanded(tmp_path):
    write(tmp_path, "nightly", "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'context_len=64,128', 'page_size=1']\n")
    (schedule,) = load_schedules(tmp_path)
    assert schedule.overrides == ("+sweep=smoke", "context_len=64,128", "page_size=1")


def test_schedule_check_refuses_a_bad_override_before_starting_anything(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    write(tmp_path, "nightly", "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'page_size=0']\n")
    probe = ("import atexit, sys; from orchestrator.schedule import main; "
             "atexit.register(lambda: print('ray imported:', 'ray' in sys.modules)); sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", probe, "--schedule-dir", str(tmp_path), "check"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "kernels")])))
    assert proc.returncode == 2
    assert "schedule 'nightly'" in proc.stderr and "page_size=0 is invalid; allowed: an integer in [1, 4096]" in proc.stderr
    assert "ray imported: False" in proc.stdout and not (tmp_path / "specsweep-schedule.db").exists()


def test_duplicate_names_rejected(tmp_path):
    write(tmp_path, "a", "name: same\ncron: '0 2 * * *'\noverrides: ['+sweep=smoke']")
    write(tmp_path, "b", "name: same\ncron: '0 3 * * *'\noverrides: ['+sweep=smoke']")
    with pytest.raises(ScheduleError, match="same"):
        load_schedules(tmp_path)


def test_timezone_and_submission_id():
    s = parse_schedule({"name": "berlin", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
                        "overrides": ["+sweep=smoke"]}, source="berlin.yaml", sweeps=["smoke"])
    nxt = s.next_firing(T0)
    assert nxt == dt.datetime(2026, 12, 1, 1, 0, tzinfo=UTC)  # 02:00 CET = 01:00 UTC
    assert s.submission_id(nxt) == "berlin-20261201T010000Z"
    assert s.entrypoint().endswith("-m orchestrator +sweep=smoke")


def test_one_daemon_per_state_file(tmp_path):
    state = tmp_path / "s.db"
    with daemon_lock(state):
        with pytest.raises(ScheduleError, match="another scheduler daemon"):
            with daemon_lock(state):
                pass
    with daemon_lock(state):  # released: no stale lock
        pass


# --- the daemon against a real Ray job server ----------------------------------------------------


JOB_AGENT_PORT = 52365


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def job_server_url():
    ray = pytest.importorskip("ray")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    from orchestrator.execution.local_ray import init_local_ray

    # Ray's job agent listens on the fixed port 52365 (no ray.init option): an embedded Ray that an earlier test's
    # command started may still be stopping and hold it, and a Ray started meanwhile has no job agent for good.
    deadline = time.monotonic() + scaled(60)
    while _listening(JOB_AGENT_PORT) and time.monotonic() < deadline:
        time.sleep(0.5)
    temp_dir = tempfile.mkdtemp(prefix="specsweep-ray-")  # its jobs are handed this Ray (orchestrator.execution.local_ray)
    ctx = init_local_ray(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=True,
                         dashboard_host="127.0.0.1", dashboard_port=free_port(), log_to_driver=False,
                         job_temp_dir=temp_dir)
    try:
        url = "http://" + ctx.dashboard_url
        wait_for_job_server(url)
        yield url
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


class FakeClock:
    """The injected clock: the test moves time; the daemon reads it."""

    def __init__(self, start: dt.datetime):
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class CountingBackend(RayJobBackend):
    """The real Ray backend; counts jobs it created, and can die right after a real submission."""

    def __init__(self, address: str, die_after_submitting: str | None = None):
        super().__init__(address)
        self.created: list[str] = []
        self.die_after_submitting = die_after_submitting

    def submit(self, submission_id, entrypoint, env, metadata):
        created = super().submit(submission_id, entrypoint, env, metadata)
        if created:
            self.created.append(submission_id)
        if submission_id == self.die_after_submitting:
            raise KeyboardInterrupt("daemon killed between Ray's answer and the state update")
        return created


def minute_schedule(name: str, **kw) -> Schedule:
    # `--cfg job` makes each job a real, cheap sweep command: Hydra composes and prints the config.
    return Schedule(name=name, cron="* * * * *", timezone="UTC",
                    overrides=("+sweep=smoke", "--cfg", "job"), **kw)


def ray_jobs_with_prefix(url: str, prefix: str) -> list[str]:
    from ray.job_submission import JobSubmissionClient

    return sorted(j.submission_id for j in JobSubmissionClient(url).list_jobs()
                  if j.submission_id and j.submission_id.startswith(prefix + "-"))


def started_daemon(tmp_path: Path, url: str, schedule: Schedule) -> tuple[FakeClock, CountingBackend, Scheduler]:
    """A daemon for `schedule` against the real job server, after its first pass at T0."""
    clock, backend = FakeClock(T0), CountingBackend(url)
    daemon = Scheduler([schedule], StateStore(tmp_path / "state.db"), backend, clock)
    daemon.tick()
    return clock, backend, daemon


def run_window(scheduler: Scheduler, clock: FakeClock, until: dt.datetime, step_s: float = 20) -> None:
    while clock.now < until:
        clock.advance(step_s)
        scheduler.tick()


def test_ten_minute_window_submits_exactly_ten_even_across_a_kill(tmp_path, job_server_url):
    schedule = minute_schedule("every-minute", allow_overlap=True, misfire_grace_s=300)
    clock = FakeClock(T0)
    state_path = tmp_path / "state.db"

    # First daemon: starts at 12:00, killed right after Ray accepted the 12:05 firing.
    killed_at = schedule.submission_id(T0 + dt.timedelta(minutes=5))
    first = CountingBackend(job_server_url, die_after_submitting=killed_at)
    state = StateStore(state_path)
    daemon = Scheduler([schedule], state, first, clock)
    daemon.tick()
    with pytest.raises(KeyboardInterrupt):
        run_window(daemon, clock, T0 + dt.timedelta(minutes=10))
    state.close()
    assert state_path.exists() and first.created[-1] == killed_at
    assert StateStore(state_path).get(killed_at).status is FiringStatus.SUBMITTING

    # Down for 90 s, then a new daemon on the same state file finishes the window.
    clock.advance(90)
    second = CountingBackend(job_server_url)
    restarted = Scheduler([schedule], StateStore(state_path), second, clock)
    restarted.tick()
    run_window(restarted, clock, T0 + dt.timedelta(minutes=10, seconds=30))

    ids = ray_jobs_with_prefix(job_server_url, "every-minute")
    expected = [schedule.submission_id(T0 + dt.timedelta(minutes=m)) for m in range(1, 11)]
    assert ids == expected  # exactly 10, one per minute
    assert sorted(first.created + second.created) == expected  # none created twice
    assert killed_at not in second.created  # Ray already had it: recorded, not resubmitted
    history = StateStore(state_path).history("every-minute")
    assert [f.submission_id for f in history] == expected
    assert all(f.status is FiringStatus.SUBMITTED for f in history)


def test_downtime_beyond_grace_logs_skipped_firings(tmp_path, job_server_url, caplog):
    schedule = minute_schedule("graceful", allow_overlap=True, misfire_grace_s=120)
    clock, backend, daemon = started_daemon(tmp_path, job_server_url, schedule)
    run_window(daemon, clock, T0 + dt.timedelta(minutes=3))  # fires 12:01..12:03
    clock.now = T0 + dt.timedelta(minutes=9)  # down from 12:03 to 12:09
    with caplog.at_level(logging.WARNING, logger="orchestrator.schedules.scheduler"):
        daemon.tick()
    skipped = {T0 + dt.timedelta(minutes=m) for m in (4, 5, 6)}  # missed by 300, 240, 180 s > 120 s
    late_ok = [T0 + dt.timedelta(minutes=m) for m in (7, 8, 9)]  # missed by <= 120 s: run once
    history = {f.scheduled_time: f.status for f in daemon.state.history("graceful")}
    assert {t for t, s in history.items() if s is FiringStatus.SKIPPED_MISFIRE} == skipped
    assert backend.created == [schedule.submission_id(T0 + dt.timedelta(minutes=m)) for m in (1, 2, 3)] + \
        [schedule.submission_id(t) for t in late_ok]
    for t in skipped:
        assert any("skipped firing " + t.isoformat() in r.getMessage() for r in caplog.records)


def test_no_overlap_with_a_running_firing(tmp_path, job_server_url, caplog):
    schedule = minute_schedule("no-overlap", allow_overlap=False, misfire_grace_s=300)
    clock, backend, daemon = started_daemon(tmp_path, job_server_url, schedule)
    clock.advance(61)
    daemon.tick()  # 12:01 submitted; its job takes seconds (a Python start + Hydra compose)
    first = schedule.submission_id(T0 + dt.timedelta(minutes=1))
    assert backend.is_running(first)
    clock.advance(60)
    with caplog.at_level(logging.WARNING, logger="orchestrator.schedules.scheduler"):
        daemon.tick()  # 12:02 while 12:01 still runs: skipped
    second = daemon.state.get(schedule.submission_id(T0 + dt.timedelta(minutes=2)))
    assert second.status is FiringStatus.SKIPPED_OVERLAP and first in second.detail
    assert any("still running" in r.getMessage() for r in caplog.records)
    deadline = time.monotonic() + 120
    while backend.is_running(first) and time.monotonic() < deadline:
        time.sleep(0.5)
    clock.advance(60)
    daemon.tick()  # 12:03 after 12:01 ended: submitted
    assert backend.created == [first, schedule.submission_id(T0 + dt.timedelta(minutes=3))]



def test_schedule_list_is_never_cut_when_not_a_terminal(tmp_path, monkeypatch, capsys):
    """In a pipe or a CI log (no terminal, no COLUMNS) every cell is whole: tab-separated lines, not a table cut to
    80 columns ("2026-12-…", "nightly-…")."""
    from orchestrator.schedule import main

    monkeypatch.delenv("COLUMNS", raising=False)
    name = "nightly-long-context-regression-watch"
    write(tmp_path, name, "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'resume=false']\n")
    assert main(["--schedule-dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    header, row = out.strip().splitlines()
    cells = row.split("\t")
    assert header.split("\t")[0] == "name" and cells[0] == name and cells[4] == "+sweep=smoke resume=false"
    assert dt.datetime.fromisoformat(cells[-1]).time() == dt.time(2, 0)  # the next firing, whole


def test_schedule_list_reads_the_files_and_composes_no_grid(tmp_path, monkeypatch, capsys):
    """A 2,000-point grid listed without composing it: name, cron, sweep and the next firing; a typo'd key is still
    refused (it needs no composition), a value only the grid can check is left to `check` and firing."""
    import orchestrator.config.jobs as jobs
    from orchestrator.schedule import main

    def no_grid(*args, **kwargs):
        raise AssertionError("list composed a grid")

    monkeypatch.setattr(jobs, "check_overrides", no_grid)
    monkeypatch.setenv("COLUMNS", "300")  # one line a row
    write(tmp_path, "big", "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'seed=range(0,250)', 'page_size=0']\n")
    assert main(["--schedule-dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr().out
    assert "big" in out and "0 2 * * *" in out and "smoke" in out and "T02:00:00+00:00" in out
    write(tmp_path, "big", "cron: '0 2 * * *'\noverrides: ['+sweep=smoke', 'contxt_len=5']\n")
    assert main(["--schedule-dir", str(tmp_path), "list"]) == 2
