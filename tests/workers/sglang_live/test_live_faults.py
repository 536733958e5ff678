"""Faults on a live SGLang server, through the same EngineProcess a sweep's worker uses: a port taken between
choosing and binding it is retried on another, a killed scheduler takes the server down (EngineDied, not a hang),
and nothing of it is left running."""
from __future__ import annotations

import os
import signal
import socket
import time

import psutil
import pytest

from workers.engine_process import EngineProcess
from workers.errors import EngineDied
from workers.registry import adapter_for

from .conftest import live_server_spec


def test_taken_port_then_killed_scheduler(manifest, tmp_path):
    spec = live_server_spec()
    adapter = adapter_for(spec.engine.kind)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    taken = blocker.getsockname()[1]
    calls: list[int] = []

    def command(port: int) -> list[str]:  # the first start is given a port someone else holds
        calls.append(port)
        return adapter.build_argv(spec, taken if len(calls) == 1 else port)

    engine = EngineProcess(command, tmp_path / "engine.log", env=adapter.env(spec),
                           startup_timeout_s=spec.engine.startup_timeout_s)
    try:
        engine.start()
        assert len(calls) == 2 and engine.port != taken and engine.healthy()
        assert "address already in use" in (tmp_path / "engine.log").read_text().lower()
        root = psutil.Process(engine.pid)
        group = [root, *root.children(recursive=True)]
        schedulers = [p for p in group if "sglang::sched" in " ".join(p.cmdline()) + p.name()]
        assert schedulers, [(p.pid, p.name(), p.cmdline()[:3]) for p in group]
        os.kill(schedulers[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while engine.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        with pytest.raises(EngineDied):
            engine.check_alive()
    finally:
        engine.stop()
        blocker.close()
    time.sleep(1.0)
    assert not [p for p in group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
