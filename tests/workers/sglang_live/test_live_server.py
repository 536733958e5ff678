"""What the project says about SGLang, checked against a live SGLang 0.5.18 server on this machine's CPU: the args
it resolves, the context edge, the /metrics counters, cache flushes, the probe, and the reference engine beside it
on the same model and prompt (docs/sglang.md, "Rehearse on a laptop with real SGLang", names each test)."""
from __future__ import annotations

import logging
import time

import pytest
import requests

from specsweep_common.sglang_limits import sglang_generated
from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec
from tools.testing import reference_process
from workers.engine_counters import parse_scrape, read_metrics, server_limits
from workers.http_client import ProbeClient
from workers.probe import run_probe
from workers.registry import adapter_for
from workers.reference.tokenizer import load_tokenizer
from workers.sglang.argv import expected_server_args, reported_server_args, server_arg_changes

from .conftest import CONTEXT

logger = logging.getLogger(__name__)
MODEL = "smollm2-135m"
# float32 on both sides, different kernels (SGLang's CPU GEMMs vs torch's): a divergence must be at a near-tie
NEAR_TIE = 1e-3
TEXT = ("The cat sat on the mat. The dog slept by the door. " * 6) + "Once upon a time, in a small village by the sea,"


def _generate(url: str, ids: list[int], max_new: int, **extra) -> requests.Response:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
            **extra}
    return requests.post(f"{url}/generate", json=body, timeout=600)


def test_server_info_reports_the_args_the_adapter_predicts(live):
    """/server_info of the live server = `expected_server_args` on every key the config sets, and
    `server_arg_changes` finds nothing to flag."""
    spec, engine = live
    info = requests.get(f"{engine.base_url}/server_info", timeout=30).json()
    want, got = expected_server_args(spec), reported_server_args(info)
    assert {k: got[k] for k, v in want.items() if v is not None} == {k: v for k, v in want.items() if v is not None}
    assert server_arg_changes(spec, info) == []
    assert info["device"] == "cpu" and info["attention_backend"] == "torch_native"
    assert server_limits(info)["max_total_num_tokens"] >= CONTEXT  # the pool holds a full context


@pytest.mark.parametrize("below_edge", [9, 8, 7, 6, 5, 2])
def test_context_edge_is_what_sglang_limits_predicts(live, below_edge):
    """A prompt `below_edge` tokens under the context with max_new_tokens 1: generated (how many) or refused,
    exactly as `specsweep_common.sglang_limits.sglang_generated` says (the plan-time context rule)."""
    spec, engine = live
    prompt = CONTEXT - below_edge
    ids = (load_tokenizer(MODEL).encode(TEXT * 20))[:prompt]
    r = _generate(engine.base_url, ids, 1)
    predicted = sglang_generated(prompt, 1, spec.server_context_len)
    if predicted is None:
        refused = r.status_code == 400 or r.json().get("meta_info", {}).get("finish_reason", {}).get("type") == "abort"
        assert refused, f"prompt {prompt}: SGLang generated {r.json()}"
    else:
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["completion_tokens"] == predicted


def test_metrics_counters_count_the_request(live):
    """Δ sglang:generation_tokens_total and Δ prompt_tokens_total over one request equal its meta_info counts;
    without speculation no verify calls, and on CPU no forward device timer (its timer is a torch.cuda.Event)."""
    _, engine = live
    before = read_metrics(engine.base_url, parse_scrape)
    ids = load_tokenizer(MODEL).encode(TEXT)
    meta = _generate(engine.base_url, ids, 12).json()["meta_info"]
    time.sleep(1.0)  # the scheduler's metrics are exported after the request's last batch
    after = read_metrics(engine.base_url, parse_scrape)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("sglang:generation_tokens_total") == meta["completion_tokens"] == 12
    assert delta("sglang:prompt_tokens_total") == meta["prompt_tokens"] == len(ids)
    assert not after.get("sglang:spec_verify_calls_total")
    assert "sglang:forward_execution_seconds_total" not in after


