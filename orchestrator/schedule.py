"""Cron-scheduled sweeps submitted as Ray Jobs: never doubled, never silently lost.

    specsweep-schedule list              # schedules and their next firing times
    specsweep-schedule run               # the daemon
    specsweep-schedule fire NAME         # submit one firing now
    specsweep-schedule history [NAME]    # what was submitted or skipped, and why

(`specsweep-schedule` is the console script; `python -m orchestrator.schedule` is the same.)

A schedule is one YAML file in `orchestrator/schedules/` (shipped with the package; or `--schedule-dir`). That folder is
outside Hydra's config root (`conf/`): a schedule is not a run config, so `specsweep +schedule=...` is refused.

    name: nightly-longctx          # default: the file's stem
    cron: "0 2 * * *"              # 5 fields (croniter)
    timezone: Europe/Berlin        # IANA name, default UTC
    overrides: ["+sweep=longctx", "attention=torch"]
    enabled: true
    misfire_grace: 3600            # seconds: a firing missed by less than this still runs, once
    allow_overlap: false           # false: skip a firing while the previous one still runs

Guarantees:
- Each firing has a stable `submission_id = <name>-<scheduled time, UTC>`; Ray refuses a duplicate id,
  and the SQLite state records intent (`submitting`) before the call and the outcome after it, so a
  daemon killed at any point and restarted submits every firing at most once and loses none.
- Missed firings after downtime: inside `misfire_grace` they run once; older ones are recorded and
  logged as `skipped_misfire`. A firing while the schedule's previous job still runs is recorded and
  logged as `skipped_overlap` unless `allow_overlap`.
- The sweep's MLflow parent run is tagged with the schedule name and scheduled time (through the
  job's environment: SPECSWEEP_SCHEDULE, SPECSWEEP_SCHEDULED_TIME).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import enum
import fcntl
import importlib.resources
import logging
import os
import shlex
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from orchestrator.tracking import ENV_SCHEDULE, ENV_SCHEDULED_TIME

log = logging.getLogger(__name__)

UTC = dt.timezone.utc
DEFAULT_STATE = "specsweep-schedule.db"
ALLOWED_KEYS = ("name", "cron", "timezone", "overrides", "enabled", "misfire_grace", "allow_overlap")

Clock = Callable[[], dt.datetime]


class ScheduleError(ValueError):
    """A schedule file that cannot be used; the message names the schedule, key, value and what is allowed."""


class FiringStatus(str, enum.Enum):
    SUBMITTING = "submitting"  # intent recorded, Ray not yet confirmed
    SUBMITTED = "submitted"
    SKIPPED_MISFIRE = "skipped_misfire"
    SKIPPED_OVERLAP = "skipped_overlap"
    SUBMIT_FAILED = "submit_failed"


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    timezone: str
    overrides: tuple[str, ...]
    enabled: bool = True
    misfire_grace_s: float = 3600.0
    allow_overlap: bool = False

    @property
    def sweep(self) -> str | None:
        for o in self.overrides:
            key, _, value = o.lstrip("+~").partition("=")
            if key == "sweep":
                return value
        return None

    def firings_between(self, after: dt.datetime, until: dt.datetime) -> Iterator[dt.datetime]:
        """Scheduled times t (UTC) with after < t <= until."""
        tz = ZoneInfo(self.timezone)
        it = croniter(self.cron, after.astimezone(tz))
        while True:
            t = it.get_next(dt.datetime).astimezone(UTC)
            if t > until:
                return
            yield t

    def next_firing(self, now: dt.datetime) -> dt.datetime:
        return croniter(self.cron, now.astimezone(ZoneInfo(self.timezone))).get_next(dt.datetime).astimezone(UTC)

    def submission_id(self, scheduled: dt.datetime) -> str:
        return f"{self.name}-{scheduled.astimezone(UTC):%Y%m%dT%H%M%SZ}"

    def entrypoint(self) -> str:
        """The sweep command (built as argv, joined for Ray's string entrypoint)."""
        return shlex.join([sys.executable, "-m", "orchestrator", *self.overrides])


# --- loading -------------------------------------------------------------------------------------


def default_schedule_dir() -> Path:
    """orchestrator/schedules/: package data, not under `conf/` (Hydra would offer it as a config group)."""
    return Path(str(importlib.resources.files("orchestrator"))) / "schedules"


def known_sweeps() -> list[str]:
    sweep_dir = Path(str(importlib.resources.files("conf"))) / "sweep"
    return sorted(p.stem for p in sweep_dir.glob("*.yaml"))


def parse_schedule(raw: object, *, source: str, sweeps: Sequence[str]) -> Schedule:
    """Validate one schedule mapping; every problem is reported at once."""
    if not isinstance(raw, dict):
        raise ScheduleError(f"{source}: expected a mapping of {', '.join(ALLOWED_KEYS)}, got {type(raw).__name__}")
    name = str(raw.get("name") or Path(source).stem)
    problems: list[str] = []

    def bad(key: str, value: object, allowed: str) -> None:
        problems.append(f"schedule '{name}' ({source}): {key}={value!r} is invalid; allowed: {allowed}")

    for key in sorted(set(raw) - set(ALLOWED_KEYS)):
        bad(key, raw[key], "keys " + ", ".join(ALLOWED_KEYS))
    cron = raw.get("cron")
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        bad("cron", cron, "a 5-field cron expression such as '0 2 * * *'")
    tz = raw.get("timezone", "UTC")
    try:
        ZoneInfo(str(tz))
    except (ZoneInfoNotFoundError, ValueError):
        bad("timezone", tz, "an IANA time-zone name such as 'UTC' or 'Europe/Berlin'")
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        bad("overrides", overrides, "a list of Hydra override strings, e.g. ['+sweep=longctx']")
        overrides = []
    grace = raw.get("misfire_grace", 3600)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        bad("misfire_grace", grace, "seconds >= 0")
    for key in ("enabled", "allow_overlap"):
        if key in raw and not isinstance(raw[key], bool):
            bad(key, raw[key], "true or false")
    schedule = Schedule(
        name=name, cron=str(cron), timezone=str(tz), overrides=tuple(overrides),
        enabled=bool(raw.get("enabled", True)),
        misfire_grace_s=float(grace) if isinstance(grace, (int, float)) else 0.0,
        allow_overlap=bool(raw.get("allow_overlap", False)),
    )
    if not overrides or schedule.sweep is None:
        if isinstance(raw.get("overrides", []), (list, tuple)):
            bad("overrides", list(overrides), "a list containing '+sweep=<name>' with <name> one of " + ", ".join(sweeps))
    elif schedule.sweep not in sweeps:
        bad("sweep", schedule.sweep, "one of " + ", ".join(sweeps))
    if problems:
        raise ScheduleError("\n".join(problems))
    return schedule


def sweep_problems(schedule: Schedule, *, source: str) -> list[str]:
    """The schedule's overrides checked with the sweep's own rules (`python -m orchestrator` would refuse
    them before starting anything); a problem shared by several grid points is listed once."""
    from orchestrator.launcher_core import check_overrides

    counts: dict[tuple[str, str, str], int] = {}
    for p in check_overrides(schedule.overrides):
        key = (p.key, repr(p.value), p.allowed)
        counts[key] = counts.get(key, 0) + 1
    return [f"schedule '{schedule.name}' ({source}): {key}={value} is invalid; allowed: {allowed}"
            + (f" (in {n} grid points)" if n > 1 else "") for (key, value, allowed), n in counts.items()]


def load_schedules(directory: Path | None = None) -> list[Schedule]:
    """Every schedule of `directory`, each checked as its sweep would be; raises one ScheduleError listing
    every problem of every file."""
    import yaml

    directory = directory or default_schedule_dir()
    sweeps = known_sweeps()
    schedules, problems = [], []
    for path in sorted(Path(directory).glob("*.yaml")):
        try:
            schedule = parse_schedule(yaml.safe_load(path.read_text()), source=str(path), sweeps=sweeps)
            if bad := sweep_problems(schedule, source=str(path)):
                raise ScheduleError("\n".join(bad))
            schedules.append(schedule)
        except ScheduleError as e:
            problems.append(str(e))
        except yaml.YAMLError as e:
            problems.append(f"{path}: not valid YAML: {e}")
    names = [s.name for s in schedules]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"schedule '{n}': name used by more than one file in {directory}; allowed: unique names")
    if problems:
        raise ScheduleError("\n".join(problems))
    return schedules


