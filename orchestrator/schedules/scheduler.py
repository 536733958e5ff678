"""The daemon's decisions: which firings are due, which were missed (`misfire_grace`), which would overlap a job still
running (`allow_overlap`), and their submission as Ray Jobs with the schedule's name and time in the job's
environment (the sweep's parent run is tagged with them: `orchestrator.results.provenance`).

    Scheduler(schedules, state, backend, clock=utcnow).tick()   one pass; .serve(stop) loops; .fire(schedule) now
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Sequence

from orchestrator.results.provenance import ENV_SCHEDULE, ENV_SCHEDULED_TIME
from orchestrator.results.regress.alert import ENV_ON_REGRESSION
from orchestrator.schedules.definition import UTC, Schedule
from orchestrator.schedules.ray_jobs import JobBackend
from orchestrator.schedules.state import Firing, FiringStatus, StateStore

log = logging.getLogger(__name__)

Clock = Callable[[], dt.datetime]


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

    def serve(self, stop: threading.Event, poll_s: float = 5.0) -> None:
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
        if schedule.on_regression:  # the sweep runs it once, after its report (orchestrator/results/regress/alert.py)
            env[ENV_ON_REGRESSION] = json.dumps(list(schedule.on_regression))
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
