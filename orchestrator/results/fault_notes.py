"""Why a driver left runs RUNNING, kept where a full disk can still take it: a note per driver beside a SQLite store.

    is_disk_full(error) -> bool           ENOSPC anywhere in the exception's chain, or SQLite's "database or disk is full"
    prepare(uri)                          this driver's note, its bytes allocated now (while the disk has room)
    record(uri, reason, message)          written into those bytes in place (no new block: works on a full disk)
    recorded(uri, driver) -> (reason, message) | None   what a lost driver recorded (read by the next driver's reap)
    discard(uri, driver=None)             the note is gone (the runs it explains are closed)

When the store's disk fills up while a sweep records, the driver stops the sweep and tries to close its runs
`disk_full` at once; if the store still cannot be written, the note says so, and the next driver that opens the
store (the same command again, a resume) closes those runs FAILED `disk_full` instead of `driver_lost`
(`orchestrator.results.tracking.Tracker.reap_lost_drivers`). Only SQLite stores have notes (beside `<db>.lock`);
a tracking server keeps its own disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

from orchestrator.results.drivers import DriverId
from orchestrator.results.store_lock import lock_path_for

logger = logging.getLogger(__name__)

NOTE_BYTES = 4096  # one page: allocated at prepare(), overwritten in place by record()
DISK_FULL_TEXT = ("database or disk is full", "no space left on device")


def is_disk_full(error: BaseException) -> bool:
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if any(t in str(e).lower() for t in DISK_FULL_TEXT):  # sqlite3.OperationalError, wrapped by MLflow
            return True
        e = e.__cause__ or e.__context__
    return False


def _path(uri: str, driver: DriverId) -> Path | None:
    lock = lock_path_for(uri)
    if lock is None:
        return None
    return lock.with_name(lock.name.removesuffix(".lock") + ".faults") / f"{driver.host}-{driver.pid}-{driver.start}"


def prepare(uri: str) -> None:
    """Allocate this driver's note (zeros); never fails the sweep."""
    path = _path(uri, DriverId.current())
    if path is None:
        return
    try:
        path.parent.mkdir(exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, NOTE_BYTES)
        finally:
            os.close(fd)
    except OSError as e:
        logger.debug("no fault note for this driver: %s", e)


def record(uri: str, reason: str, message: str) -> bool:
    """Write `reason` and `message` into this driver's prepared note, in place; False when there is none."""
    path = _path(uri, DriverId.current())
    if path is None or not path.exists():
        return False
    data = f"{reason}\n{message}".encode()[:NOTE_BYTES - 1]
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data + b"\0" * (NOTE_BYTES - len(data)), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    except OSError as e:
        logger.warning("could not write the fault note %s: %s", path, e)
        return False


def recorded(uri: str, driver: DriverId) -> tuple[str, str] | None:
    path = _path(uri, driver)
    try:
        text = path.read_bytes().rstrip(b"\0").decode(errors="replace") if path is not None else ""
    except OSError:
        return None
    reason, _, message = text.partition("\n")
    return (reason, message) if reason else None


def discard(uri: str, driver: DriverId | None = None) -> None:
    path = _path(uri, driver or DriverId.current())
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
