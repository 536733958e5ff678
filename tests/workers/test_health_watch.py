"""A hung engine (alive, answering nothing: the real stub engine process SIGSTOPped in the middle of a
run) is found through its health path within `engine.health_timeout_s`, killed and restarted like a crashed one, and
only the run in flight fails, naming the key. GroupRunner without Ray, as tests/workers/test_runners.py does."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest
import requests

import workers.runners as sw
from specsweep_common.spec import FailureReason, RunState
from tools.testing import pid_alive, scaled, stub_server, tiny_run
from workers.engine_counters import parse_scrape

pytestmark = pytest.mark.timeout(300)

HEALTH_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 90.0  # far above the health timeout: what ends the hung run must be the health watch


def _stop_when_running(url: str, pid: int, stopped: threading.Event) -> None:
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        try:
            if parse_scrape(requests.get(url + "/metrics", timeout=2).text).get("sglang:num_running_reqs", 0):
                os.kill(pid, signal.SIGSTOP)
                stopped.set()
                return
        except requests.RequestException:
            pass
        time.sleep(0.02)


def test_a_hung_engine_fails_only_the_run_in_flight_and_is_restarted(tmp_path):
    base = stub_server(token_s=0.05, drafter="none")
    server = dataclasses.replace(base, engine=dataclasses.replace(
        base.engine, health_timeout_s=HEALTH_TIMEOUT_S, request_timeout_s=REQUEST_TIMEOUT_S))
    runner = sw.GroupRunner(server, tmp_path, restarts=1)
    try:
        assert runner.start().alive
        first = runner.run(tiny_run(server, 0, gen_tokens=8))
        assert first.state is RunState.FINISHED, first.message  # a healthy engine is never taken for a hung one
        hung_pid = runner.engine.pid
        stopped = threading.Event()
        stopper = threading.Thread(target=_stop_when_running, args=(runner.engine.base_url, hung_pid, stopped))
        stopper.start()
        t0 = time.monotonic()
        second = runner.run(tiny_run(server, 1, gen_tokens=400))  # 20 s of tokens: SIGSTOPped while it runs
        took = time.monotonic() - t0
        stopper.join()
        assert stopped.is_set()
        print(f"\nhung run failed after {took:.1f} s (engine.health_timeout_s={HEALTH_TIMEOUT_S:g})")
        assert second.state is RunState.FAILED and second.reason is FailureReason.ENGINE_HUNG, second.message
        assert second.tags["failure_reason"] == "engine_hung"
        assert f"engine.health_timeout_s={HEALTH_TIMEOUT_S:g}" in second.message, second.message
        assert f"engine pid {hung_pid}" in second.message
        assert not pid_alive(hung_pid)  # killed, stopped as it was
        third = runner.run(tiny_run(server, 2, gen_tokens=8))
        assert third.state is RunState.FINISHED, third.message
        assert third.tags["engine_start"] == "2" and third.tags["engine_pid"] != str(hung_pid)
    finally:
        runner.stop()
