"""Engine processes: an owner that starts, health-checks and always stops one.

Public API:

    adapter_for(kind), build_engine_argv(server, port, node_rank=None)
        the registry of engines (workers/registry.py; one `workers.adapter.EngineAdapter` per EngineKind, each
        in its own folder), re-exported here for the code that starts engines
    EngineProcess(command: Callable[[int], list[str]], log_path, *, host, env, startup_timeout_s, grace_s)
    EngineProcess.for_server(server: ServerSpec, log_path, *, node_rank=None, **kw) -> EngineProcess
        node_rank.rank > 0: a multi-node follower: no HTTP; "started" once it has stayed alive `settle_s`
        with EngineProcess.for_server(server, "engine.log") as engine:   # start + wait for /health 200
            engine.base_url, engine.pid, engine.check_alive(), engine.log_tail(100)
        # leaving the block stops it: SIGTERM to its process group, grace, SIGKILL, wait

Errors (workers.errors): EngineStartFailed (exited, or logged a fatal error, during start), EngineTimeout (its
subclass: no /health 200 within startup_timeout_s), EngineDied (exited after it was healthy); each carries
the log tail, and a start failure's message names its cause from the log (`start_failure_cause`: the last
Python exception, e.g. "ModuleNotFoundError: No module named 'torchvision'", or an `error:` line).
The wait for /health ends as soon as the process exits or its log shows a line of FATAL_LOG_PATTERNS (SGLang's
"Scheduler hit an exception", after which a TP peer can keep the process up without ever serving).

No orphans: the engine runs in its own session/process group with PR_SET_PDEATHSIG=SIGKILL (Linux), so it
dies with the process that started it even when that process is SIGKILLed (a Ray actor killed, a driver
killed). The death signal follows the *thread* that forked, so start engines from a long-lived thread
(the main thread of an actor or driver). Every live EngineProcess is also stopped at interpreter exit.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, Mapping

import requests

from specsweep_common.redact import redact_argv
from specsweep_common.spec import ServerSpec
from workers.adapter import EngineAdapter, NodeRank, node_rank_argv
from workers.errors import EngineDied, EngineStartFailed, EngineTimeout
from workers.registry import adapter_for, build_engine_argv

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# Log lines after which an engine never becomes healthy, though its process may stay up (SGLang 0.5.x:
# scheduler.py / tokenizer_manager.py / detokenizer_manager.py log "<X> hit an exception: <traceback>", and
# engine.py "Received sigquit from a child process" before it kills its tree, which a stuck peer can outlive).
# uvicorn's bind failure: SGLang 0.5.18's server logs it, then stays up without serving (its scheduler process keeps
# it alive; seen on a live CPU server, 2026-12-06), so a taken port is a fatal line, not a start-up timeout.
FATAL_LOG_PATTERNS = (re.compile(r"\b\w+ hit an exception\b"), re.compile(r"Received sigquit from a child process"),
                      re.compile(r"error while attempting to bind on address .*address already in use"))
LOG_SCAN_MAX_BYTES = 1 << 20
FATAL_GRACE_S = 2.0  # after a fatal line: time for the traceback to be written and the process to exit itself
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b(:.*)?$")
_ERROR_LINE = re.compile(r"\berror:|\b(ERROR|FATAL|CRITICAL)\b|\b[A-Z]\w*Error\b")


# ---------------------------------------------------------------- the process owner


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) \
    if sys.platform.startswith("linux") else None


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        if _libc is not None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


_LIVE: "weakref.WeakSet[EngineProcess]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for engine in list(_LIVE):
        engine.stop(grace_s=2.0)


class EngineProcess:
    """Owns one engine subprocess. `start()` returns only once /health answers 200; `stop()` is idempotent."""

    def __init__(self, command: Callable[[int], list[str]], log_path: str | os.PathLike, *,
                 host: str = "127.0.0.1", health_path: str = "/health", env: Mapping[str, str] | None = None,
                 startup_timeout_s: float = 300.0, grace_s: float = 10.0, port_attempts: int = 3,
                 serves_http: bool = True, settle_s: float = 1.0):
        self.command = command
        self.log_path = Path(log_path)
        self.host = host
        self.health_path = health_path
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.port_attempts = port_attempts
        self.serves_http = serves_http  # False: a multi-node follower rank; started = alive after settle_s
        self.settle_s = settle_s
        self.port: int | None = None
        self.argv: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_s = 0.0  # seconds from spawn to the first /health 200
        self._log_start = self._log_scanned = 0  # log offsets: this start's first byte, the fatal-line scan
        self._lock = threading.Lock()
        self._http = requests.Session()
        self._http.trust_env = False  # never route 127.0.0.1 through a proxy from the environment

    @classmethod
    def for_server(cls, server: ServerSpec, log_path: str | os.PathLike, *, node_rank: NodeRank | None = None,
                   **kw) -> "EngineProcess":
        adapter = adapter_for(server.engine.kind)
        env = {**adapter.env(server), **dict(server.engine.env), **kw.pop("env", {})}
        kw.setdefault("startup_timeout_s", server.engine.startup_timeout_s)
        serves_http = node_rank is None or node_rank.serves_http
        return cls(lambda port: adapter.build_argv(server, port, node_rank), log_path, host=server.host,
                   health_path=adapter.health_path, env=env, serves_http=serves_http, **kw)

    # -- lifecycle

    def __enter__(self) -> "EngineProcess":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "EngineProcess":
        for attempt in range(1, self.port_attempts + 1):
            try:
                self._spawn()
                self._wait_healthy()
                return self
            except EngineStartFailed as e:
                self.stop()
                if attempt < self.port_attempts and "address already in use" in e.log_tail.lower():
                    logger.info("port %s was taken; retrying on another", self.port)
                    continue
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        self.port = free_port(self.host)
        self.argv = [str(a) for a in self.command(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(redact_argv(self.argv))}\n".encode())
            log.flush()
            self._log_start = self._log_scanned = log.tell()
            self.started_at = time.time()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True, close_fds=True,
                                         preexec_fn=_die_with_parent(os.getpid()))
        _LIVE.add(self)
        logger.info("engine pid %d on %s: %s", self.proc.pid, self.base_url, " ".join(redact_argv(self.argv)))

    def _wait_healthy(self) -> None:
        proc = self.proc
        if proc is None:
            raise RuntimeError("EngineProcess._wait_healthy before the process was spawned")
        deadline = self.started_at + self.startup_timeout_s
        interval = 0.05
        fatal_at: float | None = None
        while True:
            code = proc.poll()
            if code is not None:
                raise EngineStartFailed(f"engine exited with code {code} during start: {self._cause()} "
                                        f"({self._argv0()})", self.log_tail())
            if fatal_at is None and self._logged_fatal():
                fatal_at = time.time()
                logger.warning("engine pid %d logged a fatal error during start", proc.pid)
            if fatal_at is not None and time.time() - fatal_at >= FATAL_GRACE_S:
                raise EngineStartFailed(f"engine logged a fatal error during start: {self._cause()} "
                                        f"({self._argv0()})", self.log_tail())
            if not self.serves_http and time.time() - self.started_at >= self.settle_s:
                logger.info("engine pid %d (no HTTP on this rank) alive after %.1f s", proc.pid, self.settle_s)
                return
            if self.serves_http and self.healthy(timeout_s=2.0):
                self.ready_s = time.time() - self.started_at
                logger.info("engine pid %d healthy after %.1f s", proc.pid, self.ready_s)
                return
            if time.time() > deadline:
                raise EngineTimeout(f"engine not healthy after {self.startup_timeout_s:.0f} s ({self._argv0()}); "
                                    f"its log ends: {self._cause()}", self.log_tail())
            time.sleep(interval)
            interval = min(interval * 1.5, 0.5)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return self._http.get(self.base_url + self.health_path, timeout=timeout_s).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM to the process group, wait `grace_s`, SIGKILL, wait. Returns the exit code."""
        with self._lock:
            proc = self.proc
            if proc is None:
                return None
            grace = self.grace_s if grace_s is None else grace_s
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    logger.warning("engine pid %d ignored SIGTERM for %.0f s; SIGKILL", proc.pid, grace)
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
            _signal_group(proc.pid, signal.SIGKILL)  # stragglers the leader left in its group
            _LIVE.discard(self)
            self._http.close()
            return proc.returncode

    def kill(self) -> None:
        """SIGKILL to the process group at once (a hung or stopped engine cannot act on SIGTERM); reaped by stop()."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("engine pid %d still there %.0f s after SIGKILL", proc.pid, self.grace_s)

    # -- state

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise EngineDied (with the log tail) if the process has exited."""
        code = self.poll()
        if self.proc is not None and code is not None:
            raise EngineDied(f"engine pid {self.proc.pid} exited with code {code}", self.log_tail())

    def log_tail(self, lines: int = 100, max_bytes: int = 64_000) -> str:
        return read_log_tail(self.log_path, lines, max_bytes)

    def _this_start_log(self) -> str:
        """What this start wrote to the log (the file is shared by every start of a group's engine)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_start, f.seek(0, os.SEEK_END) - LOG_SCAN_MAX_BYTES))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _logged_fatal(self) -> bool:
        """A FATAL_LOG_PATTERNS line among the complete lines written since the last call."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_scanned)
                data = f.read(LOG_SCAN_MAX_BYTES)
        except OSError:
            return False
        end = data.rfind(b"\n") + 1
        self._log_scanned += end
        text = data[:end].decode("utf-8", "replace")
        return any(p.search(text) for p in FATAL_LOG_PATTERNS)

    def _cause(self) -> str:
        return start_failure_cause(self._this_start_log()) or "nothing in its log"

    def _argv0(self) -> str:
        return " ".join(self.argv[:3])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session: the group id is the leader's pid
    except (ProcessLookupError, PermissionError):
        pass


def read_log_tail(path: str | os.PathLike, lines: int = 100, max_bytes: int = 64_000) -> str:
    """The last `lines` lines of a log file ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def start_failure_cause(log_text: str, max_chars: int = 300) -> str:
    """The line of an engine's start-up log that says why it failed: the exception line of its last Python
    traceback, else the last `error:` / ERROR / FATAL line, else the last line; "" for an empty log."""
    lines = [line.rstrip() for line in log_text.splitlines() if line.strip()]
    last_tb = max((i for i, line in enumerate(lines) if _TRACEBACK in line), default=None)
    if last_tb is not None:
        cause = next((line for line in lines[last_tb + 1:] if _EXCEPTION_LINE.match(line)), None)
        if cause:
            return cause[:max_chars]
    cause = next((line for line in reversed(lines) if _ERROR_LINE.search(line) and not line.startswith("$ ")), None)
    if cause is None:
        cause = lines[-1] if lines else ""
    return cause.strip()[:max_chars]


__all__ = ["EngineAdapter", "EngineProcess", "NodeRank", "adapter_for", "build_engine_argv", "free_port",
           "node_rank_argv", "read_log_tail", "start_failure_cause"]
