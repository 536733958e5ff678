"""The daemon's memory, in SQLite: one row per firing (its outcome) and a cursor per schedule (last time checked);
and the lock that keeps one daemon per state file.

A firing is recorded `submitting` before Ray is called and `submitted` (or skipped, or failed) after it, so a daemon
killed at any point and restarted submits every firing at most once and loses none.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.schedules.definition import UTC, ScheduleError

DEFAULT_STATE = "specsweep-schedule.db"


class FiringStatus(str, enum.Enum):
    SUBMITTING = "submitting"  # intent recorded, Ray not yet confirmed
    SUBMITTED = "submitted"
    SKIPPED_MISFIRE = "skipped_misfire"
    SKIPPED_OVERLAP = "skipped_overlap"
    SUBMIT_FAILED = "submit_failed"


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
