"""Requests the engine refuses, and requests at the edges of its limits."""
from __future__ import annotations

import pytest

from workers.reference.engine import RequestError, SamplingParams


def test_context_length_and_pool_limits(make_engine):
    engine = make_engine("--context-length", "64", "--page-size", "16")
    with pytest.raises(RequestError, match="more than the context length 64"):
        engine.generate([1] * 60, SamplingParams(max_new_tokens=5))
    out = engine.generate([1] * 59, SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True))
    assert len(out.output_ids) == 5  # exactly at the limit is fine
    small = make_engine("--context-length", "256", "--max-total-tokens", "64")
    with pytest.raises(RequestError, match="KV pool holds 64"):
        small.generate([1] * 100, SamplingParams(max_new_tokens=5))


@pytest.mark.parametrize("ids, params, fragment", [
    ([], SamplingParams(), "empty"),
    ([1, 300], SamplingParams(), "out of range"),
    ([1], SamplingParams(max_new_tokens=0), "max_new_tokens must be >= 1"),
])
def test_bad_requests(make_engine, ids, params, fragment):
    with pytest.raises(RequestError, match=fragment):
        make_engine().generate(ids, params)


@pytest.mark.parametrize("argv,fragment", [
    (["--speculative-draft-num-layers", "2"], "needs --speculative-algorithm STANDALONE, got NONE"),
    (["--speculative-algorithm", "NGRAM", "--speculative-draft-num-layers", "2"], "got NGRAM"),
    (["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "tiny",
      "--speculative-draft-num-layers", "5"], "'tiny' has 4 layers (allowed 1..4)"),
    (["--speculative-draft-num-layers", "0"], "must be >= 1"),
])
def test_draft_num_layers_is_checked(capsys, argv, fragment):
    from workers.reference.args import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "tiny", *argv])
    assert exc.value.code == 2 and fragment in capsys.readouterr().err


def test_self_draft_layers_are_the_first_and_last_halves():
    from workers.reference.model import skip_layers_kept

    assert skip_layers_kept(30, 24) == list(range(12)) + list(range(18, 30))
    assert skip_layers_kept(30, 5) == [0, 1, 2, 28, 29]
    assert skip_layers_kept(4, 1) == [0] and skip_layers_kept(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="allowed 1..4"):
        skip_layers_kept(4, 5)