# --- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Firing:
    submission_id: str
    schedule: str
    scheduled_time: dt.datetime
    status: FiringStatus
    detail: str
    recorded_at: dt.datetime


class StateStore:
    """SQLite state: one row per firing (its outcome) and a cursor per schedule (last time checked)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS firings (
                submission_id TEXT PRIMARY KEY, schedule TEXT NOT NULL, scheduled_time TEXT NOT NULL,
                status TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', recorded_at TEXT NOT NULL);
            CREATE INDEX IF NOT EXISTS firings_by_schedule ON firings (schedule, scheduled_time);
            CREATE TABLE IF NOT EXISTS cursors (schedule TEXT PRIMARY KEY, checked_until TEXT NOT NULL);
            """
        )

    def close(self) -> None:
        self._db.close()

    def cursor(self, schedule: str) -> dt.datetime | None:
        row = self._db.execute("SELECT checked_until FROM cursors WHERE schedule=?", (schedule,)).fetchone()
        return dt.datetime.fromisoformat(row[0]) if row else None

    def set_cursor(self, schedule: str, until: dt.datetime) -> None:
        self._db.execute(
            "INSERT INTO cursors VALUES (?, ?) ON CONFLICT(schedule) DO UPDATE SET checked_until=excluded.checked_until",
            (schedule, until.astimezone(UTC).isoformat()),
        )

    def record(self, firing_id: str, schedule: str, scheduled: dt.datetime, status: FiringStatus,
               detail: str, now: dt.datetime) -> None:
        self._db.execute(
            "INSERT INTO firings VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(submission_id) DO UPDATE SET "
            "status=excluded.status, detail=excluded.detail, recorded_at=excluded.recorded_at",
            (firing_id, schedule, scheduled.astimezone(UTC).isoformat(), status.value, detail,
             now.astimezone(UTC).isoformat()),
        )

    def get(self, firing_id: str) -> Firing | None:
        rows = self._select("WHERE submission_id=?", (firing_id,))
        return rows[0] if rows else None

    def history(self, schedule: str | None = None) -> list[Firing]:
        if schedule is None:
            return self._select("ORDER BY scheduled_time, schedule", ())
        return self._select("WHERE schedule=? ORDER BY scheduled_time", (schedule,))

    def pending(self) -> list[Firing]:
        return self._select("WHERE status=? ORDER BY scheduled_time", (FiringStatus.SUBMITTING.value,))

    def last_submitted(self, schedule: str) -> Firing | None:
        rows = self._select("WHERE schedule=? AND status=? ORDER BY scheduled_time DESC LIMIT 1",
                            (schedule, FiringStatus.SUBMITTED.value))
        return rows[0] if rows else None

    def _select(self, where: str, args: tuple) -> list[Firing]:
        rows = self._db.execute(
            "SELECT submission_id, schedule, scheduled_time, status, detail, recorded_at FROM firings " + where, args
        ).fetchall()
        return [Firing(r[0], r[1], dt.datetime.fromisoformat(r[2]), FiringStatus(r[3]), r[4],
                       dt.datetime.fromisoformat(r[5])) for r in rows]


