"""A specsweep_verify run on SGLang records the plugin's dispatch counters as metrics (GroupRunner's run path).

The stand-in serves SGLang 0.5.23's /generate, /flush_cache, /server_info and a /metrics whose plugin counter is
rendered by prometheus_client itself (the exposition SGLang's MultiProcessCollector produces for it; the way there
from the scheduler processes is tests/kernels/test_sglang_plugin_dispatch.py). Each request adds the layer calls
the test sets."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from orchestrator.config.plan import build_run
from specsweep_common import plugin_counters as pc
from specsweep_common.spec import RunState
from tools.fake_server import JSON, PROMETHEUS, FakeServer, runner_on
from tools.composed_config import compose_run

LAYERS, STEPS = 36, 21


class FakeSGLang(FakeServer):
    def __init__(self, with_counter: bool = True):
        self.registry = CollectorRegistry()
        self.counter = Counter(pc.COUNTER, "plugin calls", labelnames=pc.LABELS, registry=self.registry) \
            if with_counter else None
        self.per_request: dict[tuple[str, str, str], int] = {("verify", "kernel", ""): LAYERS * STEPS}
        super().__init__()

    def get(self, path):
        if path == "/metrics":
            return 200, generate_latest(self.registry), PROMETHEUS
        return 200, {"attention_backend": "specsweep_verify", "speculative_algorithm": "NGRAM",  # /server_info
                     "speculative_num_draft_tokens": 5, "internal_states": [{}]}, JSON

    def post(self, path, body):
        if path != "/generate":  # /flush_cache
            return 200, "Cache flushed.", "text/plain"
        if self.counter is not None:
            for key, n in self.per_request.items():
                self.counter.labels(*key).inc(n)
        meta = {"id": "r", "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": 256,
                "completion_tokens": 64, "cached_tokens": 0, "e2e_latency": 0.5, "spec_verify_ct": STEPS,
                "spec_accept_length": 64 / STEPS, "spec_num_correct_drafts": 42, "spec_num_proposed_drafts": 84,
                "spec_correct_drafts_histogram": [2, 4, 7, 8]}
        return 200, {"text": "x" * 64, "output_ids": list(range(64)), "meta_info": meta}, JSON


@pytest.fixture
def plugin_run(tmp_path):
    rc = compose_run("engine=sglang", "model=qwen3-8b", "drafter=ngram", "attention=specsweep_verify", "page_size=1",
                     "context_len=256", "gen_tokens=64", cwd=str(tmp_path))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return build_run(dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=str(model))), 0)


def _runner(run, fake, tmp_path):
    return runner_on(run.server, fake.base_url, tmp_path)


def test_kernel_calls_and_fallbacks_are_recorded_per_run(plugin_run, tmp_path):
    fake = FakeSGLang()
    try:
        runner = _runner(plugin_run, fake, tmp_path)
        first = runner.run(plugin_run)
        fake.per_request = {("verify", "kernel", ""): LAYERS * (STEPS - 1), ("verify", "fallback", "tokens"): LAYERS}
        second = runner.run(dataclasses.replace(plugin_run, job_index=1))
    finally:
        fake.close()
    assert first.state is RunState.FINISHED and second.state is RunState.FINISHED
    assert first.metrics["plugin_kernel_calls"] == first.metrics["plugin_verify_kernel_calls"] == LAYERS * STEPS
    assert first.metrics["plugin_fallback_calls"] == 0 and "specsweep_verify" not in first.message
    # deltas: the second run's own calls, not the counters since start
    assert second.metrics["plugin_kernel_calls"] == LAYERS * (STEPS - 1)
    assert second.metrics["plugin_fallback_calls"] == second.metrics["plugin_fallback_calls.tokens"] == LAYERS
    assert f"specsweep_verify: {LAYERS} layer call(s) fell back to SGLang's Triton backend (tokens: {LAYERS})" \
        in second.message


def test_a_server_without_the_counter_records_none_and_says_so(plugin_run, tmp_path):
    fake = FakeSGLang(with_counter=False)
    try:
        result = _runner(plugin_run, fake, tmp_path).run(plugin_run)
    finally:
        fake.close()
    assert result.state is RunState.FINISHED and "plugin_kernel_calls" not in result.metrics
    assert f"/metrics has no {pc.SAMPLE}" in result.message
    assert pc.unproven(result.metrics).startswith("no plugin counters were recorded")
