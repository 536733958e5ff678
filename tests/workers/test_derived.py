"""Derived metrics: KV bytes from the model shape, bandwidth, roofline only with a measured ceiling."""
from __future__ import annotations

import dataclasses
import json

import pytest

from specsweep_common.builtin_models import TINY as BUILTIN_TINY
from specsweep_common.spec import ModelSpec
from workers.derived import derived_metrics
from workers.registry import adapter_for
from specsweep_common.spec import EngineKind

QWEN8B = ModelSpec(name="qwen3-8b", path="Qwen/Qwen3-8B", max_context_len=131072, num_layers=36, hidden_size=4096,
                   num_q_heads=32, num_kv_heads=8, head_dim=128, v_head_dim=128, dtype="bfloat16")
TINY = dataclasses.replace(BUILTIN_TINY, max_context_len=2048)  # the built-in geometry (specsweep_common/builtin_models.py)


def test_cpu_reports_kv_bytes_and_bandwidth_but_no_roofline():
    m = {"prompt_tokens": 131072.0, "completion_tokens": 0.0, "verify_step_ms": 10.0}
    out = derived_metrics(m, QWEN8B, on_gpu=False, peak_gbs=lambda: pytest.fail("no ceiling on CPU"))
    assert out["kv_bytes_per_step"] == 36 * 8 * 256 * 2 * 131072  # layers x kv heads x (Dk+Dv) x bf16 x ctx
    assert out["kv_bw_gbs"] == pytest.approx(out["kv_bytes_per_step"] / 0.010 / 1e9)
    assert "roofline_frac" not in out and "peak_bw_gbs" not in out


def test_gpu_roofline_from_measured_peak():
    m = {"prompt_tokens": 1000.0, "completion_tokens": 200.0, "verify_step_ms": 4.0}
    out = derived_metrics(m, TINY, on_gpu=True, peak_gbs=lambda: 4000.0, weight_bytes=8e9)
    kv = TINY.kv_bytes_per_token * 1100  # mean prefix over the run
    assert out["kv_bytes_per_step"] == kv
    assert out["peak_bw_gbs"] == 4000.0
    assert out["floor_step_ms"] == pytest.approx(1000 * (8e9 + kv) / 4e12)
    assert out["roofline_frac"] == pytest.approx(out["floor_step_ms"] / 4.0)


def test_missing_inputs_and_failing_ceiling_are_left_out():
    assert derived_metrics({}, TINY, on_gpu=True) == {}
    out = derived_metrics({"prompt_tokens": 10.0}, TINY, on_gpu=True, peak_gbs=lambda: 1 / 0)
    assert set(out) == {"kv_bytes_per_step"}


def test_weight_bytes_from_builtin_shape():
    reference = adapter_for(EngineKind.REFERENCE)
    wb = reference.weight_bytes(TINY)
    # 4 layers x (q,o: 256x256 each; k,v: 256x64 each; MLP 3x256x768; 2 norms) + lm head + final norm, fp32
    per_layer = 2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 768 + 2 * 256
    assert wb == 4 * (4 * per_layer + 259 * 256 + 256)
    assert reference.weight_bytes(QWEN8B) is None  # an HF id with no local checkout: no shape to read
    assert adapter_for(EngineKind.SGLANG).weight_bytes(QWEN8B) is None
    assert adapter_for(EngineKind.SGLANG).weight_bytes(TINY) is None  # built into the reference engine only


def test_every_engine_reads_an_hf_checkpoints_shape_alike(tmp_path):
    """An HF checkpoint directory: the generic config.json reading (SGLang's adapter) counts the same bytes as the
    reference engine's own loader, head_dim and KV heads defaulted alike."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1536, "num_hidden_layers": 3,
         "vocab_size": 1000, "architectures": ["Qwen3ForCausalLM"]}))
    model = dataclasses.replace(QWEN8B, path=str(tmp_path))
    ours = adapter_for(EngineKind.SGLANG).weight_bytes(model)
    per_layer = 4 * 512 * 512 + 3 * 512 * 1536 + 2 * 512  # 8 heads of 64 for q, o, k and v; MLP; norms
    assert ours == 2 * (3 * per_layer + 1000 * 512 + 512)  # bfloat16
    assert adapter_for(EngineKind.REFERENCE).weight_bytes(model) == ours
