"""verify_step_ms from /metrics counters, one formula on both engines, and the /server_info limits.

SGLang cannot run here (no GPU), but its metric code can: tests/workers/sglang/cpu_process.py builds SGLang 0.5.23's
own scheduler and tokenizer collectors (one forked process per TP rank, with the labels SGLang gives each), times
forwards with SGLang's DeviceTimer and answers /metrics through SGLang's own multiprocess route. Those texts are what
a server launched with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 exposes; a stand-in server replays them to the real
GroupRunner, and the diagnosis then evaluates rules (c) and (d) on the SGLang runs.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from orchestrator.results.diagnosis import Cause, Rule, RunRow, diagnose
from orchestrator.config.plan import build_run
from specsweep_common.spec import RunState
from workers.derived import derived_metrics
from specsweep_common.sglang_facts import FORWARD_SECONDS, VERIFY_CATEGORY
from workers.engine_counters import (parse_scrape, server_limits,
                                     verify_device_seconds, verify_step_ms, verify_timing)
from workers.runners import GroupRunner
from workers.sglang.argv import build_sglang_argv, sglang_env

from tests.workers.sglang.cpu_process import run_in_sglang_process
from tools.fake_server import JSON, PROMETHEUS, FakeServer, runner_on
from tests.workers.sglang.test_argv import _compose, _require, _sglang_installed, _write_model

TP = 2
RANK_SCALE = 1.125  # mean over the two ranks of the helper's per-rank durations (x1, x1.25)
VERIFY_MS = {4096: 2.0, 16384: 6.0}  # per verify forward, rank 0, at each run's context
STEPS = 8  # verify steps of each run's one request
GEN = 32


def _phases() -> list[dict]:
    warmup = {"forwards": [["extend", 40.0], ["target_verify", 1.0], ["target_verify", 1.0]], "verify_cts": [2]}
    runs = [{"forwards": [["extend", 30.0]] + [["eagle_draft", 0.5], ["target_verify", ms]] * STEPS,
             "verify_cts": [STEPS]} for ms in VERIFY_MS.values()]
    return [warmup, *runs]


@pytest.fixture(scope="module")
def sglang_point(tmp_path_factory):
    _require(_sglang_installed(), "sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    rc = _compose(["engine=sglang", "model=qwen3-8b", "drafter=ngram", "attention=triton", "page_size=1",
                   f"gen_tokens={GEN}", f"tp_size={TP}"])
    target = _write_model(tmp_path_factory.mktemp("m") / "qwen", rc.model)
    rc = dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=target))
    run = build_run(rc, 0)
    env = sglang_env(run.server)
    assert env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"  # the adapter turns SGLang's device timer on
    texts = run_in_sglang_process("metrics", {"argv": build_sglang_argv(run.server, 30000)[3:], "tp_size": TP,
                                              "phases": _phases()})["texts"]
    return run, texts


def test_sglang_exposition_gives_device_ms_per_verify_step(sglang_point):
    _, texts = sglang_point
    warm, first, second = (parse_scrape(t) for t in texts)
    labels = {dict(s.labels).get("category") for s in second.samples if s.name == FORWARD_SECONDS}
    assert labels == {"extend", "eagle_draft", VERIFY_CATEGORY}  # SGLang's own spelling of the verify category
    ranks = {dict(s.labels)["tp_rank"] for s in second.samples if s.name == FORWARD_SECONDS}
    assert ranks == {"0", "1"}  # one series per scheduler process: averaged, not summed
    assert verify_device_seconds(warm) == pytest.approx(2 * 1.0e-3 * RANK_SCALE)
    # Δ target_verify seconds / Δ spec_verify_calls: draft and prefill forwards and the other run left out
    assert verify_step_ms(warm, first) == pytest.approx(VERIFY_MS[4096] * RANK_SCALE)
    assert verify_step_ms(first, second) == pytest.approx(VERIFY_MS[16384] * RANK_SCALE)
    assert dict(second) == pytest.approx(parse_scrape(texts[2]))  # the totals, kept


def test_the_sglang_lines_the_code_cites():
    from tests.workers.sglang.source import sglang_line, sglang_root

    _require(sglang_root() is not None, "sglang is not installed (see docs/sglang.md)")
    assert sglang_line("srt/environ.py", "SGLANG_ENABLE_METRICS_DEVICE_TIMER = EnvBool") == 479
    assert sglang_line("srt/observability/metrics_collector.py", f'name="{FORWARD_SECONDS}"') == 1055
    assert sglang_line("srt/observability/metrics_collector.py", '"tp_rank": parallel.tp_rank') == 1385
    assert sglang_line("srt/observability/metrics_collector.py", 'name="sglang:spec_verify_calls_total"') == 1866
    assert sglang_line("srt/model_executor/runner/eager_runner.py", f'"{VERIFY_CATEGORY}"') == 345
    assert sglang_line("srt/model_executor/runner/decode_cuda_graph_runner.py",
                       "forward_batch.forward_mode.name.lower()") == 1987
    assert sglang_line("srt/managers/scheduler.py", '"max_req_input_len": self.max_req_input_len') == 1946
    assert sglang_line("srt/managers/tp_worker.py", "max_req_input_len = max_req_len - 5") == 572


def test_no_timer_or_no_verify_is_a_note_not_a_number(sglang_point):
    _, texts = sglang_point
    before, after = parse_scrape(texts[0]), parse_scrape(texts[1])
    untimed = parse_scrape("\n".join(line for line in texts[1].splitlines() if FORWARD_SECONDS not in line) + "\n")
    m = {"verify_steps": 8.0}
    assert verify_timing(before, untimed, m) == [
        "no verify_step_ms: /metrics has no sglang:forward_execution_seconds_total (SGLang needs "
        "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 and --enable-metrics)"]
    assert "verify_step_ms" not in m
    assert verify_timing(after, after, m)[0].startswith("no verify_step_ms: Δsglang:spec_verify_calls_total=0")
    assert verify_timing(before, after, {}) == [] and verify_timing(None, after, {}) == []  # no speculation


@pytest.fixture
def make_reference_engine():
    """make_reference_engine(*flags) -> the reference engine in this process (`tiny`, dummy weights, CPU)."""
    from workers.reference.args import parse_args
    from workers.reference.engine import Engine

    engines = []

    def make(*flags: str) -> Engine:
        engines.append(Engine(parse_args(["--model-path", "tiny", "--load-format", "dummy", "--context-length",
                                          "2048", *flags])))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


class SGLangStandIn(FakeServer):
    """Replays SGLang's own /metrics texts: text i until the i-th /generate has finished. /generate answers SGLang
    0.5.23's speculative meta_info for a 32-token request of STEPS verify steps; /server_info carries the limits."""

    LIMITS = {"max_req_input_len": 40954, "max_total_num_tokens": 250000}

    def __init__(self, texts: list[str]):
        self.texts, self.done = texts, 0
        super().__init__()

    def get(self, path):
        if path == "/metrics":
            return 200, self.texts[min(self.done, len(self.texts) - 1)], PROMETHEUS
        return 200, {"version": "0.5.23", "internal_states": [{}], **self.LIMITS}, JSON

    def post(self, path, body):
        if path == "/flush_cache":
            return 200, "Cache flushed.", "text/plain"
        text = json.loads(body or b"{}")["text"]
        meta = {"prompt_tokens": len(text) // 4, "completion_tokens": GEN, "e2e_latency": 0.5,
                "finish_reason": {"type": "length", "length": GEN}, "spec_verify_ct": STEPS,
                "spec_num_correct_drafts": 24, "spec_num_proposed_drafts": 4 * STEPS, "spec_accept_rate": 0.75,
                "spec_accept_length": GEN / STEPS, "spec_correct_drafts_histogram": [0, 0, 0, 8]}
        self.done += 1
        return 200, {"text": "x" * GEN, "output_ids": list(range(GEN)), "meta_info": meta}, JSON