@contextlib.contextmanager
def daemon_lock(state_path: Path) -> Iterator[None]:
    """One daemon per state file. flock is released by the kernel when the process dies: no stale lock."""
    lock_path = state_path.with_name(state_path.name + ".lock")
    with open(lock_path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ScheduleError(f"another scheduler daemon holds {lock_path}; one daemon per state file") from None
        fh.write(str(os.getpid()))
        fh.flush()
        yield


# --- Ray Jobs ------------------------------------------------------------------------------------


class JobBackend(Protocol):
    def submit(self, submission_id: str, entrypoint: str, env: dict[str, str], metadata: dict[str, str]) -> bool:
        """Submit; False when a job with this id already exists (nothing submitted)."""

    def is_running(self, submission_id: str) -> bool: ...


class RayJobBackend:
    """Ray Jobs through `JobSubmissionClient` (address: the job server's http URL)."""

    # The job server answers before its node agent has registered (seconds on a loaded head node).
    AGENT_NOT_READY = "No available agent"

    def __init__(self, address: str, agent_wait_s: float = 60.0):
        from ray.job_submission import JobSubmissionClient

        self.address = address
        self.client = JobSubmissionClient(address)
        self.agent_wait_s = agent_wait_s

    def submit(self, submission_id: str, entrypoint: str, env: dict[str, str], metadata: dict[str, str]) -> bool:
        deadline = time.monotonic() + self.agent_wait_s
        while True:
            if self._exists(submission_id):
                return False
            try:
                self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id,
                                       runtime_env={"env_vars": env}, metadata=metadata)
                return True
            except RuntimeError as e:
                if "already exists" in str(e):
                    return False
                if self.AGENT_NOT_READY not in str(e):
                    raise
                if time.monotonic() > deadline:
                    raise ScheduleError(
                        f"the Ray job server at {self.address} has had no job agent for {self.agent_wait_s:.0f} s; "
                        "with the embedded Ray, another Ray instance on this machine may hold the dashboard "
                        "agent's port (52365): stop it or pass --address") from e
                log.info("Ray job server has no agent yet; retrying %s", submission_id)
                time.sleep(1.0)

    def is_running(self, submission_id: str) -> bool:
        try:
            return not self.client.get_job_status(submission_id).is_terminal()
        except RuntimeError as e:
            if "does not exist" in str(e):
                return False
            raise

    def _exists(self, submission_id: str) -> bool:
        try:
            self.client.get_job_info(submission_id)
            return True
        except RuntimeError as e:
            if "does not exist" in str(e):
                return False
            raise


