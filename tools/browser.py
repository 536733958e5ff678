"""Headless Chromium driven over the DevTools protocol: open a page, wait until its DOM says it is ready, read the DOM,
click, take a screenshot. For the UI tests and `make screenshots` (tools/screenshots.py).

    with Browser(chromium="/usr/bin/chromium", profile=tmp / "profile") as b:
        b.goto(url)
        b.wait_for("document.querySelectorAll('.ag-row').length > 0", what="the runs table")
        rows = b.eval("[...document.querySelectorAll('.ag-row')].map(r => r.innerText)")
        b.screenshot(Path("docs/img/runs.png"))

Chromium's own `--dump-dom` / `--screenshot` switches cannot wait for a condition (only a virtual time budget) or
click; and a page served as an attachment (MLflow's /get-artifact) never renders there, so they hang. Here every wait
is on a DOM condition, bounded by a timeout that only turns a page that never gets ready into a clear error.
The protocol is spoken with aiohttp's websocket client (aiohttp comes with ray[default]); no browser is downloaded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-port=0")


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, chromium: str, profile: Path, *, width: int = 1600, height: int = 1000,
                 start_timeout_s: float = 60):
        self.chromium, self.profile, self.width, self.height = chromium, Path(profile), width, height
        self.start_timeout_s = start_timeout_s
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._proc: subprocess.Popen | None = None
        self._session: Any = None  # aiohttp.ClientSession, imported when used
        self._ws: Any = None

    # -- lifecycle

    def __enter__(self) -> "Browser":
        self.profile.mkdir(parents=True, exist_ok=True)
        (self.profile / "DevToolsActivePort").unlink(missing_ok=True)
        self._proc = subprocess.Popen([self.chromium, *FLAGS, f"--user-data-dir={self.profile}",
                                       f"--window-size={self.width},{self.height}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._loop.run_until_complete(self._connect(self._port()))
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _port(self) -> int:
        """The port Chromium picked (it writes it to <profile>/DevToolsActivePort once it listens)."""
        path = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.start_timeout_s
        while not (path.is_file() and path.read_text().strip()):
            if self._proc is not None and self._proc.poll() is not None:
                raise BrowserError(f"{self.chromium} exited {self._proc.returncode} before it listened")
            if time.monotonic() > deadline:
                raise BrowserError(f"{self.chromium} did not open its DevTools port within {self.start_timeout_s:g} s")
            time.sleep(0.1)
        return int(path.read_text().split()[0])

    async def _connect(self, port: int) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json(content_type=None)
        page = next((t for t in targets if t.get("type") == "page"), None)
        if page is None:
            raise BrowserError(f"no page target among {targets}")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)

    def __exit__(self, *exc) -> None:
        async def close() -> None:
            if self._ws is not None:
                await self._ws.close()
            if self._session is not None:
                await self._session.close()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(close())
        self._loop.close()
        if self._proc is not None:
            import os
            import signal

            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()

    # -- the protocol

    def call(self, method: str, timeout_s: float = 60, session: str | None = None, **params: Any) -> dict:
        """One DevTools command (to the page, or to an attached target's `session`); its result."""
        try:
            return self._loop.run_until_complete(asyncio.wait_for(self._call(method, params, session), timeout_s))
        except asyncio.TimeoutError:
            raise BrowserError(f"{method}: no answer within {timeout_s:g} s") from None

    async def _call(self, method: str, params: dict, session: str | None) -> dict:
        assert self._ws is not None
        msg_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params,
                                            **({"sessionId": session} if session else {})}))
        while True:
            msg = await self._ws.receive()
            if msg.type.name != "TEXT":
                raise BrowserError(f"DevTools connection closed during {method}: {msg.type.name}")
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise BrowserError(f"{method}: {data['error']}")
                return data.get("result", {})

    # -- pages

    def goto(self, url: str) -> None:
        """A full load of `url` (through about:blank: MLflow's single-page app does not re-route on a navigation
        that changes only the URL's fragment)."""
        self.call("Page.navigate", url="about:blank")
        self.wait_for_value(lambda: self.eval("location.href") == "about:blank", what="about:blank")
        out = self.call("Page.navigate", url=url)
        if out.get("errorText"):
            raise BrowserError(f"{url}: {out['errorText']}")

    def eval(self, expression: str, session: str | None = None) -> Any:
        """The value of a JavaScript expression in the page, or in a frame's `session` (promises awaited)."""
        out = self.call("Runtime.evaluate", session=session, expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression[:80]}: {out['exceptionDetails'].get('exception', {}).get('description')}")
        return out.get("result", {}).get("value")

    def wait_for(self, expression: str, *, what: str, timeout_s: float = 120) -> Any:
        """Poll a JavaScript `expression` until it is truthy; its value. The timeout only bounds a page that never
        gets ready (then BrowserError names `what`)."""
        return self.wait_for_value(lambda: self.eval(expression), what=f"{what} ({expression[:100]})",
                                   timeout_s=timeout_s)

    def wait_for_value(self, probe: Callable[[], Any], *, what: str, timeout_s: float = 120) -> Any:
        """Call `probe` until it returns something truthy; that value."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(BrowserError):  # a page mid-navigation has no context for a moment
                value = probe()
                if value:
                    return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{what}: not there within {timeout_s:g} s")
            time.sleep(0.25)

    def frame_sessions(self) -> list[str]:
        """A session per out-of-process iframe of the page (a sandboxed iframe, such as MLflow's HTML artifact
        view, runs in its own process): `eval(..., session=s)` reads inside it."""
        targets = self.call("Target.getTargets")["targetInfos"]
        return [self.call("Target.attachToTarget", targetId=t["targetId"], flatten=True)["sessionId"]
                for t in targets if t.get("type") == "iframe"]

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path, *, clip_selector: str | None = None) -> Path:
        """A PNG of the viewport (or of the element `clip_selector` matches)."""
        params: dict[str, Any] = {"format": "png"}
        if clip_selector:
            box = self.eval(f"(() => {{ const r = document.querySelector({json.dumps(clip_selector)})"
                            ".getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; })()")
            params["clip"] = {**box, "scale": 1}
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