def test_runner_records_verify_timing_on_sglang_and_rules_c_d_evaluate(sglang_point, tmp_path):
    run, texts = sglang_point
    fake = SGLangStandIn(texts)
    runner = runner_on(run.server, fake.base_url, tmp_path)
    try:
        results = [runner.run(dataclasses.replace(run, job_index=i, probe=dataclasses.replace(run.probe,
                                                                                                context_len=ctx)))
                   for i, ctx in enumerate(VERIFY_MS)]
    finally:
        fake.close()
    rows = []
    for r, (ctx, ms) in zip(results, VERIFY_MS.items()):
        assert r.state is RunState.FINISHED, r.message
        assert r.metrics["verify_step_ms"] == pytest.approx(ms * RANK_SCALE)
        assert r.metrics["prompt_tokens"] == ctx
        assert r.metrics["kv_bw_gbs"] == pytest.approx(run.server.model.kv_bytes_per_token * (ctx + GEN / 2)
                                                       / (ms * RANK_SCALE / 1000) / 1e9)
        assert {k: r.metrics[k] for k in SGLangStandIn.LIMITS} == SGLangStandIn.LIMITS
        # what a GPU node adds: the measured ceiling (no CUDA here) and NVML's utilisation
        metrics = {**r.metrics, **derived_metrics(r.metrics, run.server.model, on_gpu=True, peak_gbs=lambda: 4800.0,
                                                  weight_bytes=16.4e9), "gpu_util_mean": 95.0}
        rows.append(RunRow(run_id=f"{ctx:08d}sglang", name=f"ctx={ctx}", context_len=ctx, probe="predictable",
                           drafter="ngram", attention="triton", page_size=1, metrics=metrics, engine="sglang"))
    d = diagnose(rows)
    evaluated = {c.rule for c in d.checks if c.evaluated}
    assert {Rule.STEP_GROWTH, Rule.KV_BANDWIDTH, Rule.HOST_BOUND} <= evaluated
    assert "context^0.79" in next(c.detail for c in d.checks if c.rule is Rule.STEP_GROWTH)  # 6.75 / 2.25 over 4x
    # 16k: 2.4 GB of KV in 6.75 ms = 359 GB/s, 7.5% of 4800 GB/s: rule (c) fires on the SGLang run
    (kernel,) = [f for f in d.findings if f.cause is Cause.KERNEL_BOUND]
    assert kernel.run_ids == ("00016384sglang",) and "7.5% of the device's 4800 GB/s" in kernel.evidence[0]


