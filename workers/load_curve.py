"""A load curve on the node that runs the server: start the configuration's engine, run SGLang's bench_serving
against it once per level, stop it. Plain Python (no Ray): `orchestrator.load` runs it in a Ray actor placed like
the configuration's server, tests call it directly.

    run_load_curve(server, log_dir, spec, node_tags=None) -> LoadCurveOutcome    never raises: failures are data

Why on the server's node: bench_serving's TTFT, ITL and E2E are client clocks (sglang/benchmark/serving.py:735-797);
a client across the network adds the round trip to every one of them.

The engine is started with SGLang's per-request metrics file (`--export-metrics-to-file`, adapter
`request_export_flags`): bench_serving's result file keeps no per-request speculative field (its per-request
details are input/output lengths, TTFTs, ITLs, texts and errors, serving.py:1945-1951; the per-request
`spec_accept_length` it parses, :763-766, is dropped), while the engine's record of each finished request carries
its `spec_verify_ct` and `completion_tokens`. The records a level's bench_serving produced are the ones appended
while it ran, less its warm-up requests (`--warmup-requests`, finished before the timed ones start, :1491-1525).

bench_serving runs as `python -m workers.sglang.bench_serving` (SGLang's `cli_main`, unchanged; see there), an argv
list, in a scratch directory of the run's log dir, each level writing one line to one JSONL (`--output-file`, the
file appended, :1961-1966). `--model` and `--tokenizer` are /model_info's `tokenizer_path` (docs/engine.md): a
served name such as `smollm2-135m` is no Hub id.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import requests

from specsweep_common.load import LoadLevel, LoadSpec
from specsweep_common.spec import ServerSpec
from workers.engine_process import EngineProcess
from workers.errors import EngineStartFailed
from workers.registry import adapter_for

logger = logging.getLogger(__name__)

BENCH_MODULE = "workers.sglang.bench_serving"
EXPORT_GLOB = "sglang-request-metrics-*.log"  # workers/reference/request_export.py, SGLang's file name
WARMUP_REQUESTS = 1  # bench_serving's default (--warmup-requests)
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LevelOutcome:
    level: LoadLevel
    record: dict[str, Any] | None = None  # bench_serving's JSONL line of this level (with --output-details)
    requests: list[dict[str, Any]] = field(default_factory=list)  # the engine's per-request records, warm-up out
    error: str | None = None
    wall_s: float = 0.0


@dataclass
class LoadCurveOutcome:
    levels: list[LevelOutcome] = field(default_factory=list)
    jsonl: str = ""  # bench_serving's result file as written: every level's line, the raw record
    tokenizer: str | None = None
    error: str | None = None  # the engine did not start, or no tokenizer to give bench_serving
    engine_log_tail: str = ""
    node: dict[str, str] = field(default_factory=dict)
    engine_startup_s: float = 0.0


def bench_argv(base_url: str, tokenizer: str, level: LoadLevel, prompts: int, spec: LoadSpec,
               output_file: str) -> list[str]:
    """One level's bench_serving command line (flags: sglang/benchmark/serving.py cli_main, :2298-2712)."""
    argv = [sys.executable, "-m", BENCH_MODULE, "--backend", spec.backend, "--base-url", base_url,
            "--model", tokenizer, "--tokenizer", tokenizer, "--dataset-name", "random-ids",
            "--random-input-len", str(spec.input_len), "--random-output-len", str(spec.output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(prompts), "--seed", str(spec.seed),
            "--request-rate", str(level.request_rate), "--warmup-requests", str(WARMUP_REQUESTS),
            "--output-file", output_file, "--output-details", "--disable-tqdm"]
    if level.concurrency is not None:
        argv += ["--max-concurrency", str(level.concurrency)]
    if spec.goodput_ms:
        argv += ["--goodput", *(f"{k}:{v:g}" for k, v in spec.goodput_ms)]
    return argv + list(spec.extra_args)


def _export_records(directory: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob(EXPORT_GLOB)):  # hourly files: the name sorts by time
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def _settled_records(directory: Path, want: int, deadline_s: float = 10.0) -> list[dict[str, Any]]:
    """The records once `want` are there or their number stopped growing (SGLang writes them from a task of its
    own, after the response: they may trail the client by a moment)."""
    t_end = time.monotonic() + deadline_s
    last, since = -1, time.monotonic()
    while True:
        records = _export_records(directory)
        if len(records) >= want or time.monotonic() > t_end:
            return records
        if len(records) != last:
            last, since = len(records), time.monotonic()
        elif time.monotonic() - since > 2.0:
            return records
        time.sleep(0.1)


def _model_info_tokenizer(base_url: str) -> str | None:
    s = requests.Session()
    s.trust_env = False
    r = s.get(base_url + "/model_info", timeout=30)
    if r.status_code != 200:
        return None
    path = r.json().get("tokenizer_path")
    return str(path) if path else None


def run_load_curve(server: ServerSpec, log_dir: str | os.PathLike, spec: LoadSpec,
                   node_tags: dict[str, str] | None = None) -> LoadCurveOutcome:
    adapter = adapter_for(server.engine.kind)
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"load-{server.key}-", dir=log_dir))
    export_dir = work / "request-metrics"
    flags = tuple(adapter.request_export_flags(str(export_dir)))
    served = replace(server, engine=replace(server.engine, extra_args=(*server.engine.extra_args, *flags)))
    out = LoadCurveOutcome(node=dict(node_tags or {}))
    env = {"SPECSWEEP_NODE_ID": out.node["node_id"]} if "node_id" in out.node else {}
    engine = EngineProcess.for_server(served, work / "engine.log", env=env)
    t0 = time.perf_counter()
    try:
        engine.start()
    except EngineStartFailed as e:
        out.error, out.engine_log_tail = f"the engine did not start: {e.message}", e.log_tail
        return out
    out.engine_startup_s = time.perf_counter() - t0
    result_file = work / "bench_serving.jsonl"
    try:
        out.tokenizer = spec.tokenizer or _model_info_tokenizer(engine.base_url)
        if not out.tokenizer:
            out.error = (f"{engine.base_url}/model_info has no tokenizer_path: set the load's `tokenizer` to a "
                         "tokenizer directory bench_serving can load")
            return out
        bench_env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p))
        for level, prompts in zip(spec.levels, spec.prompts):
            out.levels.append(_one_level(engine, level, prompts, spec, out.tokenizer, result_file, export_dir,
                                         work, bench_env))
    finally:
        out.engine_log_tail = engine.log_tail()
        engine.stop()
        if result_file.exists():
            out.jsonl = result_file.read_text(encoding="utf-8")
    return out


