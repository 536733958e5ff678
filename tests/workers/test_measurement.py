"""A run's metrics from the engine's answers (workers.measurement): the arithmetic of one answer and of a run's
concurrent answers, and the answers refused for missing or malformed fields."""

from __future__ import annotations

import re

import pytest

from workers.errors import BadResponse
from workers.http_client import Generation
from workers.measurement import greedy_output, measure, measure_all


def _gen(meta, text="abc", ttft=None, e2e=1.0):
    return Generation(text=text, output_ids=[1, 2, 3], meta_info=meta, client_ttft_s=ttft, client_e2e_s=e2e)


def test_measure_spec_metrics():
    steps = [{"accept_len": a, "tree_depth": 4, "tree_nodes": 5, "verify_s": v}
             for a, v in [(5, 0.010), (1, 0.030), (3, 0.020)]]
    meta = {"prompt_tokens": 100, "completion_tokens": 11, "e2e_latency": 2.5, "ttft": 0.5, "spec_verify_ct": 3,
            "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 12, "spec_steps": steps}
    m = measure(_gen(meta), expect_spec=True)
    assert m.metrics["decode_tok_s"] == pytest.approx(10 / 2.0)
    assert m.metrics["commit_len_mean"] == pytest.approx(3.0)
    assert m.metrics["verify_steps"] == 3 and m.metrics["accept_rate"] == 0.5
    assert m.metrics["verify_forward_median_ms"] == pytest.approx(20.0)  # verify_step_ms: /metrics, the runner's
    assert "verify_step_ms" not in m.metrics
    assert m.metrics["tree_depth_mean"] == 4 and m.metrics["tree_nodes_mean"] == 5
    assert m.series["commit_len"] == [5.0, 1.0, 3.0]
    assert m.artifacts["steps.csv"].splitlines()[0] == "step,accept_len,tree_depth,tree_nodes,verify_s"
    assert m.artifacts["continuation.txt"] == "abc"


def test_measure_falls_back_to_client_ttft_and_sglang_counters():
    meta = {"prompt_tokens": 10, "completion_tokens": 9, "e2e_latency": 1.2, "spec_verify_ct": 4,
            "spec_num_correct_drafts": 4}
    m = measure(_gen(meta, ttft=0.2), expect_spec=True)
    assert m.metrics["ttft_s"] == 0.2 and m.metrics["commit_len_mean"] == 2.0  # 1 + 4 / 4
    assert m.metrics["emitted_per_verify"] == 2.0  # (9 - 1) / 4: no overshoot, the same figure


def test_commit_len_counts_the_last_step_whole_when_it_overshoots():
    """SGLang cuts completion_tokens at max_new_tokens but counts the last verify step and its drafts: an oracle
    committing 5 a step over 7 steps sends 32 of 36 tokens. commit_len_mean is 5; the client-side figure is 31 / 7."""
    meta = {"prompt_tokens": 10, "completion_tokens": 32, "e2e_latency": 1.2, "ttft": 0.1, "spec_verify_ct": 7,
            "spec_num_correct_drafts": 28, "spec_num_proposed_drafts": 28, "spec_accept_length": 32 / 7,
            "spec_correct_drafts_histogram": [0, 0, 0, 0, 7]}
    m = measure(_gen(meta), expect_spec=True, max_depth=4).metrics
    assert m["commit_len_mean"] == 5.0 and m["accept_rate"] == 1.0 and m["depth_accept_rate"] == 1.0
    assert m["emitted_per_verify"] == pytest.approx(31 / 7) and m["engine_accept_length"] == pytest.approx(32 / 7)


def test_a_speculating_answer_without_a_correct_draft_count_is_refused():
    meta = {"prompt_tokens": 10, "completion_tokens": 9, "spec_verify_ct": 4, "spec_accept_length": 9 / 4}
    with pytest.raises(BadResponse, match="no correct-draft count"):
        measure(_gen(meta), expect_spec=True)


@pytest.mark.parametrize("meta,expect_spec", [
    ({"completion_tokens": 3}, False),
    ({"prompt_tokens": 3, "completion_tokens": "x"}, False),
    ({"prompt_tokens": 3, "completion_tokens": 3}, True),
    ({"prompt_tokens": 3, "completion_tokens": 3, "spec_steps": [{"tree_depth": 1}]}, True),
])
def test_measure_rejects_missing_fields(meta, expect_spec):
    with pytest.raises(BadResponse):
        measure(_gen(meta), expect_spec=expect_spec)


def test_measure_all_means_per_request_and_sums_over_steps():
    def gen(accepts, completion, e2e, correct, proposed, batch):
        steps = [{"accept_len": a, "tree_depth": 4, "tree_nodes": 5, "verify_s": 0.01 * a, "batch_size": batch}
                 for a in accepts]
        return _gen({"prompt_tokens": 100, "completion_tokens": completion, "e2e_latency": e2e, "ttft": 0.5,
                     "spec_verify_ct": len(steps), "spec_num_correct_drafts": correct,
                     "spec_num_proposed_drafts": proposed, "spec_steps": steps}, e2e=e2e)

    a = gen([5, 5], 11, 2.5, 8, 8, 2)         # 2 steps of 5
    b = gen([1, 1, 1, 4], 8, 4.5, 3, 16, 1)   # 4 steps, 7 committed
    m = measure_all([a, b], expect_spec=True, wall_s=5.0).metrics
    assert m["commit_len_mean"] == pytest.approx((10 + 7) / 6)  # over all verify steps, not a mean of means
    assert m["accept_rate"] == pytest.approx(11 / 24)
    assert m["verify_steps"] == 3 and m["completion_tokens"] == 9.5  # per request
    assert m["decode_tok_s"] == pytest.approx((10 / 2.0 + 7 / 4.0) / 2)
    assert m["requests"] == 2 and m["wall_s"] == 5.0 and m["throughput_tok_s"] == pytest.approx(19 / 5.0)
    assert m["batch_size_mean"] == pytest.approx((2 * 2 + 4 * 1) / 6)
    assert m["verify_forward_median_ms"] == pytest.approx(25.0)  # median of the six steps (10, 10, 10, 40, 50, 50 ms)


@pytest.mark.parametrize("top, fragment", [
    (None, "output_top_logprobs has None entries for 2 output tokens"),
    ([[[-0.1, 5, None], [-2.0, 9, None]]], "has 1 entries for 2 output tokens"),
    ([[[-0.1, 5, None], [-2.0, 9, None]], [[-0.1, 6, None]]], "need the 2 best entries"),
    ([[[-0.1, 5, None], [-2.0, 9, None]], [[-0.1, "x", None], [-2.0, 9, None]]], "not [logprob, token_id]"),
    ([[[-0.1, 5, None], [-2.0, 9, None]], [[-0.1, 8, None], [-2.0, 6, None]]], "output token 1 is 6 but the best"),
])
def test_an_answer_without_the_logprobs_asked_for_is_a_bad_response(top, fragment):
    meta = {"output_top_logprobs": top} if top is not None else {}
    with pytest.raises(BadResponse, match=re.escape(fragment)):
        greedy_output(Generation("", [5, 6], meta, None, 1.0, top_logprobs_num=2))


def test_a_greedy_answer_with_its_top2_is_recorded_and_a_tie_may_emit_either():
    top = [[[-0.1, 5, None], [-2.0, 9, None]], [[-0.7, 8, None], [-0.7, 6, None]]]  # position 1: an exact tie
    out = greedy_output(Generation("", [5, 6], {"output_top_logprobs": top}, None, 1.0, top_logprobs_num=2))
    assert out.output_ids == (5, 6) and out.top2 == (((-0.1, 5), (-2.0, 9)), ((-0.7, 8), (-0.7, 6)))
