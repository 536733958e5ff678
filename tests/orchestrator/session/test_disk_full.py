"""The tracking store's disk fills up while a sweep records. The sweep exits non-zero with one line, no
child run stays RUNNING under a FINISHED parent, and the runs it left are closed FAILED `disk_full` as soon as the
store can be written again (here: by the next run of the same command, which then resumes the rest).

A real full disk: the store lives on a 32 MiB tmpfs mounted in a mount namespace of its own (`unshare -rm`: a user
namespace, so no root is needed where unprivileged user namespaces are allowed; skipped where they are not). A real
`python -m orchestrator +sweep=smoke engine=stub` (real Ray, real MLflow on SQLite, real stub engine processes) runs
in it; once it has recorded a point, the test fills the tmpfs with a file written through /proc/<pid>/root, waits for
the sweep to end, reads the store, frees the space and lets the same command run again.
"""

from __future__ import annotations

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

from tools.testing import scaled

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[3]
SMOKE_RUNS = 8
SCRIPT = """
set -u
mount -t tmpfs -o size=32m specsweep-store "$STORE" || exit 90
for n in first second; do
  [ "$n" = second ] && while [ ! -e "$GO" ]; do sleep 0.2; done
  "$PYTHON" -m orchestrator +sweep=smoke engine=stub engine.stub.token_s=0.2 sweep_name=full \
      "tracking.uri=sqlite:///$STORE/mlflow.db" >"$OUT/$n.out" 2>"$OUT/$n.err"
  echo $? >"$OUT/$n.rc.tmp" && mv "$OUT/$n.rc.tmp" "$OUT/$n.rc"
done
while [ ! -e "$DONE" ]; do sleep 0.2; done
"""


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    d = tempfile.mkdtemp(prefix="ns")
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m x {d}"],
                              capture_output=True, timeout=30).returncode == 0
    finally:
        os.rmdir(d)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the namespace ended early (exit {proc.returncode})"
        assert time.monotonic() < deadline, f"{path.name} not written within {timeout_s:.0f} s"
        time.sleep(0.2)


def _rows(db: Path) -> list[tuple[str, str, str, str, str, str]]:
    """(run_id, status, role, parent, run_hash, failure_reason) of every run in the store, read from a copy (SQLite
    resolves the /proc/<pid>/root link to this namespace's /)."""
    copy = Path(tempfile.mkdtemp(prefix="db")) / "copy.db"
    shutil.copyfile(db, copy)
    con = sqlite3.connect(copy, timeout=30)
    try:
        tags = {}
        for rid, key, value in con.execute("select run_uuid, key, value from tags"):
            tags.setdefault(rid, {})[key] = value
        return [(rid, status, tags.get(rid, {}).get("specsweep.role", ""),
                 tags.get(rid, {}).get("mlflow.parentRunId", ""), tags.get(rid, {}).get("run_hash", ""),
                 tags.get(rid, {}).get("failure_reason", ""))
                for rid, status in con.execute("select run_uuid, status from runs")]
    finally:
        con.close()
        shutil.rmtree(copy.parent, ignore_errors=True)


def _finished_children(db: Path) -> int:
    try:
        return sum(1 for r in _rows(db) if r[2] == "child" and r[1] == "FINISHED")
    except (sqlite3.Error, OSError):
        return 0


def _fill(path: Path) -> None:
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


@pytest.mark.skipif(not _namespaces_work(), reason="no mount namespace with tmpfs here (unshare -rm)")
def test_a_full_store_disk_stops_the_sweep_and_the_runs_are_closed_disk_full(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    store.mkdir()
    out.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rf", dir="/tmp")
    env = {**os.environ, "STORE": str(store), "OUT": str(out), "GO": str(tmp_path / "go"),
           "DONE": str(tmp_path / "done"), "PYTHON": sys.executable, "RAY_TMPDIR": ray_tmp,
           "RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path), "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(["unshare", "-rm", "bash", "-c", SCRIPT], cwd=tmp_path, env=env, start_new_session=True)
    try:
        inside = Path(f"/proc/{proc.pid}/root") / str(store).lstrip("/")  # the tmpfs, as the namespace sees it
        db = inside / "mlflow.db"
        deadline = time.monotonic() + scaled(240)
        while _finished_children(db) < 1:
            assert proc.poll() is None and not (out / "first.rc").exists(), (out / "first.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "no point recorded"
            time.sleep(0.2)
        _fill(inside / "filler")  # the store's disk is now full
        _wait_for(out / "first.rc", proc, scaled(240))
        rc, err = int((out / "first.rc").read_text()), (out / "first.err").read_text()
        assert rc != 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert "disk is full" in err, err[-3000:]
        rows = _rows(db)
        finished_parents = {r[0] for r in rows if r[2] == "parent" and r[1] == "FINISHED"}
        assert not [r for r in rows if r[1] == "RUNNING" and r[3] in finished_parents], rows
        assert not finished_parents, rows  # the sweep did not end as if nothing happened

        (inside / "filler").unlink()  # space again: the same command closes what was left and resumes the rest
        (tmp_path / "go").touch()
        _wait_for(out / "second.rc", proc, scaled(300))
        rc, err = int((out / "second.rc").read_text()), (out / "second.err").read_text()
        assert rc == 0, err[-3000:]
        rows = _rows(db)
        assert not [r for r in rows if r[1] == "RUNNING"], rows
        first_parent = [r for r in rows if r[2] == "parent" and r[1] != "FINISHED"]
        assert len(first_parent) == 1 and first_parent[0][1] == "FAILED", rows
        assert first_parent[0][5] == "disk_full", rows
        closed = [r for r in rows if r[2] == "child" and r[1] == "FAILED"]
        assert closed and all(r[5] == "disk_full" for r in closed), rows
        finished = [r[4] for r in rows if r[2] == "child" and r[1] == "FINISHED"]
        assert sorted(set(finished)) == sorted(finished) and len(finished) == SMOKE_RUNS, rows
    finally:
        (tmp_path / "done").touch()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a failed check above: end the namespace's processes
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
