"""Run identity survives renames: a field renamed after runs were recorded hashes under its old name."""

from __future__ import annotations

from specsweep_common.spec import stable_hash
from tools.testing import tiny_server


def test_a_renamed_field_keeps_the_recorded_run_hash():
    # ServerSpec.server_context_len was `context_length` when these hashes were recorded (main, 2026-12-03): resume
    # must still find those runs FINISHED.
    assert stable_hash(tiny_server()) == "2d847dc2c7c14a8df198a0aab0542369c5e36f092ee202a035a96ec507e52279"
    assert stable_hash(tiny_server("ngram", server_context_len=2048)) == \
        "0259c13506a62c106a566e3bcfd6a92ccb9e37e9ea64f04b4577e1f4f5bffd92"


def test_lossless_key_pairs_a_speculative_run_with_its_none_run_and_nothing_else():
    """The drafter (and the attention backend only a draft uses) is all it leaves out: every other axis of the point
    (seed, page size, context, probe text, gen_tokens, the model's dtype) makes another key."""
    import dataclasses

    from specsweep_common.point_key import lossless_key, point_key
    from specsweep_common.spec import ProbeKind, ProbeSpec
    from tools.testing import tiny_server

    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=128, gen_tokens=16)
    none = tiny_server("none")
    key = lossless_key(none, probe)
    for drafter in ("oracle", "ngram"):
        spec = tiny_server(drafter)
        spec = dataclasses.replace(spec, attention=dataclasses.replace(spec.attention, draft_backend="triton"))
        assert lossless_key(spec, probe) == key and point_key(spec, probe) != point_key(none, probe)
    others = [(tiny_server("none", seed=1), probe), (tiny_server("none", page_size=1), probe),
              (none, dataclasses.replace(probe, context_len=256)), (none, dataclasses.replace(probe, seed=3)),
              (none, dataclasses.replace(probe, gen_tokens=8)),
              (dataclasses.replace(none, model=dataclasses.replace(none.model, dtype="bfloat16")), probe)]
    assert all(lossless_key(s, p) != key for s, p in others)
