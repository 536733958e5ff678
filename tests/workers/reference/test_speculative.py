"""Lossless speculation at temperature 0 and the oracle self-test."""
from __future__ import annotations

import pytest

from tools.testing import spec_flags
from workers.reference.engine import SamplingParams
from workers.reference.speculative import DraftTree, NgramDrafter

NEW_TOKENS = 48
SPEC_CONFIGS = {
    "ngram-chain": spec_flags("NGRAM", steps=4),
    "ngram-tree": spec_flags("NGRAM", steps=3, topk=3, tokens=8),
    "draft-chain": spec_flags("STANDALONE", draft="tiny-draft", steps=3),
    "draft-tree": spec_flags("STANDALONE", draft="tiny-draft", steps=3, topk=2, tokens=6),
    "self-draft-chain": spec_flags("STANDALONE", draft="tiny", layers=2, steps=4),
    "self-draft-tree": spec_flags("STANDALONE", draft="tiny", layers=1, steps=3, topk=2, tokens=6),
    "draft-layer-subset": spec_flags("STANDALONE", draft="tiny-draft", layers=1, steps=3),
    "oracle-chain": spec_flags("STANDALONE", draft="tiny", steps=4),
    "oracle-tree": spec_flags("STANDALONE", draft="tiny", steps=3, topk=2, tokens=7),
}


def prompt(engine) -> list[int]:
    # ~330 tokens: predictable text (n-gram hits) spanning 330 pages at page size 1 and 21 at 16
    return engine.encode("The cat sat on the mat. " * 10 + "A quick brown fox jumps over the lazy dog. " * 2
                         + "The cat sat on the")


