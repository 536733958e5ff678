"""Which driver process owns a RUNNING MLflow run, and whether it is still alive.

A driver is named by its host, pid and the pid's start time (a recycled pid has another start time), written as
the tags `driver_host`, `driver_pid`, `driver_start` on every run it creates. Its parent run carries
`driver_heartbeat` (unix seconds, every `HEARTBEAT_S`): on another host, that heartbeat is the only sign of life.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

HEARTBEAT_S = 30.0  # the parent's `driver_heartbeat` tag is refreshed this often
STALE_HEARTBEAT_S = 600.0  # a driver on another host is gone when its heartbeat is older than this


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); "" when unknown.
    With the pid it names one process: a recycled pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class DriverId:
    """The process that owns a RUNNING run: host, pid and its start time."""

    host: str
    pid: int
    start: str = ""

    TAGS = ("driver_host", "driver_pid", "driver_start")

    @classmethod
    def current(cls) -> "DriverId":
        return cls(socket.gethostname(), os.getpid(), _process_start(os.getpid()))

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> "DriverId | None":
        if "driver_host" not in tags or not tags.get("driver_pid", "").isdigit():
            return None
        return cls(tags["driver_host"], int(tags["driver_pid"]), tags.get("driver_start", ""))

    def tags(self) -> dict[str, str]:
        return {"driver_host": self.host, "driver_pid": str(self.pid), "driver_start": self.start}

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def gone_reason(self, heartbeat: float | None, now: float | None = None) -> str | None:
        """Why this driver is gone, or None while it may be alive. This host: its pid must exist with the same
        start time. Another host: gone only when its heartbeat is older than STALE_HEARTBEAT_S."""
        if self.host == socket.gethostname():
            if not _pid_alive(self.pid):
                return f"driver {self} is gone (no such process)"
            if self.start and _process_start(self.pid) not in ("", self.start):
                return f"driver {self} is gone (pid {self.pid} now belongs to another process)"
            return None
        if heartbeat is not None:
            age = (now or time.time()) - heartbeat
            if age > STALE_HEARTBEAT_S:
                return f"driver {self} is gone (last heartbeat {age:.0f} s ago, over {STALE_HEARTBEAT_S:.0f} s)"
        return None
