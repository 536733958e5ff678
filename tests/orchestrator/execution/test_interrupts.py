"""Ctrl-C and SIGTERM sent to the driver's whole process group, as a terminal's Ctrl-C or a batch
system's `kill -- -PGID` sends them, at three moments: while Ray starts, while the engine starts, while a run is
probed. Each must end the sweep with one line and no traceback, leave nothing RUNNING in the MLflow store, no process
of the driver's tree (Ray's, the engine) and no held store lock.

A real `python -m orchestrator` (stub engine, its own cwd, HOME and Ray temp dir, SQLite store) in its own session,
so the signal goes to it and to every Ray process it started (they share its process group; engines run in their
own sessions). The seconds from the signal to the exit are printed (`-s`); deadlines scale with the load and never
decide a verdict by themselves.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tools.testing import _children, pid_alive, proc_argv, scaled, wait_for_request

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *filter(None, [os.environ.get("PYTHONPATH")])])
# per phase: the stub's timing (a long start, or a long run) so that the signal lands inside that phase
PHASES = {"ray_start": ("engine.stub.token_s=0.001",),
          "server_start": ("engine.stub.startup_s=60",),
          "probing": ("engine.stub.token_s=0.5",)}


def _descendants(pid: int) -> set[int]:
    children, out, todo = _children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _argvs(pids: set[int]) -> str:
    out = []
    for p in pids:
        try:
            out.append(" ".join(proc_argv(p)))
        except OSError:
            continue
    return "\n".join(out)


def _wait_for_phase(proc: subprocess.Popen, phase: str, seen: set[int]) -> None:
    deadline = time.monotonic() + scaled(180)
    while time.monotonic() < deadline and proc.poll() is None:
        seen |= _descendants(proc.pid)
        argvs = _argvs(seen)
        if phase == "ray_start" and "gcs_server" in argvs:
            return
        if phase == "server_start" and "workers.stub.server" in argvs:
            time.sleep(0.5)  # the engine is starting (startup_s=60: not healthy yet)
            return
        if phase == "probing":
            wait_for_request(proc.pid, timeout_s=deadline - time.monotonic())
            seen |= _descendants(proc.pid)
            return
        time.sleep(0.05)
    raise AssertionError(f"phase {phase} not reached (exit {proc.poll()})")


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("sig, returncode", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_ends_cleanly_at_every_phase(tmp_path, sig, returncode, phase):
    ray_tmp = tempfile.mkdtemp(prefix="ri", dir="/tmp")  # short: Ray's unix sockets live under it
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": PYTHONPATH,
           "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "engine=stub", "cluster.num_cpus=2",
                             *PHASES[phase]], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: set[int] = set()
    try:
        _wait_for_phase(proc, phase, seen)
        t0 = time.monotonic()
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=scaled(120))
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        survivors = [p for p in seen if pid_alive(p)]
        deadline = time.monotonic() + scaled(15)
        while survivors and time.monotonic() < deadline:
            time.sleep(0.1)
            survivors = [p for p in survivors if pid_alive(p)]
        leftover = _argvs(set(survivors))
        for p in survivors:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print(f"\n{signal.Signals(sig).name} to the process group during {phase}: exit {proc.returncode} "
          f"{took:.1f} s after the signal (load {os.getloadavg()[0]:.1f})")
    assert proc.returncode == returncode, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("specsweep: ") and ("Ctrl-C" in last or "SIGTERM" in last), err[-3000:]
    assert not survivors, f"outlived the driver:\n{leftover}"
    db = tmp_path / "mlflow.db"
    if db.exists():  # the store is opened once Ray is up: a signal during Ray's start leaves none
        statuses = dict(sqlite3.connect(db).execute("select status, count(*) from runs group by status").fetchall())
        assert "RUNNING" not in statuses, statuses
        if phase != "ray_start":
            assert statuses.get("KILLED", 0) >= 2, statuses  # the parent and its point
    lock = tmp_path / "mlflow.db.lock"
    if lock.exists():
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no driver holds the store's lock