# --- the scheduler -------------------------------------------------------------------------------


def utcnow() -> dt.datetime:
    return dt.datetime.now(UTC)


class Scheduler:
    """Turns due firings into Ray Jobs. `tick()` is one pass; `run()` loops until stopped."""

    def __init__(self, schedules: Sequence[Schedule], state: StateStore, backend: JobBackend,
                 clock: Clock = utcnow):
        self.schedules = [s for s in schedules if s.enabled]
        self.state = state
        self.backend = backend
        self.clock = clock

    def tick(self) -> None:
        now = self.clock()
        self._finish_pending(now)
        for schedule in self.schedules:
            since = self.state.cursor(schedule.name)
            if since is None:
                # A new schedule starts now; it does not back-fill history.
                self.state.set_cursor(schedule.name, now)
                log.info("schedule %s: first seen; next firing %s", schedule.name, schedule.next_firing(now))
                continue
            for scheduled in schedule.firings_between(since, now):
                self._handle(schedule, scheduled, now)
            self.state.set_cursor(schedule.name, now)

    def fire(self, schedule: Schedule, scheduled: dt.datetime | None = None) -> Firing:
        """Submit one firing now (the `fire` command); overlap rules still apply."""
        now = self.clock()
        self._handle(schedule, scheduled or now.replace(microsecond=0), now, manual=True)
        firing = self.state.get(schedule.submission_id(scheduled or now.replace(microsecond=0)))
        assert firing is not None
        return firing

    def run(self, stop: threading.Event, poll_s: float = 5.0) -> None:
        log.info("scheduler: %d enabled schedule(s); polling every %.0f s", len(self.schedules), poll_s)
        while not stop.is_set():
            self.tick()
            stop.wait(poll_s)

    def _handle(self, schedule: Schedule, scheduled: dt.datetime, now: dt.datetime, manual: bool = False) -> None:
        sid = schedule.submission_id(scheduled)
        existing = self.state.get(sid)
        if existing is not None and existing.status is not FiringStatus.SUBMITTING:
            return  # decided before: never twice
        late_s = (now - scheduled).total_seconds()
        if not manual and late_s > schedule.misfire_grace_s:
            self.state.record(sid, schedule.name, scheduled, FiringStatus.SKIPPED_MISFIRE,
                              f"missed by {late_s:.0f} s > misfire_grace {schedule.misfire_grace_s:.0f} s", now)
            log.warning("schedule %s: skipped firing %s: missed by %.0f s (misfire_grace %.0f s)",
                        schedule.name, scheduled.isoformat(), late_s, schedule.misfire_grace_s)
            return
        if not schedule.allow_overlap:
            previous = self.state.last_submitted(schedule.name)
            if previous is not None and previous.submission_id != sid and self.backend.is_running(previous.submission_id):
                self.state.record(sid, schedule.name, scheduled, FiringStatus.SKIPPED_OVERLAP,
                                  f"{previous.submission_id} still running", now)
                log.warning("schedule %s: skipped firing %s: %s is still running (allow_overlap: false)",
                            schedule.name, scheduled.isoformat(), previous.submission_id)
                return
        self._submit(schedule, scheduled, now)

    def _submit(self, schedule: Schedule, scheduled: dt.datetime, now: dt.datetime) -> None:
        sid = schedule.submission_id(scheduled)
        self.state.record(sid, schedule.name, scheduled, FiringStatus.SUBMITTING, "", now)
        env = {ENV_SCHEDULE: schedule.name, ENV_SCHEDULED_TIME: scheduled.astimezone(UTC).isoformat()}
        try:
            created = self.backend.submit(sid, schedule.entrypoint(), env,
                                          {"schedule": schedule.name, "scheduled_time": env[ENV_SCHEDULED_TIME]})
        except Exception as e:  # noqa: BLE001 - the job server's error is data: recorded, logged, retried
            self.state.record(sid, schedule.name, scheduled, FiringStatus.SUBMITTING, f"submit failed: {e}", now)
            log.error("schedule %s: submitting %s failed (will retry while inside misfire_grace): %s",
                      schedule.name, sid, e)
            return
        detail = "submitted" if created else "already known to Ray (submitted before a restart)"
        self.state.record(sid, schedule.name, scheduled, FiringStatus.SUBMITTED, detail, now)
        log.info("schedule %s: %s %s", schedule.name, sid, detail)

    def _finish_pending(self, now: dt.datetime) -> None:
        """Firings recorded as SUBMITTING by a daemon that died or failed mid-call: resolve them once."""
        by_name = {s.name: s for s in self.schedules}
        for firing in self.state.pending():
            schedule = by_name.get(firing.schedule)
            if schedule is None:
                continue
            if (now - firing.scheduled_time).total_seconds() > schedule.misfire_grace_s:
                self.state.record(firing.submission_id, firing.schedule, firing.scheduled_time,
                                  FiringStatus.SUBMIT_FAILED, firing.detail or "daemon stopped mid-submit", now)
                log.error("schedule %s: firing %s could not be submitted within misfire_grace: %s",
                          firing.schedule, firing.scheduled_time.isoformat(), firing.detail)
                continue
            self._submit(schedule, firing.scheduled_time, now)


