"""The engine's logits match transformers' Qwen3ForCausalLM on a random checkpoint (fp32, < 1e-4), with the
torch element-wise ops and with the fused Triton kernels (kernels/specsweep_kernels/fused_ops.py; the interpreter on CPU)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsweep_kernels import fused_ops  # noqa: E402
from workers.reference.model_source import load_config  # noqa: E402
from workers.reference.model import build_model  # noqa: E402

PROMPT_LEN, DECODE_STEPS = 37, 6


def write_checkpoint(path, **overrides):
    cfg = transformers.Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rope_theta=10000.0,
        tie_word_embeddings=False, **overrides,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # larger than HF's 0.02 init, so the logits are far from uniform
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.15)
            else:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()  # [L, V]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("variant", ["full", "sliding", "fused"])
def test_logits_match_transformers(tmp_path, make_runner, page_size, variant, monkeypatch):
    calls = {"qk_norm_rope_store": 0, "add_rms_norm": 0, "silu_mul": 0}
    for name in calls:  # count the fused kernels' calls, to know the fused path ran
        def counted(*a, _f=getattr(fused_ops, name), _n=name, **kw):  # noqa: B008 (binds this name now)
            calls[_n] += 1
            return _f(*a, **kw)
        monkeypatch.setattr(fused_ops, name, counted)
    if variant == "fused" and not fused_ops.available("cpu"):
        pytest.skip("fused kernels on CPU need TRITON_INTERPRET=1")
    overrides = {}
    if variant == "sliding":
        overrides = dict(use_sliding_window=True, sliding_window=8, max_window_layers=1,
                         layer_types=["full_attention", "sliding_attention", "sliding_attention"])
    hf = write_checkpoint(tmp_path, **overrides)
    cfg = load_config(str(tmp_path))
    if variant == "sliding":
        assert cfg.window_of(0) is None and cfg.window_of(1) == 8
    model = build_model(cfg, str(tmp_path), "safetensors", 0, torch.float32, "cpu")
    model.fused_ops = variant == "fused"
    runner = make_runner(model, page_size, chunk=10)  # chunked prefill over several chunks

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (PROMPT_LEN,), generator=gen).tolist()
    seq = runner.new_sequence()
    prefill = runner.extend(seq, ids, all_logits=True)  # [L, V]
    torch.testing.assert_close(prefill, hf_logits(hf, ids), atol=1e-4, rtol=0)

    for _ in range(DECODE_STEPS):
        ids.append(int(prefill[-1].argmax()))
        prefill = runner.model.logits(runner.forward(seq, torch.tensor(ids[-1:])))
        expected = hf_logits(hf, ids)[-1:]
        assert (prefill - expected).abs().max().item() < 1e-4
    seq.release()
    forwards = -(-PROMPT_LEN // 10) + DECODE_STEPS
    layers = cfg.num_hidden_layers
    expected_calls = {"qk_norm_rope_store": forwards * layers, "add_rms_norm": forwards * (2 * layers + 1),
                      "silu_mul": forwards * layers} if variant == "fused" else dict.fromkeys(calls, 0)
    assert calls == expected_calls
    assert runner.pool.allocator.num_free == runner.pool.allocator.num_pages