def _one_level(engine: EngineProcess, level: LoadLevel, prompts: int, spec: LoadSpec, tokenizer: str,
               result_file: Path, export_dir: Path, work: Path, env: dict[str, str]) -> LevelOutcome:
    got = LevelOutcome(level)
    before_lines = len(result_file.read_text().splitlines()) if result_file.exists() else 0
    before_records = len(_export_records(export_dir)) if export_dir.exists() else 0
    argv = bench_argv(engine.base_url, tokenizer, level, prompts, spec, str(result_file))
    logger.info("load level %s: %d request(s): %s", level.label, prompts, " ".join(argv[3:]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=spec.timeout_s)
    except subprocess.TimeoutExpired:
        got.error, got.wall_s = f"bench_serving ran past {spec.timeout_s:g} s", time.perf_counter() - t0
        return got
    got.wall_s = time.perf_counter() - t0
    (work / f"bench_serving-{level.label}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    lines = result_file.read_text().splitlines() if result_file.exists() else []
    if proc.returncode != 0 or len(lines) <= before_lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        got.error = f"bench_serving exited {proc.returncode} with no result line: {' | '.join(tail)[-800:]}"
        return got
    got.record = json.loads(lines[-1])
    if not engine.alive:
        got.error = f"the engine exited during the level (code {engine.poll()})"
    want = before_records + WARMUP_REQUESTS + int(got.record.get("completed", 0))
    records = _settled_records(export_dir, want) if export_dir.exists() else []
    got.requests = records[before_records + WARMUP_REQUESTS:]
    return got