def test_flush_cache_resets_the_prefix_cache(live):
    """The same prompt twice hits SGLang's radix cache; after POST /flush_cache (what the probe sends before each
    run) nothing is cached."""
    _, engine = live
    ids = load_tokenizer(MODEL).encode("A different prompt, to be cached and flushed. " * 4)
    _generate(engine.base_url, ids, 2)
    assert _generate(engine.base_url, ids, 2).json()["meta_info"]["cached_tokens"] > 0
    client = ProbeClient(engine.base_url, 60)
    try:
        client.flush_cache()
    finally:
        client.close()
    assert _generate(engine.base_url, ids, 2).json()["meta_info"]["cached_tokens"] == 0


def test_probe_measures_live_sglang_without_speculation(live):
    """The probe a sweep runs, against the live server: the prompt is exactly context_len tokens, every gen_token
    comes back, and with no speculation the commit length is 1 and no speculative counter is invented."""
    spec, engine = live
    probe = ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=256, gen_tokens=16)
    m = run_probe(engine.base_url, probe, EngineKind.SGLANG, expect_spec=False, timeout_s=600,
                  model_path=adapter_for(EngineKind.SGLANG).prompt_model(spec), version=spec.engine.version)
    assert m.notes == []
    assert m.metrics["decode_tok_s"] > 0 and m.metrics["prompt_tokens"] == 256
    assert "commit_len_mean" not in m.metrics or m.metrics["commit_len_mean"] == 1.0


def test_greedy_tokens_equal_the_reference_engine(live):
    """Side by side on the same model (the GGUF's float32 weights), input ids and greedy sampling: SGLang's tokens
    equal the reference engine's, or part only where SGLang's own top two logprobs are within NEAR_TIE (numerics).
    The decode rates of both are logged (docs/sglang.md's table comes from make bench-sglang-cpu), not asserted."""
    spec, engine = live
    ids = load_tokenizer(MODEL).encode(TEXT)
    t0 = time.perf_counter()
    theirs = _generate(engine.base_url, ids, 32).json()
    sglang_s = time.perf_counter() - t0
    argv = ["--model-path", MODEL, "--context-length", str(CONTEXT), "--dtype", "float32"]
    with reference_process(argv) as (url, _):
        t0 = time.perf_counter()
        ours = _generate(url, ids, 32).json()
        reference_s = time.perf_counter() - t0
    logger.info("32 tokens after a %d-token prompt: SGLang %.2f s, reference engine %.2f s", len(ids), sglang_s,
                reference_s)
    assert theirs["meta_info"]["prompt_tokens"] == ours["meta_info"]["prompt_tokens"] == len(ids)
    a, b = theirs["output_ids"], ours["output_ids"]
    if a != b:  # explained only by numerics: SGLang's own top two logprobs there within NEAR_TIE of each other
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        top = _generate(engine.base_url, ids + a[:k], 1, return_logprob=True, top_logprobs_num=2).json()
        (lp1, t1, _), (lp2, t2, _) = top["meta_info"]["output_top_logprobs"][0][:2]
        assert {t1, t2} == {a[k], b[k]} and abs(lp1 - lp2) <= NEAR_TIE, (k, top["meta_info"]["output_top_logprobs"])


def test_chat_prompt_is_encoded_as_sglang_encodes_it(live):
    """A probe.task prompt is built from the model's own chat template on the driver (workers.prompts); SGLang's
    /v1/chat/completions encodes the same turn from the exported tokenizer_config.json to the same prompt length."""
    spec, engine = live
    r = requests.post(f"{engine.base_url}/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1,
        "temperature": 0})
    assert r.status_code == 200, r.text
    tok = load_tokenizer(MODEL)
    assert r.json()["usage"]["prompt_tokens"] == len(_chat_ids(tok, "Say hello."))


def _chat_ids(tok, content: str) -> list[int]:
    from workers.reference.chat_template import load_chat_template, render_chat

    template = load_chat_template(MODEL)
    assert template is not None
    return tok.encode(render_chat(template, [{"role": "user", "content": content}], add_generation_prompt=True))
