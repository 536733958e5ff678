"""The bad-input battery: every bad input through the real CLI, in a subprocess, and what it left behind.

`python -m tools.bench_badinput [--only SUBSTRING] [--no-engine]` (`make bench-badinput`).

Each case runs `python -m orchestrator ...` (or `python -m orchestrator.schedule ...`) in a fresh temp dir and
prints one Markdown row: the input, the exit code, the first line of the message, the seconds, and whether
anything started. "Nothing started" is checked, not assumed: no Ray temp dir (RAY_TMPDIR points into the case's
dir), no `mlflow.db`, `mlruns/`, `mlartifacts/` or anything else new in the working dir (Hydra's `multirun/`,
`logs/`), and no process other than the CLI itself
carrying the case's marker in its environment for 0.3 s or more, or still alive after it exits (polled from
/proc every 50 ms while the CLI runs: Ray's raylet and GCS, workers and engines all inherit it; a helper such as
`git rev-parse` lives milliseconds). A stray process would be named in the row and stopped.

With the engine section (the default) it also starts the reference engine once (`python -m workers.reference
--model-path tiny --load-format dummy`) and sends each bad `/generate` body on one keep-alive connection: status,
the error message, milliseconds, whether the connection was kept, and that a good request still succeeds after.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.server
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tools.badinput_cases import CASES, SGLANG as SGLANG, Case
from workers.engine_process import free_port

ROOT = Path(__file__).resolve().parents[1]
MARKER = "SPECSWEEP_BADINPUT_CASE"
MIN_LIFE_S = 0.3  # a process seen for this long counts as started (Ray's and engines' live for seconds)
NOISE = ("Error executing job with overrides", "Set the environment variable HYDRA_FULL_ERROR")


@dataclass
class Outcome:
    case: Case
    rc: int
    message: str
    seconds: float
    started: list[str]  # what was found started; empty = nothing
    output_tail: str = ""  # the last lines of stderr and stdout


def _marked_processes(token: str, exclude: int) -> dict[int, str]:
    """pid -> command line of every readable process whose environment carries the marker."""
    found = {}
    needle = f"{MARKER}={token}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        with contextlib.suppress(OSError):
            if needle in Path(entry.path, "environ").read_bytes():
                cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[int(entry.name)] = cmd.strip()[:80]
    return found


def _first_line(stderr: str, stdout: str) -> str:
    """The error's first informative line: for a list (invalid config, preflight) its first item as well."""
    lines = [ln.strip() for ln in (stderr + "\n" + stdout).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(NOISE) and not ln.startswith("[") and "INFO" not in ln]
    if not lines:  # a success: its last log line
        logged = [ln for ln in (stderr + "\n" + stdout).splitlines() if "INFO" in ln]
        return logged[-1].split("INFO", 1)[1].strip() if logged else ""
    first = re.sub(r"^\d{4}-\d\d-\d\d [\d:,]+ ERROR \S+: ", "", lines[0])  # a logging prefix
    if first.startswith("invalid config: ") and len(lines) > 1:
        items = [ln for ln in lines[1:] if not ln.startswith("[")]
        return f"{items[0]} [{first.removeprefix('invalid config: ')}]" if items else first
    if first.endswith(":") and len(lines) > 1:
        items = [ln for ln in lines[1:] if not ln.startswith("[") and not ln.startswith("cluster:")]
        if items and items[0].startswith("- group ") and "): " in items[0]:  # the reason, not the group's needs
            items[0] = items[0].split(" (", 1)[0] + ": " + items[0].split("): ", 1)[1]
        return f"{first} {items[0]}" if items else first
    return first


