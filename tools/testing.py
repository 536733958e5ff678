"""Test and benchmark helpers: spec builders for the tiny reference engine and the stub engine (no Hydra needed).

Imported by tests/ and the benchmarks (tools/bench_*.py) only, never by product code.

    tiny_server(drafter="oracle"|"ngram"|"none", num_steps=4, page_size=PAGE_SIZE, server_context_len=4096) -> ServerSpec
    tiny_run(server, job_index, kind=ProbeKind.PREDICTABLE, context_len=64, gen_tokens=8) -> RunSpec
    tiny_group(server, runs) -> ServerGroup
    stub_server(tp_size=1, nnodes=1, token_s=, prefill_s=, startup_s=, seed=0) -> ServerSpec   (engine.kind=stub;
        the timing defaults are StubOptions')
    pid_alive(pid) -> bool
    proc_argv(pid) -> [str], proc_env(pid) -> {name: value}       a live process's command line and environment
    engines_under(root_pid) -> {pid: base_url}     reference / stub engines (rank 0) started below a process
    stub_starts(folder) -> [StubStart]             every stub engine start in the engine logs under a folder
    wait_for_request(root_pid, finished=None) -> pid
        an engine below root_pid while it runs a /generate after `finished` requests (its own /metrics)
    spec_flags(algorithm, steps=, draft=None, topk=None, tokens=None, layers=None) -> list[str]
        the reference engine's --speculative-* argv
    (the HTTP stand-in for a server that cannot run here, FakeServer and runner_on: tools/fake_server.py; a test
    Ray: tools/ray_testing.py; conf/ composed by Hydra: tools/composed_config.py)
    reference_process(argv, ready_s=120) -> (base_url, Popen)   a context manager: `python -m workers.reference`
        with argv (+ --host/--port) on a free port, healthy; SIGTERM (then kill) after
    load_scale() -> float; scaled(seconds) -> float
        a deadline in a test is `scaled(s)`: s on an idle machine, s x (1-minute load / cores) on a loaded one
        (capped at MAX_LOAD_SCALE), so a busy machine makes a test slower, never wrong
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator

import requests

from orchestrator.config.plan import server_engine
from orchestrator.config.run_config import RunConfig
from specsweep_common.builtin_models import TINY
from specsweep_common.spec import (Algorithm, AttentionSpec, DrafterSpec, EngineKind, EngineSpec, ProbeKind,
                                  ProbeSpec, RunSpec, ServerGroup, ServerSpec, StubOptions, stable_hash)
from workers.engine_counters import parse_scrape

MAX_LOAD_SCALE = 8.0
ROOT = Path(__file__).resolve().parents[1]


def load_scale() -> float:
    """How much slower than idle this machine runs now: the 1-minute load average per core, at least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return min(MAX_LOAD_SCALE, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """A test's deadline of `seconds` on an idle machine, stretched by the current load (`load_scale`)."""
    return seconds * load_scale()


# Defaults read from their one declaration, never restated: the built-in model's geometry and the config's page size.
PAGE_SIZE = RunConfig.page_size


def tiny_drafter(kind: str = "oracle", num_steps: int = 4) -> DrafterSpec:
    if kind == "oracle":
        return DrafterSpec(name="oracle", algorithm=Algorithm.STANDALONE, draft_model_path=TINY.path,
                           num_steps=num_steps, topk=1, num_draft_tokens=num_steps + 1, is_oracle=True)
    if kind == "ngram":
        return DrafterSpec(name="ngram", algorithm=Algorithm.NGRAM, num_steps=num_steps, topk=1,
                           num_draft_tokens=num_steps + 1)
    return DrafterSpec(name="none", algorithm=Algorithm.NONE)


def tiny_server(drafter: str = "oracle", *, num_steps: int = 4, page_size: int = PAGE_SIZE, server_context_len: int = 4096,
                startup_timeout_s: float = 120.0, request_timeout_s: float = 120.0, seed: int = 0) -> ServerSpec:
    return ServerSpec(engine=EngineSpec(kind=EngineKind.REFERENCE, version="0.1.0", startup_timeout_s=startup_timeout_s,
                                        request_timeout_s=request_timeout_s),
                      model=TINY, drafter=tiny_drafter(drafter, num_steps),
                      attention=AttentionSpec(name="torch", backend="torch"), page_size=page_size,
                      server_context_len=server_context_len, seed=seed)


def tiny_run(server: ServerSpec, job_index: int, kind: ProbeKind = ProbeKind.PREDICTABLE, *, context_len: int = 64,
             gen_tokens: int = 8, seed: int = 0) -> RunSpec:
    probe = ProbeSpec(kind=kind, context_len=context_len, gen_tokens=gen_tokens, seed=seed)
    name = f"ctx={context_len} probe={kind.value} drafter={server.drafter.name} page={server.page_size} #{job_index}"
    params = (("context_len", str(context_len)), ("probe", kind.value), ("drafter", server.drafter.name),
              ("page_size", str(server.page_size)), ("gen_tokens", str(gen_tokens)))
    return RunSpec(job_index=job_index, server=server, probe=probe, run_hash=stable_hash(server, probe, job_index),
                   name=name, params=params)


def tiny_group(server: ServerSpec, runs: list[RunSpec] | tuple[RunSpec, ...]) -> ServerGroup:
    return ServerGroup(server=server, runs=tuple(runs))


def stub_server(*, tp_size: int = 1, nnodes: int = 1, token_s: float = StubOptions.token_s,
                prefill_s: float = StubOptions.prefill_s, startup_s: float = StubOptions.startup_s,
                drafter: str = "oracle", seed: int = 0,
                extra_args: tuple[str, ...] = ()) -> ServerSpec:
    """A ServerSpec for the stub engine (workers/stub/server.py): `device=cuda`, so it takes tp_size / nnodes GPUs
    per node from Ray like a real GPU server. Distinct seeds make distinct servers."""
    timing = StubOptions(token_s=token_s, prefill_s=prefill_s, startup_s=startup_s)
    engine = server_engine(EngineSpec(kind=EngineKind.STUB, version="0.1.0", device="cuda", startup_timeout_s=60.0,
                                    request_timeout_s=120.0, extra_args=tuple(extra_args), stub=timing))
    return ServerSpec(engine=engine, model=TINY, drafter=tiny_drafter(drafter), attention=AttentionSpec("torch", "torch"),
                      page_size=PAGE_SIZE, server_context_len=TINY.max_context_len, seed=seed, tp_size=tp_size, nnodes=nnodes)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def proc_argv(pid: int) -> list[str]:
    """A live process's command line (/proc/<pid>/cmdline); OSError once it is gone."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace").removesuffix("\0").split("\0")


def proc_env(pid: int) -> dict[str, str]:
    """A live process's environment as it was exec'd (/proc/<pid>/environ); OSError once it is gone."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().decode(errors="replace").split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


def spec_flags(algorithm: str, *, steps: int, draft: str | None = None, topk: int | None = None,
               tokens: int | None = None, layers: int | None = None) -> list[str]:
    """--speculative-* flags of the reference engine; None leaves a flag to the engine's default."""
    flags = {"--speculative-algorithm": algorithm, "--speculative-draft-model-path": draft,
             "--speculative-draft-num-layers": layers, "--speculative-num-steps": steps,
             "--speculative-eagle-topk": topk, "--speculative-num-draft-tokens": tokens}
    return [a for flag, value in flags.items() if value is not None for a in (flag, str(value))]


ENGINE_MODULES = ("workers.reference", "workers.stub.server")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    out[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _flag(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv[:-1] else default


def engines_under(root_pid: int) -> dict[int, str]:
    """pid -> base URL of every engine process (the reference or the stub engine, rank 0: the one serving HTTP)
    descended from `root_pid` (a driver, or a test process running Ray), read from /proc."""
    children, stack, out = _children(), [root_pid], {}
    while stack:
        for pid in children.get(stack.pop(), []):
            stack.append(pid)
            try:
                argv = proc_argv(pid)
            except OSError:
                continue
            if len(argv) > 2 and argv[1] == "-m" and argv[2] in ENGINE_MODULES and _flag(argv, "--node-rank", "0") == "0":
                out[pid] = f"http://{_flag(argv, '--host', '127.0.0.1')}:{_flag(argv, '--port', '30000')}"
    return out


def wait_for_request(root_pid: int, *, finished: int | Collection[int] | None = None, timeout_s: float = 120.0) -> int:
    """The pid of an engine below `root_pid` (`engines_under`) while it runs a /generate, once it has finished
    `finished` requests (a count, any of several, or None: any): its /metrics `sglang:num_running_reqs` >= 1 and
    `sglang:num_requests_total`. With one request per run, finished=k is the engine's (k+1)-th run."""
    accept = None if finished is None else {finished} if isinstance(finished, int) else set(finished)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid, url in engines_under(root_pid).items():
            try:
                m = parse_scrape(requests.get(url + "/metrics", timeout=2).text)
            except (requests.RequestException, ValueError):
                continue  # not serving yet, or gone
            if m.get("sglang:num_running_reqs", 0) >= 1 and \
                    (accept is None or int(m.get("sglang:num_requests_total", -1)) in accept):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no engine below pid {root_pid} ran a request after {finished} finished ones "
                         f"within {timeout_s:.0f} s")


_STUB_START = re.compile(r" stub: started (.*)$")


@dataclass(frozen=True)
class StubStart:
    """One stub engine process, from its start-up line (workers.stub.server.log_start) in an engine log."""

    pid: int
    node_rank: int
    nnodes: int
    tp_size: int
    dist_init_addr: str  # "None" on one node
    cuda_visible_devices: str
    node_id: str  # SPECSWEEP_NODE_ID: the Ray node the runner ran on ("" outside Ray)
    argv: tuple[str, ...]  # the command line EngineProcess logged above it (secrets masked)
    log: Path


def stub_starts(folder: str | os.PathLike) -> list[StubStart]:
    """Every stub engine start logged in the engine logs (`engine-*.log`, any depth) under `folder`."""
    out = []
    for path in sorted(Path(folder).rglob("engine-*.log")):
        argv: tuple[str, ...] = ()
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("$ "):
                argv = tuple(line[2:].split())
            elif m := _STUB_START.search(line):
                f = dict(field.split("=", 1) for field in m[1].split())
                out.append(StubStart(pid=int(f["pid"]), node_rank=int(f["node_rank"]), nnodes=int(f["nnodes"]),
                                     tp_size=int(f["tp_size"]), dist_init_addr=f["dist_init_addr"],
                                     cuda_visible_devices=f["CUDA_VISIBLE_DEVICES"], node_id=f["node_id"],
                                     argv=argv, log=path))
    return out


def stop_process(proc: subprocess.Popen, grace_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@contextlib.contextmanager
def reference_process(argv: list[str], ready_s: float = 120.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """The reference engine as a real process on a free port (stdout+stderr piped, text), once /health is 200."""
    from workers.engine_process import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "workers.reference", *argv, "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + scaled(ready_s)
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the reference engine exited {proc.returncode}: {proc.stdout.read()[-2000:] if proc.stdout else ''}")
            try:
                if requests.get(f"{url}/health", timeout=10).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not listening yet / a loaded machine
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the reference engine was not healthy within {scaled(ready_s):.0f} s")
            time.sleep(0.2)
        yield url, proc
    finally:
        stop_process(proc)