def test_reference_engine_exposes_the_same_counter_and_limits(sglang_point, make_reference_engine):
    """The reference engine's /metrics has SGLang's counter with SGLang's label names, and verify_step_ms from two
    scrapes is its batched verify forwards' seconds per verify step; /server_info's limits mean what SGLang's do."""
    from workers.reference.engine import RequestError, SamplingParams
    from workers.reference.server import _metrics_text

    _, texts = sglang_point
    engine = make_reference_engine("--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4",
                                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5")
    sglang_labels = {tuple(k for k, _ in s.labels) for s in parse_scrape(texts[1]).samples if s.name == FORWARD_SECONDS}
    before = parse_scrape(_metrics_text(engine, "m"))
    out = engine.generate(list(range(1, 60)) * 2, SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True))
    after = parse_scrape(_metrics_text(engine, "m"))
    ours = {tuple(k for k, _ in s.labels) for s in after.samples if s.name == FORWARD_SECONDS}
    assert ours == sglang_labels  # model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, category
    steps = out.meta_info["spec_steps"]
    assert len(steps) == out.meta_info["spec_verify_ct"] > 0
    assert verify_step_ms(before, after) == pytest.approx(1000 * sum(s["verify_s"] for s in steps) / len(steps))
    # the limits: a prompt of max_req_input_len tokens is refused whatever max_new_tokens, one less is served
    limits = server_limits({"max_req_input_len": engine.max_req_input_len,
                            "max_total_num_tokens": engine.max_total_num_tokens})
    assert limits["max_total_num_tokens"] == engine.target.pool.num_slots
    edge = int(limits["max_req_input_len"])
    engine.check([1] * (edge - 1), SamplingParams(max_new_tokens=1))
    with pytest.raises(RequestError):
        engine.check([1] * edge, SamplingParams(max_new_tokens=1))


def test_the_floor_counts_the_weights_once_per_batched_forward():
    from tests.workers.test_derived import TINY

    m = {"prompt_tokens": 1000.0, "completion_tokens": 200.0, "verify_step_ms": 1.0, "requests": 4.0}
    kv = TINY.kv_bytes_per_token * 1100
    out = derived_metrics(m, TINY, on_gpu=True, peak_gbs=lambda: 4000.0, weight_bytes=8e9)
    assert out["floor_step_ms"] == pytest.approx(1000 * (8e9 / 4 + kv) / 4e12)  # 4 requests share one forward
    batched = derived_metrics({**m, "batch_size_mean": 3.0}, TINY, on_gpu=True, peak_gbs=lambda: 4000.0,
                              weight_bytes=8e9)
    assert batched["floor_step_ms"] == pytest.approx(1000 * (8e9 / 3 + kv) / 4e12)  # the engine's own batch count


def test_group_runner_on_the_reference_engine_uses_the_same_counters(tmp_path):
    """The real reference engine through the real GroupRunner: verify_step_ms is the counters' (Δ verify forward
    seconds / Δ verify calls), i.e. the mean of this run's step times at concurrency 1, not the steps' median."""
    import csv
    import io

    from tools.testing import tiny_run, tiny_server

    server = tiny_server("ngram", server_context_len=2048)
    runner = GroupRunner(server, tmp_path)
    try:
        assert runner.start().alive
        r = runner.run(tiny_run(server, 0, context_len=256, gen_tokens=24))
    finally:
        runner.stop()
    assert r.state is RunState.FINISHED, r.message
    steps = [float(row["verify_s"]) for row in csv.DictReader(io.StringIO(r.artifacts["steps.csv"]))]
    assert len(steps) == r.metrics["verify_steps"] > 1
    assert r.metrics["verify_step_ms"] == pytest.approx(1000 * sum(steps) / len(steps))
    assert "verify_forward_median_ms" in r.metrics and r.metrics["kv_bw_gbs"] > 0
    assert r.metrics["max_req_input_len"] == 2048 and r.metrics["max_total_num_tokens"] >= 2048
