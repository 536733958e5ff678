"""Whether the tracking store answers, asked before Ray or any engine starts: refused and silent servers, SQLite
files, a real MLflow server, and the stores MLflow no longer supports."""

from __future__ import annotations

import http.server
import socket
import sqlite3
import threading
import time

import pytest

from orchestrator.results.store_probe import probe_tracking
from tools.testing import scaled


def test_probe_tracking_refused_and_silent():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "Connection refused" in probe_tracking(f"http://127.0.0.1:{port}")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        t0 = time.monotonic()
        why = probe_tracking(f"http://127.0.0.1:{listener.getsockname()[1]}", budget_s=1.0)
        assert time.monotonic() - t0 < scaled(3) and ("timed out" in why or "no answer within 1 s" in why)


def test_probe_tracking_sqlite(tmp_path):
    assert probe_tracking(f"sqlite:///{tmp_path}/mlflow.db") is None
    assert "does not exist" in probe_tracking(f"sqlite:///{tmp_path}/nope/mlflow.db")


def test_probe_tracking_answers_for_a_real_mlflow_server(tmp_path, mlflow_ui):
    with mlflow_ui(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "artifacts") as url:
        assert probe_tracking(url) is None
    assert "Connection refused" in probe_tracking(url)


def test_sqlite_store_is_read_and_written(tmp_path):
    fake = tmp_path / "mlflow.db"
    fake.write_text("I am not a database\n" * 100)
    assert "cannot be read and written as SQLite" in probe_tracking(f"sqlite:///{fake}")
    (tmp_path / "dir.db").mkdir()
    assert "is a folder" in probe_tracking(f"sqlite:///{tmp_path}/dir.db")
    sqlite3.connect(tmp_path / "real.db").execute("CREATE TABLE t (x)").connection.commit()
    assert probe_tracking(f"sqlite:///{tmp_path}/real.db") is None


@pytest.mark.parametrize("uri,why", [
    ("gopher://h/x", "unknown scheme 'gopher'"),
    ("file:///tmp/mlruns", "file store"),
    ("./mlruns", "file store"),
    ("sqlite:///", "names a file"),
    ("sqlite://", "names a file"),
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
