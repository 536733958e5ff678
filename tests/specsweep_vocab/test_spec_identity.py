"""Run identity survives renames: a field renamed after runs were recorded hashes under its old name."""

from __future__ import annotations

from specsweep_vocab.spec import stable_hash
from tools.testing import tiny_server


def test_a_renamed_field_keeps_the_recorded_run_hash():
    # ServerSpec.server_context_len was `context_length` when these hashes were recorded (main, 2026-12-03): resume
    # must still find those runs FINISHED.
    assert stable_hash(tiny_server()) == "2d847dc2c7c14a8df198a0aab0542369c5e36f092ee202a035a96ec507e52279"
    assert stable_hash(tiny_server("ngram", server_context_len=2048)) == \
        "0259c13506a62c106a566e3bcfd6a92ccb9e37e9ea64f04b4577e1f4f5bffd92"
