"""The engine's logprobs (SGLang's return_logprob): the float32 log-softmax of the logits each token was chosen from,
with and without speculation; and the test fault that breaks the pipeline under healthy counters."""
from __future__ import annotations

import torch

from workers.reference.engine import SamplingParams
from workers.reference.request import token_logprobs
from workers.reference.speculative import ENV_FAULT_REPEAT_BONUS

ORACLE = ("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "tiny",
          "--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5")
PROMPT = [5, 17, 99, 3, 42, 7, 7, 128, 64, 1, 250, 33]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)


def test_token_logprobs_are_the_float32_log_softmax_in_sglangs_shape():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.5, 0.4, 0.0, 4.0]])
    chosen, top = token_logprobs(logits, [1, 0], 2)
    lp = torch.log_softmax(logits, dim=-1)
    assert chosen == [[lp[0, 1].item(), 1, None], [lp[1, 0].item(), 0, None]]
    assert top == [[[lp[0, 1].item(), 1, None], [lp[0, 2].item(), 2, None]],
                   [[lp[1, 3].item(), 3, None], [lp[1, 0].item(), 0, None]]]
    assert token_logprobs(logits, [1, 0], 0)[1] == [[], []]


def test_logprobs_are_those_of_a_prefill_over_the_same_tokens(make_engine):
    """Each output token's top logprobs (decode forwards) against one prefill over prompt + output (all logits)."""
    engine = make_engine()
    out = engine.generate(PROMPT, GREEDY, top_logprobs_num=3)
    top = out.meta_info["output_top_logprobs"]
    assert [t[0][1] for t in top] == out.output_ids and len(top) == 24
    runner = engine.target
    seq = runner.new_sequence()
    logits = runner.extend(seq, PROMPT + out.output_ids[:-1], all_logits=True)[len(PROMPT) - 1:]
    seq.release()
    ref = torch.log_softmax(logits.float(), dim=-1).topk(3, dim=-1)
    assert [[e[1] for e in t] for t in top] == ref.indices.tolist()
    assert torch.allclose(torch.tensor([[e[0] for e in t] for t in top]), ref.values, atol=1e-4)


def test_speculation_gives_the_same_tokens_and_logprobs_from_its_verify_forward(make_engine):
    plain = make_engine().generate(PROMPT, GREEDY, top_logprobs_num=2)
    spec = make_engine(*ORACLE).generate(PROMPT, GREEDY, top_logprobs_num=2)
    assert spec.meta_info["spec_verify_ct"] < 24  # it speculated: several tokens a verify step
    assert spec.output_ids == plain.output_ids
    a = torch.tensor([[e[0] for e in t] for t in spec.meta_info["output_top_logprobs"]])
    b = torch.tensor([[e[0] for e in t] for t in plain.meta_info["output_top_logprobs"]])
    assert torch.allclose(a, b, atol=1e-4)
    assert len(spec.meta_info["output_token_logprobs"]) == 24  # the last step's overshoot cut with the tokens


def test_the_repeat_bonus_fault_changes_the_text_under_healthy_counters(make_engine, monkeypatch):
    healthy = make_engine(*ORACLE).generate(PROMPT, GREEDY)
    monkeypatch.setenv(ENV_FAULT_REPEAT_BONUS, "1")
    broken = make_engine(*ORACLE).generate(PROMPT, GREEDY)
    counters = ("spec_verify_ct", "spec_accept_length", "spec_num_correct_drafts")
    assert [broken.meta_info[k] for k in counters] == [healthy.meta_info[k] for k in counters]
    assert broken.output_ids[:5] == healthy.output_ids[:5]  # the prefill token and the first step's drafts
    assert broken.output_ids[5] == broken.output_ids[4] and broken.output_ids != healthy.output_ids
