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
