"""`tools.bench_orchestrator`: one fresh-Ray row end to end (Ray started and stopped inside `execute_plan`, nothing left
behind, the phases add up to the wall time), `shutdown_ray` on a Ray this process started, the median table."""

from __future__ import annotations

import math
import os
import time

import pytest

from tools.testing import pid_alive


ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


@pytest.fixture
def no_ray():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():  # left over from another module: these tests start their own
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _wait_gone(pids, timeout_s: float = 15) -> set[int]:
    deadline = time.monotonic() + timeout_s
    alive = {p for p in pids if pid_alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {p for p in alive if pid_alive(p)}
    return alive


def test_shutdown_ray_stops_every_process_of_the_ray_it_started(no_ray):
    import ray._private.worker

    from orchestrator.execution.ray_connection import connect_ray, shutdown_ray
    from orchestrator.config.settings import ClusterSettings

    assert connect_ray(ClusterSettings(num_cpus=1))
    node = ray._private.worker._global_node
    pids = {info.process.pid for infos in node.all_processes.values() for info in infos}
    monitor = [info.process for info in node.all_processes.get("monitor", [])]
    assert pids and monitor, "an embedded Ray starts an autoscaler monitor"
    t0 = time.monotonic()
    shutdown_ray()
    took = time.monotonic() - t0
    assert not ray.is_initialized()
    assert monitor[0].returncode is not None  # killed and reaped before ray.shutdown() went through the rest
    assert not _wait_gone(pids), "a Ray process outlived shutdown_ray()"
    assert took < 10, took


def test_fresh_ray_row_leaves_nothing_behind_and_accounts_for_its_wall_time(no_ray):
    from tools.bench_orchestrator import BREAKDOWN, bench_once

    before = _descendants()
    row = bench_once(2, 16, 2, 2, "fresh")
    assert not ray.is_initialized()
    assert not _wait_gone(_descendants() - before), "Ray or engine processes outlived the bench row"
    assert row["runs"] == 2 and 0 < row["engine_s"] < row["wall_s"]
    assert row["overhead_per_run_s"] == pytest.approx((row["wall_s"] - row["engine_s"]) / 2)
    b = {key: row["b_" + key] for key, _ in BREAKDOWN}
    assert all(math.isfinite(v) for v in b.values()), b
    assert b["ray_start"] > 0.5 and b["ray_stop"] > 0 and b["engine_start"] > 0 and b["engine_stop"] > 0
    keys = [key for key, _ in BREAKDOWN]
    sequential = keys[:keys.index("other") + 1]  # the rest ran in the background thread
    assert sum(b[k] for k in sequential) == pytest.approx(row["wall_s"])
    assert b["bg_mlflow"] > 0 and b["bg_report"] > 0


def test_median_rows_keep_row_order_and_take_each_median():
    from tools.bench_orchestrator import _median_rows

    samples = [{"ray": "fresh", "runs": 8, "wall_s": w, "engine_s": 1.0} for w in (5.0, 9.0, 6.0)]
    samples += [{"ray": "running", "runs": 8, "wall_s": w, "engine_s": e} for w, e in ((3.0, 1.0), (2.0, 3.0))]
    rows = _median_rows(samples)
    assert [(r["ray"], r["runs"], r["repeats"]) for r in rows] == [("fresh", 8, 3), ("running", 8, 2)]
    assert rows[0]["wall_s"] == 6.0 and rows[1]["wall_s"] == 2.5 and rows[1]["engine_s"] == 2.0
