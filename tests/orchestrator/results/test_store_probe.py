"""Whether the tracking store answers, asked before Ray or any engine starts: refused and silent servers, SQLite
files, a real MLflow server, and the stores MLflow no longer supports."""

from __future__ import annotations

import socket
import time

import pytest

from orchestrator.results.store_probe import KNOWN_SCHEMES, probe_tracking
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


@pytest.mark.parametrize("uri, words", [
    ("file:///tmp/mlruns", "file store"),
    ("/tmp/mlruns", "file store"),
    ("sqlite://", "a SQLite URI names a file"),
    ("ftp://host/x", "unknown scheme 'ftp'"),
])
def test_a_store_mlflow_cannot_use_is_refused_by_name(uri, words):
    why = probe_tracking(uri)
    assert why is not None and words in why
    if "unknown scheme" in words:
        assert all(s in why for s in KNOWN_SCHEMES)
