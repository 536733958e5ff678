"""The SGLang facts table: stdlib only, one entry per supported version, read by validate, the adapter and the
metrics reader alike (their behaviour per version is tested in tests/workers/test_sglang_{args,metrics}.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specsweep_common.sglang_facts import (SGLANG_PLUGIN_BACKENDS, SGLANG_VERSIONS, resolved_backends,
                                          sglang_draft_backend, sglang_facts)
from specsweep_common.spec import Algorithm, AttentionSpec

ROOT = Path(__file__).resolve().parents[2]


def test_imports_only_the_standard_library_and_specsweep_common():
    code = ("import sys; before = set(sys.modules); import specsweep_common.sglang_facts; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == "['specsweep_common']", proc.stdout + proc.stderr


def test_unknown_version_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"'0\.5\.16'.*0\.5\.10, 0\.5\.18, 0\.5\.23"):
        sglang_facts("0.5.16")


def test_every_version_offers_the_plugin_and_one_capture_flag():
    for facts in SGLANG_VERSIONS.values():
        assert Algorithm.NONE not in facts.algorithms  # no flag at all, not a value of the flag
        assert set(SGLANG_PLUGIN_BACKENDS) <= set(facts.backends)
        assert facts.cuda_graph_max_bs not in facts.wrong_cuda_graph_flags
    assert not SGLANG_VERSIONS["0.5.10"].dflash and SGLANG_VERSIONS["0.5.23"].dflash


def test_backends_resolve_per_forward_mode():
    split = AttentionSpec("split", "triton", decode_backend="specsweep_verify", speculative_attention_mode="decode")
    assert resolved_backends(split, Algorithm.EAGLE3).verify == "specsweep_verify"
    assert resolved_backends(split, Algorithm.NONE).verify is None
    assert resolved_backends(AttentionSpec("t", "triton", prefill_backend="fa3"), Algorithm.NGRAM).verify == "fa3"
    assert sglang_draft_backend(split, Algorithm.EAGLE3) == "triton"  # the plugin's draft default
    assert sglang_draft_backend(split, Algorithm.NGRAM) is None  # NGRAM has no draft worker
    assert sglang_draft_backend(AttentionSpec("t", "fa3", draft_backend="flashinfer"), Algorithm.EAGLE) == "flashinfer"
