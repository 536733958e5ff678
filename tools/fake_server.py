"""An HTTP stand-in for a server that cannot run here (SGLang without a GPU), shared by the tests that drive the
real GroupRunner or probe against one.

    FakeServer: subclass it with get(path) -> Reply | None and post(path, body: bytes) -> Reply | None
        (Reply = (status, body, content type); a dict/list body is sent as JSON; None is a 404, except GET /health,
        which answers 200 as SGLang's does while it serves); .base_url, .close(), a context manager. A threaded
        http.server on 127.0.0.1, on a port the OS picks.
    runner_on(server, base_url, work_dir) -> GroupRunner   its engine already running at base_url, shown to the
        runner as EngineProcess shows one (pid, alive, base_url, health_path: the runner's health watch polls it)
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from specsweep_common.spec import ServerSpec

Reply = tuple[int, "str | bytes | dict | list", str]  # (status, body: a dict/list is sent as JSON, content type)
JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4"
HEALTH = "/health"  # SGLang's liveness route (workers.adapter.EngineAdapter.health_path)


class FakeServer:
    """An HTTP server on 127.0.0.1 (a free port) whose answers come from `get` / `post` of a subclass; a 404 for
    anything they do not answer. Threaded, like the servers it stands in for; `close()` stops it."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def get(self, path: str) -> Reply | None:
        return None

    def post(self, path: str, body: bytes) -> Reply | None:
        return None

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, reply: Reply | None) -> None:
                code, body, ctype = reply or (404, {}, JSON)
                data = json.dumps(body).encode() if isinstance(body, (dict, list)) else \
                    body.encode() if isinstance(body, str) else body
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                reply = fake.get(self.path)
                self._send(reply if reply is not None or self.path != HEALTH else (200, "", "text/plain"))

            def do_POST(self):
                self._send(fake.post(self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0))))

        return Handler


def runner_on(server: ServerSpec, base_url: str, work_dir: str | os.PathLike) -> Any:
    """workers.runners.GroupRunner for `server`, its engine already running at `base_url` (a FakeServer): the
    runner's run path without an engine process."""
    from workers.runners import GroupRunner

    runner = GroupRunner(server, Path(work_dir))

    class Engine:  # the running engine, as EngineProcess shows it to the runner
        pid, alive = os.getpid(), True
        health_path = runner.adapter.health_path

        def __init__(self) -> None:
            self.base_url = base_url

        def kill(self) -> None:  # the health watch's verdict on a server that stopped answering
            self.alive = False

        def log_tail(self) -> str:
            return ""

        def poll(self) -> None:
            return None

        def stop(self) -> None:
            pass

    runner.engine, runner.engine_starts = cast(Any, Engine()), 1
    return runner
