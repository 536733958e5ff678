"""EngineProcess against real processes: the reference engine, a crashing command, a hung command, a
SIGTERM-ignoring server, and an owner that is SIGKILLed (no orphan)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import requests

from specsweep_common.spec import EngineKind
from tools.testing import tiny_server
from workers.engine_process import EngineProcess
from workers.registry import adapter_for, build_engine_argv
from workers.errors import EngineDied, EngineStartFailed, EngineTimeout



def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0): look at its state
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_reference_argv_uses_sglang_flag_names():
    argv = build_engine_argv(tiny_server("oracle", num_steps=3, page_size=1), 4321)
    assert argv[:3] == [sys.executable, "-m", "workers.reference"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--speculative-algorithm"] == "STANDALONE"
    assert flags["--speculative-draft-model-path"] == "tiny"
    assert flags["--speculative-num-steps"] == "3"
    assert flags["--speculative-num-draft-tokens"] == "4"
    assert flags["--page-size"] == "1" and flags["--port"] == "4321" and flags["--host"] == "127.0.0.1"
    plain = build_engine_argv(tiny_server("none"), 1)
    assert not any(a.startswith("--speculative") for a in plain)


def test_reference_argv_carries_the_self_draft_layer_count():
    import dataclasses

    server = tiny_server("oracle", num_steps=3)
    server = dataclasses.replace(server, drafter=dataclasses.replace(server.drafter, name="layer_skip", is_oracle=False,
                                                                     draft_num_layers=2))
    argv = build_engine_argv(server, 4321)
    assert argv[argv.index("--speculative-draft-num-layers") + 1] == "2"
    from workers.reference.args import parse_args  # the engine's own parser accepts what the adapter emits

    args = parse_args(argv[3:])
    assert args.speculative_draft_num_layers == 2 and args.speculative_draft_model_path == "tiny"


def test_sglang_adapter_emits_launch_server():
    import dataclasses

    server = tiny_server("ngram")
    gpu = dataclasses.replace(server, engine=dataclasses.replace(server.engine, kind=EngineKind.SGLANG, version="0.5.23",
                                                                 device="cuda"))
    argv = adapter_for(EngineKind.SGLANG).build_argv(gpu, 30000)
    assert argv[0] == sys.executable and argv[1:3] == ["-m", "sglang.launch_server"] and "--tp-size" in argv
    # engine=sglang_cpu: SGLang's own interpreter, with the working directory kept off its sys.path
    cpu = dataclasses.replace(gpu, engine=dataclasses.replace(gpu.engine, version="0.5.18", device="cpu",
                                                              python="/opt/sglang/bin/python"))
    argv = adapter_for(EngineKind.SGLANG).build_argv(cpu, 30000)
    assert argv[:4] == ["/opt/sglang/bin/python", "-P", "-m", "sglang.launch_server"]
    assert argv[argv.index("--device") + 1] == "cpu"


def test_start_health_stop(tmp_path):
    engine = EngineProcess.for_server(tiny_server("none"), tmp_path / "engine.log", grace_s=5)
    with engine:
        assert engine.alive
        assert requests.get(engine.base_url + "/health", timeout=5).status_code == 200
        pid = engine.pid
    assert engine.poll() == 0  # SIGTERM is a clean exit for the reference engine
    assert _wait_dead(pid, 1)
    assert "$ " in engine.log_tail() and "workers.reference" in engine.log_tail()
    engine.stop()  # idempotent


def test_crash_during_start_raises_with_log_tail(tmp_path):
    cmd = lambda port: [sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(3)"]
    engine = EngineProcess(cmd, tmp_path / "crash.log", startup_timeout_s=30)
    with pytest.raises(EngineStartFailed) as info:
        with engine:
            pass
    assert "code 3" in str(info.value) and "boom: no such model" in info.value.log_tail
    assert not isinstance(info.value, EngineTimeout)


def test_bad_engine_flag_is_start_failure(tmp_path):
    server = tiny_server("none")
    cmd = lambda port: build_engine_argv(server, port) + ["--page-size", "0"]
    with pytest.raises(EngineStartFailed) as info:
        EngineProcess(cmd, tmp_path / "bad.log", startup_timeout_s=60).start()
    assert "--page-size" in info.value.log_tail


def test_never_healthy_times_out_and_is_stopped(tmp_path):
    engine = EngineProcess(lambda port: [sys.executable, "-c", "import time; print('loading', flush=True); "
                                         "time.sleep(600)"], tmp_path / "hang.log", startup_timeout_s=1.0)
    with pytest.raises(EngineTimeout) as info:
        with engine:
            pass
    assert isinstance(info.value, EngineStartFailed) and "loading" in info.value.log_tail
    assert _wait_dead(engine.pid, 2)


SIGTERM_DEAF_SERVER = textwrap.dedent("""
    import signal, sys, http.server
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_stop_escalates_to_sigkill(tmp_path):
    engine = EngineProcess(lambda port: [sys.executable, "-c", SIGTERM_DEAF_SERVER, str(port)],
                           tmp_path / "deaf.log", startup_timeout_s=30, grace_s=0.5)
    engine.start()
    t0 = time.monotonic()
    code = engine.stop()
    assert code == -signal.SIGKILL and time.monotonic() - t0 < 5


