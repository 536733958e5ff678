"""SGLang 0.5.23's own modules, imported and run on CPU in a process of their own; JSON in, JSON out.

    python -m tests.workers.sglang.cpu_process metrics < {"argv": [...], "tp_size": N, "phases": [...]}
    python -m tests.workers.sglang.cpu_process context < {"servers": [{"argv": [...], "cases": [...]}]}

Why a process of its own: importing `sglang.srt.managers.*` patches transformers and publishes a process-wide runtime
context (`sglang.srt.runtime_context.publish`); none of it may leak into the test process. SGLang is installed with
--no-deps, so three modules it imports but never calls on these paths are stood in for: `torchvision` (the
multimodal configs; workers/sglang/argcheck.py's stub), `setproctitle` and `uvloop` (process titles and the event
loop policy, set at import by scheduler.py and tokenizer_manager.py). Everything else is SGLang's code.

metrics: each phase is run by one forked process per TP rank (as SGLang runs one scheduler process per rank), which
builds SGLang's scheduler collector with the labels SGLang gives that rank (`SchedulerMetricsCollector.init_new`
after `publish(..., ranks=SpawnRanks(world_rank=rank))`) and times its forwards with SGLang's `DeviceTimer`
(`device_timer_ctx(timer, category)`, the reporter doing what `metrics_reporter.py:333-338` does); CUDA events do not
exist on CPU, so the timer's events read a clock the phase advances by the forward's duration. One more forked
process plays the tokenizer manager (`TokenizerMetricsCollector.observe_one_finished_request` with each finished
request's spec_verify_ct). After each phase the parent answers GET /metrics through SGLang's own route
(`add_prometheus_middleware`, a multiprocess collector over PROMETHEUS_MULTIPROC_DIR): the texts are printed.

context: for each server argv (`prepare_server_args` + `publish`), each case (prompt tokens, max_new_tokens, KV pool
tokens) goes through SGLang's length rules in order: `TokenizerManager._validate_one_request` (400 on refusal),
`TpModelWorker.get_worker_info` (max_req_len, max_req_input_len), `Scheduler.init_req_max_new_tokens` (the clamp) and
`validate_input_length` (the abort); printed: refusal, abort, the max_new_tokens SGLang keeps, the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace as NS


def _stub_missing_modules() -> None:
    from workers.sglang.argcheck import prepare_sglang_imports

    prepare_sglang_imports(None)  # torchvision
    if importlib.util.find_spec("setproctitle") is None:
        sys.modules["setproctitle"] = types.ModuleType("setproctitle")
        sys.modules["setproctitle"].setproctitle = lambda *a, **k: None  # type: ignore[attr-defined]
    if importlib.util.find_spec("uvloop") is None:
        sys.modules["uvloop"] = types.ModuleType("uvloop")
        sys.modules["uvloop"].EventLoopPolicy = asyncio.DefaultEventLoopPolicy  # type: ignore[attr-defined]


class _Clock:
    """Stands in for the device clock of CUDA events: a time the phase advances by each forward's duration."""

    now_ms = 0.0


class _Event:
    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self, stream=None):
        self.t = _Clock.now_ms

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_Event") -> float:
        return end.t - self.t


def _publish(argv: list[str], world_rank: int | None = None):
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(list(argv))
    publish(server_args, role="test", ranks=None if world_rank is None else SpawnRanks(world_rank=world_rank))
    return server_args


def _in_child(fn) -> None:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent through the exit status
            print(f"child failed: {type(e).__name__}: {e}", file=sys.stderr)
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("a forked SGLang process failed (its error is on stderr)")


def _scheduler_phase(argv: list[str], rank: int, forwards: list[list]) -> None:
    import torch

    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    from sglang.srt.utils.device_timer import DeviceTimer, device_timer_ctx

    server_args = _publish(argv, rank)
    collector = SchedulerMetricsCollector.init_new(server_args=server_args, enable_priority_scheduling=False,
                                                   enable_lora=False, enable_hierarchical_cache=False).collector
    torch.get_device_module = lambda *a: NS(Event=_Event, current_stream=lambda: None)  # no CUDA here
    timer = DeviceTimer(reporter=lambda **kw: collector.increment_forward_execution_seconds(**kw))
    for category, ms in forwards:
        with device_timer_ctx(timer, category):
            _Clock.now_ms += ms * (1.0 + 0.25 * rank)  # ranks differ a little: the reader must not sum them
    timer._report()


def _tokenizer_phase(argv: list[str], verify_cts: list[int]) -> None:
    from sglang.srt.observability.metrics_collector import TokenizerMetricsCollector, tokenizer_metric_labels

    server_args = _publish(argv)
    labels = tokenizer_metric_labels()
    collector = TokenizerMetricsCollector(server_args=server_args, labels=labels)
    for ct in verify_cts:
        collector.observe_one_finished_request(labels, prompt_tokens=100, generation_tokens=32, cached_tokens=0,
                                               e2e_latency=1.0, has_grammar=False, spec_verify_ct=ct)


