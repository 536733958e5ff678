"""Concurrent and killed drivers, with real `python -m orchestrator` processes (each with its own embedded local
Ray), the stub engine, and a real MLflow SQLite store in tmp_path: the store's file lock, claims, `driver_lost`,
the second Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tools.testing import proc_argv, stub_starts
from orchestrator.results.tracking import DRIVER_LOST, Tracker
from orchestrator.results.store_lock import StoreLock, lock_path_for

mlflow = pytest.importorskip("mlflow")

ROOT = Path(__file__).resolve().parents[3]
SWEEP_RUNS = 8  # +sweep=smoke: 2 contexts x 2 probes x 2 drafters on 2 servers


def _env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), "COLUMNS": "200"}


class Driver:
    """One `python -m orchestrator` process; its stdout+stderr go to `<tmp>/<name>.log`."""

    def __init__(self, tmp_path: Path, name: str, *overrides: str, token_s: float = 0.05):
        self.log = tmp_path / f"{name}.log"
        cmd = [sys.executable, "-m", "orchestrator", "+sweep=smoke", "engine=stub", f"engine.stub.token_s={token_s}",
               "progress=false", "cluster.num_cpus=2", f"hydra.sweep.dir=multirun/{name}", *overrides]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, needle: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output():
            assert self.proc.poll() is None, f"driver exited before {needle!r}:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no {needle!r} within {timeout} s:\n{self.output()[-4000:]}"
            time.sleep(0.05)

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"driver still running after {timeout} s:\n{self.output()[-4000:]}") from None


def _engine_alive(pid: int) -> bool:
    """The stub engine `pid` still runs (not a zombie, nor another process that reuses its pid)."""
    try:
        return "workers.stub.server" in proc_argv(pid)
    except OSError:
        return False


@pytest.fixture
def engines(tmp_path):
    """Stub engines the test's drivers started (their start-up lines in the engine logs under the drivers' working
    dir, tmp_path); any still alive at the end is a failure."""
    yield
    pids = [s.pid for s in stub_starts(tmp_path / "logs")]
    assert pids, "no stub engine start in the engine logs"
    deadline = time.monotonic() + 20
    while any(_engine_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if _engine_alive(p)]
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    assert not left, f"engines outlived their drivers: {left}"


def _runs(tmp_path: Path, experiment: str = "smoke-stub"):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def _children(runs):
    return [r for r in runs if r.data.tags.get("specsweep.role") == "child"]


def _parents(runs):
    return [r for r in runs if r.data.tags.get("specsweep.role") == "parent"]


# ---------------------------------------------------------------- the store's lock


_HOLD_LOCK = """
import sys, time
from orchestrator.results.tracking import StoreLock
with StoreLock.for_uri(sys.argv[1]).hold():
    print("held", flush=True)
    time.sleep(600)