def run_case(case: Case, timeout: float = 300) -> Outcome:
    work = Path(tempfile.mkdtemp(prefix="bb-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    token = work.name
    listener = server404 = None
    try:
        for name, text in case.files.items():
            Path(work, name).parent.mkdir(parents=True, exist_ok=True)
            Path(work, name).write_text(text)
        port = 0
        if case.listen:
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            port = listener.getsockname()[1]
        elif case.closed_port:
            port = free_port()
        elif case.serve404:
            server404 = _serve_404()
            port = server404.server_address[1]
        args = [a.replace("{port}", str(port)) for a in case.args]
        env = dict(os.environ, RAY_TMPDIR=str(work / "r"), RAY_AUTH_MODE="disabled", COLUMNS="200",
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), **{MARKER: token})
        env.pop("RAY_ADDRESS", None)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", case.module, *args], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen: dict[int, tuple[str, float, float]] = {}  # pid -> (command, first seen, last seen)
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            now = time.monotonic()
            for pid, cmd in _marked_processes(token, proc.pid).items():
                seen[pid] = (cmd, seen.get(pid, (cmd, now, now))[1], now)
            time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, timeout - (time.monotonic() - t0)))
        if proc.returncode is None:
            proc.kill()
        stdout, stderr = proc.communicate()
        seconds = time.monotonic() - t0
        left = _marked_processes(token, proc.pid)
        for pid in left:  # started by this case: never left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # a helper the CLI runs for milliseconds (`git rev-parse`, `uname -p`) is not something started
        lived = {pid: cmd for pid, (cmd, first, last) in seen.items() if last - first >= MIN_LIFE_S}
        started = [f"process: {cmd}" for cmd in {**lived, **left}.values()]
        started += [f"{name} created" for name in ("r", "mlflow.db", "mlruns", "mlartifacts") if (work / name).exists()]
        inputs = {Path(name).parts[0] for name in case.files} | {"r", "mlflow.db", "mlruns", "mlartifacts"}
        started += [f"{name} left in the working dir" for name in sorted(os.listdir(work)) if name not in inputs]
        started += [f"left running: {cmd}" for cmd in left.values()]
        return Outcome(case, proc.returncode if proc.returncode is not None else -9,
                       _first_line(stderr, stdout), seconds, started, (stderr + stdout)[-3000:])
    finally:
        if listener is not None:
            listener.close()
        if server404 is not None:
            server404.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def _serve_404() -> http.server.ThreadingHTTPServer:
    """A web server that is not MLflow: every path answers 404."""
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---------------------------------------------------------------- the reference engine's request checks

GOOD = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
REQUESTS: tuple[tuple[str, Callable[[], bytes]], ...] = (
    ("text with a lone surrogate", lambda: b'{"text": "a\\ud800b", "sampling_params": {"max_new_tokens": 2}}'),
    ("max_new_tokens 1e400", lambda: b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 1e400}}'),
    ("max_new_tokens \"3\"", lambda: b'{"input_ids": [1], "sampling_params": {"max_new_tokens": "3"}}'),
    ("max_new_tokens 2.9", lambda: b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2.9}}'),
    ("temperature NaN", lambda: b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}'),
    ("temperature -5", lambda: b'{"input_ids": [1], "sampling_params": {"temperature": -5}}'),
    ("top_p 5", lambda: b'{"input_ids": [1], "sampling_params": {"top_p": 5}}'),
    ("ignore_eos \"false\"", lambda: b'{"input_ids": [1], "sampling_params": {"ignore_eos": "false"}}'),
    ("sampling_seed 2**70", lambda: b'{"input_ids": [1], "sampling_params": {"sampling_seed": %d}}' % 2**70),
    ("top_k 5 (not implemented here)", lambda: b'{"input_ids": [1], "sampling_params": {"top_k": 5}}'),
    ("stream \"false\"", lambda: b'{"input_ids": [1], "stream": "false"}'),
    ("malformed JSON", lambda: b'{"input_ids": [1'),
)


@dataclass
class RequestOutcome:
    label: str
    status: int
    message: str
    ms: float
    kept_alive: bool


def _wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    import http.client

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the reference engine exited {proc.returncode} before /health answered")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the reference engine was not healthy within {timeout_s:.0f} s")
        time.sleep(0.2)


