"""What a run records from an SGLang server: /server_info's resolved args (from SGLang 0.5.23's own resolver), the
changes SGLang made to what the config asked, the per-depth acceptance, the /metrics cross-check (and that
/server_info's windowed accept length is not recorded), and probe.concurrency as parallel requests.

An SGLang server cannot run here (no GPU). The stand-in below serves SGLang 0.5.23's HTTP subset in its documented
formats (`sglang/srt/entrypoints/http_server.py:854-863`): its /server_info fields are what SGLang's `ServerArgs.resolved_dict()`
returned for the run's own argv (workers/sglang/argcheck.py, a real parse + resolve), its /metrics is Prometheus
text with SGLang's metric names, and it resets avg_spec_accept_length in /flush_cache as SGLang does.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from orchestrator.config.plan import build_run
from specsweep_common.spec import RunState
from workers.probe import run_probe
from tools.fake_server import JSON, PROMETHEUS, FakeServer, runner_on
from workers.sglang.observe import read_server_args
from workers.sglang.argv import SERVER_INFO_FIELDS, build_sglang_argv, expected_server_args, reported_server_args

from tests.workers.sglang.test_argv import _check, _compose, _require, _sglang_installed, _write_model

# one request: 64 tokens in 21 verify steps, 2 drafts accepted per step on average (42 of 21 x 4 NGRAM nodes)
HISTOGRAM = [2, 4, 7, 8]  # verify steps that accepted k = 0..3 drafts: 21 steps, 42 drafts


class FakeSGLang(FakeServer):
    """SGLang 0.5.23's /generate, /flush_cache, /server_info and /metrics, with the counters they imply."""

    def __init__(self, resolved: dict):
        self.resolved = resolved
        self.lock = threading.Lock()
        self.generation_tokens, self.verify_calls = 1000.0, 400.0  # Prometheus counters since start
        self.accept_tokens, self.forward_ct = 50.0, 20.0  # MetricsReporter's, reset by /flush_cache
        self.requests = 0
        super().__init__()

    def meta(self, prompt_tokens: int) -> dict:
        return {"id": "r", "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": prompt_tokens,
                "completion_tokens": 64, "cached_tokens": 0, "e2e_latency": 0.5, "spec_verify_ct": 21,
                "spec_accept_rate": 42 / 84, "spec_accept_length": 64 / 21, "spec_num_correct_drafts": 42,
                "spec_num_proposed_drafts": 84, "spec_correct_drafts_histogram": HISTOGRAM}

    def get(self, path):
        if path == "/server_info":
            with self.lock:
                avg = self.accept_tokens / self.forward_ct if self.forward_ct else None
            state = {"last_gen_throughput": 1.0, "memory_usage": {}}
            if avg is not None:
                state["avg_spec_accept_length"] = avg
            return 200, {**self.resolved, "launch_command": "x", "version": "0.5.23", "internal_states": [state]}, JSON
        if path == "/metrics":
            with self.lock:
                return 200, ("# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
                             "# TYPE sglang:generation_tokens_total counter\n"
                             f'sglang:generation_tokens_total{{model_name="m"}} {self.generation_tokens}\n'
                             "# HELP sglang:spec_verify_calls_total Number of speculative verify calls.\n"
                             "# TYPE sglang:spec_verify_calls_total counter\n"
                             f'sglang:spec_verify_calls_total{{model_name="m"}} {self.verify_calls}\n'
                             "# TYPE sglang:spec_accept_length gauge\n"
                             'sglang:spec_accept_length{model_name="m"} 2.9\n'), PROMETHEUS
        return None

    def post(self, path, body):
        if path == "/flush_cache":
            with self.lock:
                self.accept_tokens = self.forward_ct = 0.0
            return 200, "Cache flushed.", "text/plain"
        if path == "/generate":
            request = json.loads(body or b"{}")
            prompt = request.get("input_ids") or request.get("text") or ""
            with self.lock:
                self.requests += 1
                self.generation_tokens += 64
                self.verify_calls += 21
                self.accept_tokens += 64
                self.forward_ct += 21
            return 200, {"text": "x" * 64, "output_ids": list(range(64)), "meta_info": self.meta(len(prompt))}, JSON
        return None


@pytest.fixture(scope="module")
def ngram_point(tmp_path_factory, pytestconfig):
    """qwen3-8b x drafter=ngram (num_steps 4, 5 draft tokens) on SGLang 0.5.23, and SGLang's own resolution."""
    _require(_sglang_installed(), "sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    rc = _compose(["engine=sglang", "model=qwen3-8b", "drafter=ngram", "attention=triton", "page_size=1",
                   "context_len=256", "gen_tokens=64"])
    target = _write_model(tmp_path_factory.mktemp("m") / "qwen", rc.model)
    rc = dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=target))
    run = build_run(rc, 0)
    results = _check([("ngram", build_sglang_argv(run.server, 30000)[3:], {}, "0.5.23")], cache=pytestconfig.cache,
                     label="ngram-point", models=Path(target).parent)
    assert results["ngram"]["ok"], results["ngram"]["error"]
    return run, results["ngram"]["resolved"]