def _scrape() -> str:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from sglang.srt.utils.common import add_prometheus_middleware

    app = Starlette()
    add_prometheus_middleware(app)
    with TestClient(app) as client:
        return client.get("/metrics").text


def metrics(job: dict) -> dict:
    argv, texts = job["argv"], []
    for phase in job["phases"]:
        for rank in range(job.get("tp_size", 1)):
            _in_child(lambda: _scheduler_phase(argv, rank, phase.get("forwards", [])))  # noqa: B023 - run at once
        if phase.get("verify_cts"):
            _in_child(lambda: _tokenizer_phase(argv, phase["verify_cts"]))  # noqa: B023
        texts.append(_scrape())
    return {"texts": texts}


def _one_case(server_args, case: dict, reserve: int) -> dict:
    from sglang.srt.environ import envs
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.managers.utils import validate_input_length
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.runtime_context import get_schedule, get_serving

    context, prompt, gen, page = server_args.context_length, case["prompt"], case["gen"], server_args.page_size
    kv = case.get("max_total_tokens") or 4 * context
    out: dict = {"id": case["id"], "reserve": reserve}
    tm = object.__new__(TokenizerManager)
    tm.context_len, tm.num_reserved_tokens, tm.validate_total_tokens = context, reserve, True
    tm.allow_auto_truncate = get_serving().allow_auto_truncate
    tm.model_config = NS(joint_head_config=None, pointer_head=None)
    obj = GenerateReqInput(input_ids=[1] * prompt, sampling_params={"max_new_tokens": gen})
    try:
        tm._validate_one_request(obj, [1] * prompt)
        out["refused"] = None
    except ValueError as e:
        out["refused"] = str(e)
    worker = object.__new__(TpModelWorker)
    worker._model_runner = NS(effective_logical_max_total_num_tokens=kv, logical_max_total_num_tokens=kv,
                             token_to_kv_pool_allocator=object(), max_running_requests=48, forward_stream=None,
                             req_to_token_pool=NS(size=48, max_context_len=context),
                             token_to_kv_pool=NS(size=kv))
    worker.model_config, worker.dllm_algorithm, worker.random_seed, worker.device = NS(context_len=context), None, 0, "cpu"
    info = worker.get_worker_info()
    out["max_total_num_tokens"], out["max_req_len"], out["max_req_input_len"] = info[0], info[4], info[5]
    allocator = object.__new__(PagedTokenToKVPoolAllocator if page > 1 else TokenToKVPoolAllocator)
    allocator.page_size = page
    sched = object.__new__(Scheduler)
    sched.max_new_tokens_limit = envs.SGLANG_MAX_NEW_TOKENS_LIMIT.get()
    sched.max_req_len, sched.max_req_input_len, sched.max_total_num_tokens = info[4], info[5], kv
    sched.kv_shard_widening, sched.page_size, sched.token_to_kv_pool_allocator = 1, page, allocator
    sched.sliding_window_size, sched.chunked_prefill_size = None, get_schedule().chunked_prefill_size
    aborts: list[str] = []
    req = NS(rid="r", origin_input_ids=[1] * prompt, sampling_params=NS(max_new_tokens=gen, min_new_tokens=0),
             set_finish_with_abort=aborts.append)
    sched.init_req_max_new_tokens(req)
    error = validate_input_length(req, sched.max_req_input_len, get_serving().allow_auto_truncate)
    out["aborted"] = "; ".join(aborts + ([error] if error else [])) or None
    out["max_new_tokens"] = req.sampling_params.max_new_tokens
    return out


def context(job: dict) -> dict:
    from sglang.srt.managers.utils import compute_num_reserved_tokens

    results = []
    for server in job["servers"]:
        server_args = _publish(server["argv"])
        reserve = compute_num_reserved_tokens()
        results += [_one_case(server_args, case, reserve) for case in server["cases"]]
    return {"results": results}


def run_in_sglang_process(command: str, job: dict, timeout_s: float = 900.0) -> dict:
    """The test side: `command` on `job` in a new process; its JSON answer."""
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-m", "tests.workers.sglang.cpu_process", command], input=json.dumps(job),
                          capture_output=True, text=True, cwd=root, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": str(root)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"SGLang's code failed:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def main() -> int:
    command = sys.argv[1]
    job = json.loads(sys.stdin.read())
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="sglang-prom-")  # before prometheus_client
    import logging

    logging.basicConfig(level=logging.ERROR)
    with contextlib.redirect_stdout(sys.stderr):  # SGLang prints; stdout carries the answer only
        _stub_missing_modules()
        result = {"metrics": metrics, "context": context}[command](job)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
