"""`make ui`: MLflow's UI on ./mlflow.db, on port 5000 or, when that is taken, a free one; prints the URL and, per
sweep, the link that opens its runs with the axes and answering columns (orchestrator/results/ui_view.py).

    python -m tools.mlflow_ui [--port 5000] [--db mlflow.db]
"""

from __future__ import annotations

import argparse
import os
import socket
import sqlite3
import sys
from pathlib import Path

from orchestrator.results.ui_view import view_url
from orchestrator.results.store_layout import VIEW_KEY, VIEW_TAG_PREFIX


def pick_port(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` when nothing listens there, else a free port the kernel hands out."""
    with socket.socket() as s:
        try:
            s.bind((host, preferred))
            return preferred
        except OSError:
            pass
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def sweep_links(db: Path, base_url: str) -> list[str]:
    """`<experiment>: <saved view URL>` for each experiment with specsweep's saved view (read-only, plain SQLite)."""
    if not db.is_file():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT e.experiment_id, e.name FROM experiments e JOIN experiment_tags t "
                            "ON t.experiment_id = e.experiment_id WHERE t.key = ? AND e.lifecycle_stage = 'active' "
                            "ORDER BY e.experiment_id", (VIEW_TAG_PREFIX + VIEW_KEY,)).fetchall()
    return [f"  {name}: {view_url(base_url, str(eid))}" for eid, name in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make ui", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("UI_PORT", "5000")))
    parser.add_argument("--db", default="mlflow.db")
    args = parser.parse_args(argv)
    port = pick_port(args.port)
    url = f"http://127.0.0.1:{port}"
    note = "" if port == args.port else f" (port {args.port} is taken)"
    print(f"MLflow UI: {url}{note}", flush=True)  # noqa: T201 — a command line's own output
    for line in sweep_links(Path(args.db), url):
        print(line, flush=True)  # noqa: T201
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{args.db}", "--host",
           "127.0.0.1", "--port", str(port)]
    os.execv(sys.executable, cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