def run_engine_requests() -> tuple[list[RequestOutcome], bool]:
    """(one row per bad body, whether a good request succeeded afterwards on the same connection)."""
    import http.client
    import json

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="bb-engine-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "workers.reference", "--model-path", "tiny", "--load-format",
                             "dummy", "--port", str(port), "--host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels")])),
                            start_new_session=True)
    try:
        _wait_healthy(port, proc, timeout_s=180)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.connect()
        rows = []
        for label, body in REQUESTS:
            sock = conn.sock
            t0 = time.monotonic()
            conn.request("POST", "/generate", body=body(), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            ms = (time.monotonic() - t0) * 1e3
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")[:100]
            rows.append(RequestOutcome(label, resp.status, message, ms, conn.sock is sock and sock is not None))
        conn.request("POST", "/generate", body=json.dumps(GOOD), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        good = resp.status == 200 and len(json.loads(resp.read())["output_ids"]) == 2
        conn.close()
        return rows, good
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        os.unlink(log.name)


# ---------------------------------------------------------------- tables


def _cell(text: str, width: int = 220) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= width else text[:width - 1] + "…"


def format_cli_table(outcomes: list[Outcome]) -> str:
    lines = ["| input | command | exit | first line of the message | s | nothing started |",
             "|---|---|---:|---|---:|---|"]
    for o in outcomes:
        cmd = f"`{'python -m ' + o.case.module + ' ' + ' '.join(o.case.args)}`"
        lines.append(f"| {o.case.label} | {_cell(cmd, 110)} | {o.rc} | {_cell(o.message)} | {o.seconds:.1f} | "
                     f"{'yes' if not o.started else 'NO: ' + _cell('; '.join(o.started), 120)} |")
    return "\n".join(lines)


def format_engine_table(rows: list[RequestOutcome], good_after: bool) -> str:
    lines = ["| bad `/generate` body | status | message | ms | keep-alive kept |", "|---|---:|---|---:|---|"]
    lines += [f"| {r.label} | {r.status} | {_cell(r.message, 120)} | {r.ms:.0f} | {'yes' if r.kept_alive else 'no'} |"
              for r in rows]
    lines.append(f"\nA good request on the same connection afterwards: {'200, 2 tokens' if good_after else 'FAILED'}.")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.machine()
    with contextlib.suppress(OSError):
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    return f"{os.cpu_count()} CPU(s) ({cpu}), Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_badinput", description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="run the cases whose label contains this")
    p.add_argument("--no-engine", action="store_true", help="skip the reference engine's request checks")
    args = p.parse_args(argv)
    cases = [c for c in CASES if args.only is None or args.only in c.label]
    print(f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, load {os.getloadavg()[0]:.1f}\n")
    outcomes = []
    for case in cases:
        outcomes.append(run_case(case))
        o = outcomes[-1]
        print(f"  {case.label}: exit {o.rc}, {o.seconds:.1f} s{'' if not o.started else ', STARTED ' + str(o.started)}",
              file=sys.stderr, flush=True)
    print(format_cli_table(outcomes))
    if not args.no_engine and args.only is None:
        rows, good = run_engine_requests()
        print()
        print(format_engine_table(rows, good))
    print()
    print(summary(outcomes))
    bad = [o for o in outcomes if (o.started and not o.case.runs) or (o.rc == 0) != o.case.runs
           or "Traceback" in o.output_tail]
    return 1 if bad else 0


def summary(outcomes: list[Outcome]) -> str:
    """The share refused before anything started, with one message and no traceback; the inputs meant to run."""
    refused = [o for o in outcomes if not o.case.runs]
    clean = [o for o in refused if o.rc != 0 and not o.started and "Traceback" not in o.output_tail]
    ran = [o for o in outcomes if o.case.runs]
    return (f"Refused before anything started, no traceback: {len(clean)} of {len(refused)} "
            f"({100 * len(clean) / max(1, len(refused)):.0f}%); inputs meant to run: "
            f"{sum(o.rc == 0 for o in ran)} of {len(ran)} exited 0.")


if __name__ == "__main__":
    sys.exit(main())