def greedy(**kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def plain_tokens():
    return {}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_speculation_is_lossless(make_engine, plain_tokens, page_size, name):
    if page_size not in plain_tokens:
        plain = make_engine("--page-size", str(page_size))
        plain_tokens[page_size] = plain.generate(prompt(plain), greedy()).output_ids
    engine = make_engine("--page-size", str(page_size), *SPEC_CONFIGS[name])
    out = engine.generate(prompt(engine), greedy())
    assert out.output_ids == plain_tokens[page_size]
    meta = out.meta_info
    assert meta["spec_verify_ct"] == len(meta["spec_steps"]) > 0
    assert meta["spec_accept_length"] == pytest.approx(NEW_TOKENS / meta["spec_verify_ct"])
    assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
    assert meta["spec_num_correct_drafts"] <= meta["spec_num_proposed_drafts"]
    if name.startswith("oracle"):  # acceptance (and the KV moves of accepted branches) exercised
        assert meta["spec_num_correct_drafts"] >= NEW_TOKENS // 2
    # every page went back to the pool (rejected nodes rolled back, the request released)
    alloc = engine.target.pool.allocator
    assert alloc.num_free == alloc.num_pages


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_steps", [1, 3, 5])
def test_oracle_commits_num_steps_plus_one_every_step(make_engine, page_size, num_steps):
    engine = make_engine("--page-size", str(page_size), "--speculative-algorithm", "STANDALONE",
                         "--speculative-draft-model-path", "tiny", "--speculative-num-steps", str(num_steps),
                         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(num_steps + 1))
    out = engine.generate(engine.encode("novel text: 7f3a9 qzx wvu! ") * 3, greedy())
    steps = out.meta_info["spec_steps"]
    for i, step in enumerate(steps):
        assert step["accept_len"] == num_steps + 1, f"verify step {i}: {step}"
        assert step["tree_depth"] == num_steps and step["tree_nodes"] == num_steps + 1
    assert out.meta_info["spec_num_correct_drafts"] == num_steps * len(steps)
    assert out.meta_info["spec_accept_rate"] == 1.0


def test_stop_string_and_eos_finish(make_engine):
    engine = make_engine("--speculative-algorithm", "NGRAM")
    free = engine.generate(prompt(engine), greedy())
    text = engine.decode(free.output_ids)
    stop = text[5:8]
    out = engine.generate(prompt(engine), greedy(stop=[stop]))
    assert out.meta_info["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop in engine.decode(out.output_ids) and len(out.output_ids) < NEW_TOKENS
    engine.eos_id = free.output_ids[10]  # pretend the 11th token is EOS
    out = engine.generate(prompt(engine), SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0))
    first = free.output_ids.index(engine.eos_id)
    assert out.output_ids == free.output_ids[:first + 1]
    assert out.meta_info["finish_reason"] == {"type": "stop", "matched": engine.eos_id}


def test_sampling_with_speculation_runs_and_is_seeded(make_engine):
    engine = make_engine("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "tiny",
                         "--speculative-num-steps", "2")
    params = SamplingParams(max_new_tokens=20, temperature=0.8, ignore_eos=True, sampling_seed=7)
    a = engine.generate(prompt(engine), params).output_ids
    b = engine.generate(prompt(engine), params).output_ids
    assert a == b and len(a) == 20


def test_ngram_tree_shape():
    drafter = NgramDrafter(num_steps=3, topk=2, num_draft_tokens=6, min_window=1, max_window=4)
    ctx = [1, 2, 3, 9, 1, 2, 4, 8, 7, 1, 2]  # "1 2" was followed by "3 9 1" and "4 8 7"
    tree = drafter.propose_one(ctx)
    assert tree.tokens[0] == 2 and tree.parents[0] == -1
    assert set(zip(tree.tokens[1:], tree.parents[1:])) == {(4, 0), (8, 1), (7, 2), (3, 0), (9, 4)}
    assert tree.num_nodes == 6 and max(tree.depths()) == 3


def test_ancestor_mask():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, 0, 0, 1])
    mask = tree.ancestor_mask().int().tolist()
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_ngram_verifies_the_draft_tokens_it_is_given_as_sglang_does():
    """SGLang's NGRAM keeps --speculative-num-draft-tokens with topk 1 (the steps+1 forcing is the EAGLE family's,
    sglang/srt/arg_groups/speculative_hook.py:1255-1266 against `_handle_ngram`, :1314-1330) and verifies that many
    nodes: the reference engine's n-gram chain is as long."""
    from workers.reference.args import parse_args

    argv = ["--model-path", "tiny", "--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"]
    args = parse_args(argv)
    assert (args.speculative_num_draft_tokens, args.speculative_eagle_topk) == (8, 1)
    unset = parse_args(["--model-path", "tiny", "--speculative-algorithm", "NGRAM"])
    assert (unset.speculative_num_draft_tokens, unset.speculative_num_steps) == (12, 12)  # SGLang's defaults
    eagle = parse_args(["--model-path", "tiny", "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
                        "tiny", "--speculative-num-steps", "4", "--speculative-num-draft-tokens", "8"])
    assert eagle.speculative_num_draft_tokens == 5  # the EAGLE family's chain: num_steps + 1

    drafter = NgramDrafter(num_steps=4, topk=1, num_draft_tokens=8, min_window=1, max_window=4)
    ctx = list(range(10, 20)) + list(range(10, 13))  # the suffix 10 11 12 was followed by 13 .. 19 and 10
    tree = drafter.propose_one(ctx)
    assert tree.tokens == [12, 13, 14, 15, 16, 17, 18, 19] and tree.num_nodes == 8  # 7 drafts, not 4


@pytest.mark.parametrize("spec", [[], spec_flags("NGRAM", steps=4)], ids=["plain", "ngram"])
def test_sampling_without_a_seed_is_a_new_sample_each_time(make_engine, spec):
    """As SGLang: a sampled request without a seed draws from the server's generator (sglang/srt/layers/sampler.py:
    837-838), so four of them are four samples, not four copies of one; with --enable-deterministic-inference each
    is seeded with 42 (sglang/srt/sampling/sampling_batch_info.py:157-171) and they are one."""
    params = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True)
    engine = make_engine(*spec)
    samples = {tuple(engine.generate(prompt(engine), params).output_ids) for _ in range(4)}
    assert len(samples) == 4
    seeded = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True, sampling_seed=3)
    assert len({tuple(engine.generate(prompt(engine), seeded).output_ids) for _ in range(2)}) == 1
    deterministic = make_engine(*spec, "--enable-deterministic-inference")
    assert len({tuple(deterministic.generate(prompt(deterministic), params).output_ids) for _ in range(2)}) == 1