@pytest.fixture
def fake(ngram_point):
    server = FakeSGLang(ngram_point[1])
    yield server
    server.close()


def test_sglang_resolution_of_ngram_is_what_we_expect(ngram_point):
    run, resolved = ngram_point
    assert set(resolved) == set(SERVER_INFO_FIELDS)
    assert reported_server_args(resolved) == expected_server_args(run.server)
    assert resolved["speculative_num_steps"] == 5  # num_draft_tokens // topk, not drafter.num_steps = 4


def test_server_args_are_read_once_and_changes_flagged(fake, ngram_point):
    run, _ = ngram_point
    args = read_server_args(fake.base_url, run.server, pid=1)
    assert args.tags["sglang.verify_backend"] == "triton" and args.tags["sglang.prefill_backend"] == "triton"
    assert args.tags["sglang.speculative_num_steps"] == "5" and args.tags["sglang.speculative_eagle_topk"] == "1"
    assert args.tags["sglang.speculative_num_draft_tokens"] == "5" and args.tags["sglang.page_size"] == "1"
    assert args.notes == ["SGLang runs speculative_num_steps=5, asked drafter.num_steps -> 4"]
    assert args.tags["sglang.changed"] == args.notes[0]


def test_probe_reads_depth_acceptance_and_cross_checks(fake, ngram_point):
    run, _ = ngram_point
    m = run_probe(fake.base_url, run.probe, run.server.engine.kind, expect_spec=True, version="0.5.23",
                  max_depth=4, model_path="/nonexistent")
    assert m.metrics["commit_len_mean"] == pytest.approx(3.0)  # 1 + 42 / 21
    assert m.metrics["emitted_per_verify"] == pytest.approx(3.0)  # (64 - 1) / 21: no overshoot here
    assert m.metrics["engine_accept_length"] == pytest.approx(64 / 21)
    assert m.metrics["accept_rate"] == pytest.approx(0.5)  # 42 of 21 x (5 - 1) tree nodes
    assert m.series["accept_at_depth"] == pytest.approx([19 / 21, 15 / 21, 8 / 21])  # >= 1, 2, 3 drafts
    assert m.metrics["depth_accept_rate"] == pytest.approx(2 / 4)  # 2 drafts a step of at most 4


def test_group_runner_records_server_args_and_cross_checks(fake, ngram_point, tmp_path):
    """The run path of GroupRunner against the stand-in (an SGLang process cannot start here)."""
    run, _ = ngram_point

    runner = runner_on(run.server, fake.base_url, tmp_path)
    results = [runner.run(run), runner.run(dataclasses.replace(run, job_index=1))]
    for r in results:
        assert r.state is RunState.FINISHED, r.message
        assert r.tags["sglang.verify_backend"] == "triton" and r.tags["sglang.speculative_num_steps"] == "5"
        assert "speculative_num_steps=5" in r.message and "drafter.num_steps -> 4" in r.message
        assert r.metrics["engine_accept_length_metrics"] == pytest.approx(64 / 21)  # Δ 64 tokens / Δ 21 calls
        # /server_info's windowed avg_spec_accept_length is not recorded (workers.meta_info says why)
        assert "engine_accept_length_server" not in r.metrics
        assert r.metrics["commit_len_mean"] == pytest.approx(1 + 42 / 21)
        assert r.metrics["depth_accept_rate"] == pytest.approx(2 / 4)  # max depth = 5 draft tokens - 1
    assert fake.requests == 2


def test_concurrency_sends_parallel_requests_and_aggregates(fake, ngram_point):
    run, _ = ngram_point
    probe = dataclasses.replace(run.probe, concurrency=4)
    m = run_probe(fake.base_url, probe, run.server.engine.kind, expect_spec=True, version="0.5.23",
                  model_path="/nonexistent")
    assert fake.requests == 4
    assert m.metrics["requests"] == 4 and m.metrics["completion_tokens"] == 64  # per request
    assert m.metrics["commit_len_mean"] == pytest.approx(3.0) and m.metrics["verify_steps"] == 21
    assert m.metrics["throughput_tok_s"] == pytest.approx(4 * 64 / m.metrics["wall_s"])
    assert m.metrics["accept_rate"] == pytest.approx(0.5)
    assert m.series["accept_at_depth"] == pytest.approx([19 / 21, 15 / 21, 8 / 21])
