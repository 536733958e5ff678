"""Every resource opened before Ray starts, each failure one line naming the key (35 of 46 bad inputs tried on
2026-12-02 started Ray before any refusal): the tracking store (a read and a write), the working directory,
cluster.address, the probe file."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.schema import register_configs, to_run_config
from orchestrator.config.config_error import ConfigError
from orchestrator.results.store_probe import probe_tracking
from orchestrator.execution.resources import ray_address_problem, work_dir_problem


def test_sqlite_store_is_read_and_written(tmp_path):
    fake = tmp_path / "mlflow.db"
    fake.write_text("I am not a database\n" * 100)
    assert "cannot be read and written as SQLite" in probe_tracking(f"sqlite:///{fake}")
    (tmp_path / "dir.db").mkdir()
    assert "is a folder" in probe_tracking(f"sqlite:///{tmp_path}/dir.db")
    import sqlite3

    sqlite3.connect(tmp_path / "real.db").execute("CREATE TABLE t (x)").connection.commit()
    assert probe_tracking(f"sqlite:///{tmp_path}/real.db") is None


@pytest.mark.parametrize("uri,why", [
    ("gopher://h/x", "unknown scheme 'gopher'"),
    ("file:///tmp/mlruns", "file store"),
    ("./mlruns", "file store"),
    ("sqlite:///", "names a file"),
])
def test_store_uris_refused_without_a_connection(uri, why):
    assert why in probe_tracking(uri)


def test_a_web_server_that_is_not_mlflow_is_refused():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(404 if self.path != "/health" else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        why = probe_tracking(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert "answered HTTP 404" in why


def test_work_dir_writable_with_room(tmp_path):
    assert work_dir_problem(str(tmp_path), 10) is None
    assert "does not exist" in work_dir_problem(str(tmp_path / "nope"), 1)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):  # root writes anyway
            assert "not writable" in work_dir_problem(str(ro), 1)
    finally:
        ro.chmod(0o700)
    why = work_dir_problem(str(tmp_path), 10 ** 9)  # 2 PiB of logs
    assert why is not None and "the sweep needs about" in why and "MiB free" in why


def test_ray_address_reached_with_a_short_deadline():
    assert ray_address_problem("auto") is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    why = ray_address_problem(f"127.0.0.1:{port}", budget_s=1.0)
    assert why is not None and why.startswith(f"cluster.address='127.0.0.1:{port}' does not answer")
    assert time.monotonic() - t0 < 5


def test_probe_file_regular_and_no_larger_than_the_context_needs(tmp_path):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        def problem(path: str) -> str:
            cfg = compose("config", overrides=["probe=file", f"probe.path={path}"])
            with pytest.raises(ConfigError) as e:
                to_run_config(cfg, (), cwd=str(tmp_path))
            (p,) = e.value.problems
            assert p.key == "probe.path"
            return p.allowed

        (tmp_path / "big.txt").write_bytes(b"word " * 2 ** 20)  # 5 MiB; smollm2-135m takes 8192 tokens
        assert "a file of at most 1048576 bytes" in problem("big.txt")
        (tmp_path / "d").mkdir()
        assert "an existing regular file" in problem("d")
        assert "an existing regular file" in problem("/dev/zero")  # never read