def test_engine_death_is_noticed(tmp_path):
    with EngineProcess.for_server(tiny_server("none"), tmp_path / "e.log") as engine:
        engine.check_alive()
        os.kill(engine.pid, signal.SIGKILL)
        engine.proc.wait(10)
        with pytest.raises(EngineDied) as info:
            engine.check_alive()
        assert "code -9" in str(info.value)


OWNER = textwrap.dedent("""
    import sys, time
    from workers.engine_process import EngineProcess
    from tools.testing import tiny_server
    engine = EngineProcess.for_server(tiny_server("none"), sys.argv[1])
    engine.start()
    print(engine.pid, flush=True)
    time.sleep(600)
""")


def test_killed_owner_leaves_no_orphan(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "owned.log")], stdout=subprocess.PIPE,
                             text=True)
    try:
        engine_pid = int(owner.stdout.readline())
        assert _pid_alive(engine_pid)
        owner.send_signal(signal.SIGKILL)  # no atexit, no finally: only the parent-death signal is left
        owner.wait(10)
        assert _wait_dead(engine_pid, 10), "engine outlived its owner"
    finally:
        owner.kill()
        owner.wait()


def test_a_python_exception_at_start_is_named_in_the_failure(tmp_path):
    cmd = lambda port: [sys.executable, "-c", "import specsweep_no_such_module"]
    with pytest.raises(EngineStartFailed) as info:
        EngineProcess(cmd, tmp_path / "import.log", startup_timeout_s=60).start()
    assert "ModuleNotFoundError: No module named 'specsweep_no_such_module'" in info.value.message


# What SGLang 0.5.23 logs when a scheduler fails to start (scheduler.py `logger.error(f"Scheduler hit an
# exception: {traceback}")`, engine.py's SIGQUIT handler); SGLang itself cannot run here. The process stays up,
# as a launcher whose TP peer is stuck in NCCL does.
SGLANG_SCHEDULER_FAILURE = textwrap.dedent('''
    import sys, time
    print("[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/models/qwen3-8b', tp_size=1)", flush=True)
    time.sleep(0.5)
    print("""[2026-12-01 10:00:03] Scheduler hit an exception: Traceback (most recent call last):
      File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 6362, in run_scheduler_process
        scheduler = Scheduler(server_args, port_args)
      File "/usr/lib/python3/dist-packages/sglang/srt/models/qwen3_vl.py", line 24, in <module>
        import torchvision
    ModuleNotFoundError: No module named 'torchvision'
    """, flush=True)
    print("[2026-12-01 10:00:03] Received sigquit from a child process. It usually means the child failed.",
          flush=True)
    time.sleep(600)
''')


def test_a_fatal_log_line_ends_the_wait_at_once(tmp_path):
    engine = EngineProcess(lambda port: [sys.executable, "-c", SGLANG_SCHEDULER_FAILURE], tmp_path / "sglang.log",
                           startup_timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(EngineStartFailed) as info:
        with engine:
            pass
    assert time.monotonic() - t0 < 30, "waited for the startup timeout"
    assert not isinstance(info.value, EngineTimeout)
    assert "fatal error during start: ModuleNotFoundError: No module named 'torchvision'" in info.value.message
    assert _wait_dead(engine.pid, 5)
