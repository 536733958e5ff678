"""GroupRunner without Ray, on the real reference engine: restart budget, start failure, GPU telemetry hook."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

import workers.runners as sw
from specsweep_common.spec import FailureReason, RunState
from tools.testing import tiny_run, tiny_server



def _kill(runner):
    os.kill(runner.engine.pid, signal.SIGKILL)
    runner.engine.proc.wait(10)


def test_engine_restarts_once_then_the_budget_is_spent(tmp_path):
    server = tiny_server("none")
    runner = sw.GroupRunner(server, tmp_path, restarts=1)
    try:
        assert runner.start().alive
        assert runner.run(tiny_run(server, 0)).state is RunState.FINISHED
        _kill(runner)  # between runs: restarted silently, the run succeeds
        second = runner.run(tiny_run(server, 1))
        assert second.state is RunState.FINISHED and second.tags["engine_start"] == "2"
        _kill(runner)  # budget spent: this run and the next fail with the reason and the tail
        for i in (2, 3):
            r = runner.run(tiny_run(server, i))
            assert r.state is RunState.FAILED and r.reason is FailureReason.ENGINE_DIED
            assert "restart budget" in r.message or "between runs" in r.message
            assert r.artifacts[sw.LOG_TAIL_ARTIFACT]
        assert runner.engine_starts == 2
    finally:
        runner.stop()


def test_start_failure_fails_every_run_without_retrying(tmp_path):
    bad = dataclasses.replace(tiny_server("none"), page_size=0)
    runner = sw.GroupRunner(bad, tmp_path)
    info = runner.start()
    assert not info.alive and "exited" in info.error
    for i in range(2):
        r = runner.run(tiny_run(bad, i))
        assert r.reason is FailureReason.ENGINE_START_FAILED and "--page-size" in r.artifacts[sw.LOG_TAIL_ARTIFACT]
    assert runner.engine_starts == 1


class _FakeSamples:
    def metrics(self):
        return {"gpu_util_mean": 50.0}

    def series(self):
        return {"gpu_util": [40.0, 60.0]}


class _FakeSampler:
    available = True

    def __init__(self, visible):
        self.visible = visible

    def start(self):
        return self

    def stop(self):
        return _FakeSamples()


def test_gpu_engines_are_sampled(tmp_path, monkeypatch):
    monkeypatch.setattr(sw, "GpuSampler", _FakeSampler)
    monkeypatch.setattr(sw, "gpu_identity", lambda visible: {"gpu_name": "NVIDIA H200"})
    server = tiny_server("none")
    runner = sw.GroupRunner(server, tmp_path)
    runner.on_gpu, runner.gpu_tags = True, runner._gpu_tags()  # the CPU engine stands in for a GPU one
    try:
        runner.start()
        r = runner.run(tiny_run(server, 0))
    finally:
        runner.stop()
    assert r.metrics["gpu_util_mean"] == 50.0 and r.series["gpu_util"] == [40.0, 60.0]
    assert r.tags["gpu_name"] == "NVIDIA H200"


def test_a_timed_out_run_does_not_spoil_the_next_runs_on_that_server(tmp_path):
    """The engine cancels the generation its client abandoned; the next runs flush and finish on the same engine."""
    server = tiny_server("none", server_context_len=8192, request_timeout_s=2.0)
    runner = sw.GroupRunner(server, tmp_path)
    try:
        runner.start()
        pid = runner.engine.pid
        slow = runner.run(tiny_run(server, 0, gen_tokens=6000))
        assert slow.state is RunState.FAILED and slow.reason is FailureReason.TIMEOUT, slow.message
        after = [runner.run(tiny_run(server, i, gen_tokens=4)) for i in (1, 2)]
        assert [r.state for r in after] == [RunState.FINISHED] * 2, [r.message for r in after]
        assert all(r.tags["engine_pid"] == str(pid) and r.tags["engine_start"] == "1" for r in after)
    finally:
        runner.stop()
    assert "cancelled: the client went away" in runner.log_path.read_text()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a torch without CUDA")
def test_an_engine_that_cannot_start_fails_its_runs_at_once_naming_the_cause(tmp_path):
    """The reference engine on `device=cuda` with a CPU-only torch: its model load raises, the engine exits 1, and
    every run's failure message carries the cause, long before the 120 s start-up timeout."""
    base = tiny_server("none", startup_timeout_s=120.0)
    server = dataclasses.replace(base, engine=dataclasses.replace(base.engine, device="cuda"))
    runner = sw.GroupRunner(server, tmp_path)
    t0 = time.monotonic()
    info = runner.start()
    assert time.monotonic() - t0 < 60 and not info.alive
    r = runner.run(tiny_run(server, 0))
    assert r.state is RunState.FAILED and r.reason is FailureReason.ENGINE_START_FAILED
    assert "exited with code 1 during start: AssertionError: Torch not compiled with CUDA enabled" in r.message
    assert "Torch not compiled with CUDA enabled" in r.artifacts[sw.LOG_TAIL_ARTIFACT]


def test_every_runner_is_behind_the_runner_protocol(tmp_path):
    from tools.testing import stub_server
    from workers.adapter import NodeRank

    server = stub_server(tp_size=2, nnodes=2)
    follower = sw.FollowerRunner(server, tmp_path, 1)
    assert isinstance(follower, sw.Runner) and not isinstance(follower, sw.JobRunner)  # never given a RunSpec
    assert isinstance(sw.GroupRunner(server, tmp_path), sw.JobRunner)
    with pytest.raises(ValueError, match="NodeRank"):
        follower.start()  # rank > 0 cannot start without rank 0's rendezvous address
    with pytest.raises(ValueError, match="rank 1"):
        follower.start(NodeRank(0, 2, "127.0.0.1:1"))
    assert follower.info().alive is False and follower.info().pid is None  # nothing was started