# --- embedded Ray job server and the CLI ---------------------------------------------------------


def wait_for_job_server(url: str, timeout_s: float = 90.0) -> None:
    """The dashboard (which hosts the job server) can lag `ray.init` on a loaded machine."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url + "/api/version", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise ScheduleError(f"Ray job server at {url} not reachable within {timeout_s:.0f} s")
        time.sleep(0.5)


@contextlib.contextmanager
def job_server(address: str | None) -> Iterator[str]:
    """Yield a Ray job-server URL: the given one, or a local Ray started here with its job server."""
    if address:
        wait_for_job_server(address)
        yield address
        return
    import ray

    from orchestrator.local_ray import LOOPBACK, init_local_ray
    from workers.engine import free_port

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="specsweep-ray-")  # its jobs are handed this Ray, not another on the machine
    ctx = init_local_ray(include_dashboard=True, dashboard_host=LOOPBACK, dashboard_port=free_port(LOOPBACK),
                         log_to_driver=False, configure_logging=False, job_temp_dir=temp_dir)
    try:
        if not ctx.dashboard_url:
            raise ScheduleError("the local Ray started without its dashboard, which hosts the job server "
                                "(is ray[default] installed?)")
        url = "http://" + ctx.dashboard_url
        wait_for_job_server(url)
        log.info("embedded Ray with its job server at %s (jobs end when this process ends)", url)
        yield url
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _print_table(rows: list[list[str]], header: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*header)
    for r in rows:
        table.add_row(*r)
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specsweep-schedule", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--schedule-dir", type=Path, default=None, help="folder of schedule YAML files")
    parser.add_argument("--state", type=Path, default=Path(DEFAULT_STATE), help="SQLite state file")
    parser.add_argument("--address", default=os.environ.get("SPECSWEEP_JOB_SERVER"),
                        help="Ray job server URL (http://head:8265); default: a local Ray started here")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="schedules and their next firing times")
    run_p = sub.add_parser("run", help="the daemon")
    run_p.add_argument("--poll", type=float, default=5.0, help="seconds between passes")
    fire_p = sub.add_parser("fire", help="submit one firing of NAME now")
    fire_p.add_argument("name")
    fire_p.add_argument("--wait", action="store_true",
                        help="wait until the job ends; exit non-zero if it failed (always, with the embedded Ray)")
    hist_p = sub.add_parser("history", help="firings submitted or skipped")
    hist_p.add_argument("name", nargs="?")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        schedules = load_schedules(args.schedule_dir)
    except ScheduleError as e:
        log.error("%s", e)
        return 2
    by_name = {s.name: s for s in schedules}
    now = utcnow()

    if args.command == "list":
        _print_table([[s.name, s.cron, s.timezone, " ".join(s.overrides), str(s.enabled),
                       s.next_firing(now).isoformat() if s.enabled else "-"] for s in schedules],
                     ["name", "cron", "timezone", "overrides", "enabled", "next firing (UTC)"])
        return 0
    if args.command == "history":
        state = StateStore(args.state)
        _print_table([[f.schedule, f.scheduled_time.isoformat(), f.status.value, f.submission_id, f.detail]
                      for f in state.history(args.name)], ["schedule", "scheduled", "status", "submission id", "detail"])
        return 0
    if args.command == "fire" and args.name not in by_name:
        log.error("schedule %r not found; allowed: %s", args.name, ", ".join(by_name) or "(none defined)")
        return 2

    with daemon_lock(args.state) if args.command == "run" else contextlib.nullcontext():
        state = StateStore(args.state)
        with job_server(args.address) as url:
            backend = RayJobBackend(url)
            scheduler = Scheduler(schedules, state, backend)
            if args.command == "fire":
                firing = scheduler.fire(by_name[args.name])
                log.info("fired %s: %s", firing.submission_id, firing.status.value)
                if firing.status is not FiringStatus.SUBMITTED:
                    return 1
                # An embedded Ray ends with this process, so a local firing always waits for its job.
                return _wait(backend, firing.submission_id) if args.wait or not args.address else 0
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            scheduler.run(stop, poll_s=args.poll)
    return 0


def _wait(backend: RayJobBackend, submission_id: str) -> int:
    from ray.job_submission import JobStatus

    while True:
        status = backend.client.get_job_status(submission_id)
        if status.is_terminal():
            log.info("job %s ended %s", submission_id, status.value)
            if status != JobStatus.SUCCEEDED:
                logs = backend.client.get_job_logs(submission_id)
                log.error("job %s log tail:\n%s", submission_id, "\n".join(logs.splitlines()[-60:]))
                return 1
            return 0
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