"""


def test_store_lock_waits_for_a_live_holder_and_never_for_a_dead_one(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, uri], env=_env(tmp_path), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = StoreLock(lock_path_for(uri))
        with pytest.raises(TimeoutError, match=rf"mlflow.db.lock held .* by pid {holder.pid} on"):
            with lock.hold(timeout_s=0.5):
                pass
        holder.kill()  # SIGKILL: no cleanup in the holder; the lock file stays on disk
        holder.wait()
        assert lock_path_for(uri).exists()
        t = time.monotonic()
        tracker = Tracker(uri, "after-kill")  # creates and migrates the store under the lock
        assert tracker.experiment_id and time.monotonic() - t < 60
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_store_lock_is_reentrant_and_exclusive_between_threads(tmp_path):
    lock = StoreLock.for_uri(f"sqlite:///{tmp_path}/x.db")
    order = []

    def other():
        with lock.hold():
            order.append("other")

    with lock.hold(), lock.hold():  # nested in one thread: no self-deadlock
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.3)
        order.append("main")
    t.join(10)
    assert order == ["main", "other"]


# ---------------------------------------------------------------- concurrent identical sweeps


@pytest.fixture
def shared_ray(tmp_path):
    """One Ray for the concurrent drivers (`cluster.kind=ray`): three embedded Rays starting at once on a busy
    2-core machine can miss Ray's own start-up timeout, which is not what this test is about."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=4, num_gpus=0, include_dashboard=False,
                                                                object_store_memory=128 * 2**20))
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def test_concurrent_identical_sweeps_run_each_point_once(tmp_path, engines, shared_ray):
    """Three drivers start the same sweep at once on a store that does not exist yet: none crashes in MLflow's
    migration, every point ends FINISHED exactly once, and a driver that left points to another says so."""
    drivers = [Driver(tmp_path, f"d{i}", "cluster.kind=ray", f"cluster.address={shared_ray}", token_s=0.1)
               for i in range(3)]
    codes = [d.wait() for d in drivers]
    outputs = [d.output() for d in drivers]
    assert codes == [0, 0, 0], "\n=====\n".join(o[-3000:] for o in outputs)
    children = _children(_runs(tmp_path))
    finished = Counter(c.data.tags["run_hash"] for c in children if c.info.status == "FINISHED")
    assert len(finished) == SWEEP_RUNS and set(finished.values()) == {1}, finished
    assert len(children) == SWEEP_RUNS, Counter(c.info.status for c in children)  # no duplicate or stray run
    held_any = False
    for o in outputs:  # each driver accounts for every point: it ran it, found it FINISHED, or left it to another
        ran = len(re.findall(r"\[\d+/\d+\] (?:FINISHED|FAILED|KILLED)", o))
        resumed = re.search(r"resume: skipping (\d+) run", o)
        held = re.search(r"skipped (\d+) run\(s\) another driver is running \(it records them\): "
                         r"#\d+ .*\[driver pid \d+ ", o)
        held_any |= held is not None
        assert ran + int(resumed[1] if resumed else 0) + int(held[1] if held else 0) == SWEEP_RUNS, o[-3000:]
    assert held_any, "no driver overlapped another (the claims were never exercised)"
    assert not [r for r in _runs(tmp_path) if r.info.status == "RUNNING"]


# ---------------------------------------------------------------- a killed driver, a second Ctrl-C


def test_sigkilled_driver_runs_become_driver_lost_and_rerun(tmp_path, engines):
    first = Driver(tmp_path, "killed", token_s=0.1)
    first.wait_for(f"[3/{SWEEP_RUNS}] FINISHED")  # logged just before it is recorded: 2 are
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    before = _runs(tmp_path)
    (parent,) = _parents(before)
    assert parent.info.status == "RUNNING"  # nothing could close it
    done = {c.data.tags["run_hash"] for c in _children(before) if c.info.status == "FINISHED"}
    stale = [c for c in _children(before) if c.info.status == "RUNNING"]
    assert len(done) >= 2 and len(done) + len(stale) == SWEEP_RUNS

    again = Driver(tmp_path, "again", token_s=0.1)  # the same sweep: the same run_hashes
    assert again.wait() == 0, again.output()[-4000:]
    assert f"resume: skipping {len(done)} run(s)" in again.output()
    after = {r.info.run_id: r for r in _runs(tmp_path)}
    lost = [after[r.info.run_id] for r in [parent, *stale]]
    assert {r.info.status for r in lost} == {"FAILED"}
    assert {r.data.tags["failure_reason"] for r in lost} == {DRIVER_LOST}
    assert all(f"pid {first.proc.pid}" in r.data.tags["message"] for r in lost)
    finished = Counter(c.data.tags["run_hash"] for c in _children(after.values()) if c.info.status == "FINISHED")
    assert len(finished) == SWEEP_RUNS and set(finished.values()) == {1}
    assert {c.data.tags["run_hash"] for c in stale} <= set(finished)  # the lost points ran again
    assert not [r for r in after.values() if r.info.status == "RUNNING"]


def test_second_ctrl_c_still_closes_every_run(tmp_path, engines):
    driver = Driver(tmp_path, "ctrlc", token_s=0.1)
    driver.wait_for(f"[1/{SWEEP_RUNS}] FINISHED")
    driver.proc.send_signal(signal.SIGINT)
    driver.wait_for("Ctrl-C again skips it")  # the first interrupt is handled: the report is being written
    driver.proc.send_signal(signal.SIGINT)
    assert driver.wait() != 0
    runs = _runs(tmp_path)
    (parent,) = _parents(runs)
    assert parent.info.status == "KILLED", driver.output()[-3000:]
    assert {c.info.status for c in _children(runs)} <= {"FINISHED", "KILLED"}
    assert len(_children(runs)) == SWEEP_RUNS
