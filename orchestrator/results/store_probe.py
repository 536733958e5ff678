"""Does the tracking store answer? Asked once, before Ray or any engine starts, so that a sweep whose results
could not be recorded never begins.

    probe_tracking(uri, budget_s=10) -> None | why not, in one line
        an HTTP server's /health, a database's port, a SQLite file's folder (exists, writable, not locked past
        the budget); MLflow's deprecated file store and unknown schemes are refused by name (KNOWN_SCHEMES).

DNS and connect run in a thread, so the budget holds whatever the network does.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import urllib.parse
from pathlib import Path

TRACKING_PROBE_S = 10.0
_DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def _probe_http(url: urllib.parse.SplitResult, timeout: float) -> str | None:
    """The server's /health, then a read through MLflow's REST API: a web server that is not MLflow answers 404."""
    conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(url.hostname or "", url.port, timeout=timeout)
    base = url.path.rstrip("/")
    try:
        for path in ("/health", "/api/2.0/mlflow/experiments/search?max_results=1"):
            conn.request("GET", base + path)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                return f"GET {path.split('?')[0]} answered HTTP {response.status} (not an MLflow tracking server?)"
    finally:
        conn.close()
    return None


def _probe_sqlite(path: Path, timeout: float) -> str | None:
    """An existing file is opened and read and a write transaction taken (and rolled back): a text file posing as
    SQLite, a folder or a read-only store is refused here, not by MLflow after Ray started."""
    import sqlite3

    if path.is_dir():
        return f"{path} is a folder, not a SQLite file"
    if not path.exists():
        folder = path.parent
        if not folder.is_dir():
            return f"the folder {folder} does not exist"
        if not os.access(folder, os.W_OK):
            return f"the folder {folder} is not writable"
        return None
    if not path.is_file():
        return f"{path} is not a regular file"
    try:
        con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=timeout)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            con.execute("BEGIN IMMEDIATE")
            con.rollback()
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"{path} cannot be read and written as SQLite: {e}"
    return None


KNOWN_SCHEMES = ("sqlite", "http", "https", *_DB_PORTS)


def _probe(uri: str, timeout: float) -> str | None:
    url = urllib.parse.urlsplit(uri)
    scheme = url.scheme.split("+", 1)[0]
    if scheme in ("http", "https"):
        return _probe_http(url, timeout)
    if scheme in _DB_PORTS:
        socket.create_connection((url.hostname or "localhost", url.port or _DB_PORTS[scheme]), timeout=timeout).close()
        return None
    if scheme == "sqlite":
        if not uri.startswith("sqlite:///") or uri == "sqlite:///":
            return "a SQLite URI names a file: sqlite:///relative.db or sqlite:////absolute.db"
        return _probe_sqlite(Path(uri[len("sqlite:///"):]), timeout)
    if scheme in ("", "file"):
        return ("MLflow's file store (a folder or file: URI) is deprecated and not supported; use "
                "sqlite:///mlflow.db or http://host:5000")
    return f"unknown scheme {scheme!r}; allowed: {', '.join(KNOWN_SCHEMES)}"


def probe_tracking(uri: str, budget_s: float = TRACKING_PROBE_S) -> str | None:
    """None when the tracking store answers within `budget_s` (an HTTP server's /health, a database's port,
    a SQLite file's folder); else why not, in one line. DNS and connect run in a thread: the budget holds."""
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            outcome.append(_probe(uri, budget_s))
        except (OSError, http.client.HTTPException, ValueError) as e:
            outcome.append(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)

    worker = threading.Thread(target=probe, name="tracking-probe", daemon=True)
    worker.start()
    worker.join(budget_s)
    if not outcome:
        return f"no answer within {budget_s:g} s"
    return outcome[0]
