"""The MLflow store's lock: one driver at a time creates, migrates or claims runs in a SQLite store.

    lock_path_for(uri) -> Path | None      `<db>.lock` beside a SQLite database; None for a tracking server
    StoreLock.for_uri(uri).hold()          exclusive across processes (flock), reentrant within one

The kernel drops a flock when its holder exits, however it exits, so a lock left by a dead process never blocks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

LOCK_TIMEOUT_S = 300.0  # waiting for another driver's store lock (a migration takes seconds)


def lock_path_for(uri: str) -> Path | None:
    """`<db>.lock` beside a SQLite database; None for other stores (a server serialises its own schema)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):].split("?", 1)[0]).resolve()
        return db.with_name(db.name + ".lock")
    return None


class StoreLock:
    """An exclusive `flock` on one lock file, reentrant within the process (threads wait on an RLock).

    The kernel releases a flock when the holding process exits, so a lock file left by a killed driver blocks
    no one; the file itself stays (its content names the last holder, for the timeout message)."""

    _by_path: dict[Path, "StoreLock"] = {}
    _guard = threading.Lock()

    def __init__(self, path: Path):
        self.path = path
        self._rlock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @classmethod
    def for_uri(cls, uri: str) -> "StoreLock | None":
        path = lock_path_for(uri)
        if path is None:
            return None
        with cls._guard:
            return cls._by_path.setdefault(path, cls(path))

    @contextlib.contextmanager
    def hold(self, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        with self._rlock:
            if self._depth == 0:
                self._acquire(timeout_s)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._release()

    def _acquire(self, timeout_s: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise TimeoutError(f"MLflow store lock {self.path} held for over {timeout_s:.0f} s by "
                                       f"{holder}") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def _release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
