"""A hung engine: alive, but answering nothing. Watched through its health path while a run is in flight.

    with HealthWatch(engine, timeout_s) as watch:     # engine: a started workers.engine_process.EngineProcess
        ...                                          # the run's requests
    watch.hung -> str | None                         # the failure message, once the engine was found hung

A thread asks the engine's health path (the adapter's: SGLang's /health, which itself waits up to 20 s for its
scheduler to make progress, sglang/srt/entrypoints/http_server.py:721-800; the reference and stub engines answer it
from their HTTP loop) every `timeout_s / 4` (at most POLL_MAX_S). When no answer has been 200 for `timeout_s`
(the config key `engine.health_timeout_s`), the engine is hung: the watch kills it at once (SIGKILL to its process
group: a stopped process cannot act on SIGTERM), which ends the run's requests; the runner then fails only that
run (`engine_hung`, naming the key, its value and the seconds measured) and restarts the engine for the next run
like a crashed one (GroupRunner's restart budget). An engine that exits by itself is left to the runner
(`engine_died`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import requests

if TYPE_CHECKING:
    from workers.engine_process import EngineProcess

logger = logging.getLogger(__name__)

TIMEOUT_KEY = "engine.health_timeout_s"
POLL_MAX_S = 5.0  # the cadence of the health requests (not a wait: a hang is declared by TIMEOUT_KEY alone)


class HealthWatch:
    def __init__(self, engine: EngineProcess, timeout_s: float):
        self.engine = engine
        self.timeout_s = timeout_s
        self.hung: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"health-watch:{engine.pid}", daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        http = requests.Session()
        http.trust_env = False  # never route 127.0.0.1 through a proxy from the environment
        url = self.engine.base_url + self.engine.health_path
        interval = min(POLL_MAX_S, self.timeout_s / 4)
        last_ok = time.monotonic()
        try:
            while not self._stop.wait(interval):
                if not self.engine.alive:
                    return  # exited by itself: the runner reports engine_died
                left = self.timeout_s - (time.monotonic() - last_ok)
                try:
                    ok = http.get(url, timeout=max(left, 0.1)).status_code == 200
                except requests.RequestException:
                    ok = False
                if ok:
                    last_ok = time.monotonic()
                    continue
                silent = time.monotonic() - last_ok
                if silent >= self.timeout_s and not self._stop.is_set() and self.engine.alive:
                    self.hung = (f"engine pid {self.engine.pid} is alive but did not answer {self.engine.health_path} "
                                 f"for {silent:.1f} s ({TIMEOUT_KEY}={self.timeout_s:g}): killed as hung; the next "
                                 "run restarts it")
                    logger.warning("%s", self.hung)
                    self.engine.kill()
                    return
        finally:
            http.close()
