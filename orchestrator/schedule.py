"""Cron-scheduled sweeps submitted as Ray Jobs: never doubled, never silently lost.

    specsweep-schedule list              # schedules, their sweep and next firing times (no grid is composed)
    specsweep-schedule check             # every schedule's grid checked as `python -m orchestrator` would
    specsweep-schedule run               # the daemon
    specsweep-schedule fire NAME         # submit one firing now
    specsweep-schedule fire NAME --fail-on-regression   # CI: wait; exit 3 when the sweep found a regression
    specsweep-schedule history [NAME]    # what was submitted or skipped, and why

(`specsweep-schedule` is the console script; `python -m orchestrator.schedule` is the same.)

A schedule is one YAML file in `orchestrator/schedules/` (shipped with the package; or `--schedule-dir`). That folder is
outside Hydra's config root (`conf/`): a schedule is not a run config, so `specsweep +schedule=...` is refused.
The code behind this command is the `orchestrator.schedules` package (one module per part: definition, state,
ray_jobs, scheduler).

    name: nightly-longctx          # default: the file's stem
    cron: "0 2 * * *"              # 5 fields (croniter)
    timezone: Europe/Berlin        # IANA name, default UTC
    overrides: ["+sweep=longctx", "attention=torch"]
    enabled: true
    misfire_grace: 3600            # seconds: a firing missed by less than this still runs, once
    allow_overlap: false           # false: skip a firing while the previous one still runs
    on_regression: [notify-send, "sweep regressed"]   # argv (never a shell string), run with the report's path

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
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.results.console import print_table
from orchestrator.results.regress.alert import REGRESSION_MARK
from orchestrator.schedules.definition import ScheduleError, load_schedules, read_schedules
from orchestrator.schedules.ray_jobs import RayJobBackend, job_server
from orchestrator.schedules.scheduler import Scheduler, utcnow
from orchestrator.schedules.state import DEFAULT_STATE, FiringStatus, StateStore, daemon_lock

log = logging.getLogger(__name__)
EXIT_REGRESSION = 3  # `fire --fail-on-regression`: the job succeeded and its sweep found a regression


def _print_table(rows: list[list[str]], header: list[str]) -> None:
    print_table(header, rows)  # plain and whole when not a terminal (orchestrator/results/console.py)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specsweep-schedule", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--schedule-dir", type=Path, default=None, help="folder of schedule YAML files")
    parser.add_argument("--state", type=Path, default=Path(DEFAULT_STATE), help="SQLite state file")
    parser.add_argument("--address", default=os.environ.get("SPECSWEEP_JOB_SERVER"),
                        help="Ray job server URL (http://head:8265); default: a local Ray started here")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="schedules, their sweep and next firing times (reads the files: no grid is composed)")
    sub.add_parser("check", help="every schedule's grid checked point by point, as the fired sweep would be")
    run_p = sub.add_parser("run", help="the daemon")
    run_p.add_argument("--poll", type=float, default=5.0, help="seconds between passes")
    fire_p = sub.add_parser("fire", help="submit one firing of NAME now")
    fire_p.add_argument("name")
    fire_p.add_argument("--wait", action="store_true",
                        help="wait until the job ends; exit non-zero if it failed (always, with the embedded Ray)")
    fire_p.add_argument("--fail-on-regression", action="store_true",
                        help=f"wait, and exit {EXIT_REGRESSION} when the sweep's report found a regression (CI)")
    hist_p = sub.add_parser("history", help="firings submitted or skipped")
    hist_p.add_argument("name", nargs="?")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        if args.command == "run":  # the daemon: a bad file is reported and the others keep firing
            schedules, problems = read_schedules(args.schedule_dir)
            for problem in problems:
                log.error("skipped: %s", problem)
            if not schedules:
                log.error("no usable schedule in %s", args.schedule_dir or "the default folder")
                return 2
        else:  # `list` reads the files and checks keys and conflicts; the grid of each is for `check` and firing
            schedules = load_schedules(args.schedule_dir, grid=args.command != "list")
    except ScheduleError as e:
        log.error("%s", e)
        return 2
    by_name = {s.name: s for s in schedules}
    now = utcnow()

    if args.command == "list":
        _print_table([[s.name, s.cron, s.timezone, s.sweep or "-", " ".join(s.overrides), str(s.enabled),
                       s.next_firing(now).isoformat() if s.enabled else "-"] for s in schedules],
                     ["name", "cron", "timezone", "sweep", "overrides", "enabled", "next firing (UTC)"])
        return 0
    if args.command == "check":
        log.info("%d schedule(s), every grid point valid: %s", len(schedules), ", ".join(by_name) or "(none)")
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
                if args.wait or args.fail_on_regression or not args.address:
                    return _wait(backend, firing.submission_id, fail_on_regression=args.fail_on_regression)
                return 0
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            scheduler.serve(stop, poll_s=args.poll)
    return 0


def regression_exit(job_log: str) -> int:
    """EXIT_REGRESSION when the sweep's log has the regression marker (orchestrator/results/regress/alert.py)."""
    marks = [line for line in job_log.splitlines() if REGRESSION_MARK in line]
    for line in marks:
        log.error("%s", line[line.index(REGRESSION_MARK):])
    return EXIT_REGRESSION if marks else 0


def _wait(backend: RayJobBackend, submission_id: str, *, fail_on_regression: bool = False) -> int:
    from ray.job_submission import JobStatus

    while True:
        status = backend.client.get_job_status(submission_id)
        if status.is_terminal():
            log.info("job %s ended %s", submission_id, status.value)
            if status != JobStatus.SUCCEEDED:
                logs = backend.client.get_job_logs(submission_id)
                log.error("job %s log tail:\n%s", submission_id, "\n".join(logs.splitlines()[-60:]))
                return 1
            return regression_exit(backend.client.get_job_logs(submission_id)) if fail_on_regression else 0
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
