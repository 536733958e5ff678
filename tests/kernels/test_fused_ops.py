"""specsweep_kernels.fused_ops against the unfused torch code of the reference model (CPU: Triton's interpreter,
fp32 / fp16; on a GPU the same tests run compiled, bf16 included)."""
from __future__ import annotations

import pytest
import torch

from specsweep_kernels import fused_ops
from workers.reference.model import RMSNorm, apply_rope, rope_cos_sin

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
pytestmark = pytest.mark.skipif(not fused_ops.available(DEVICE), reason="needs CUDA or TRITON_INTERPRET=1")


def _tol(dtype):  # one ulp of the activation dtype, relative
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def _close(a, b, dtype):
    torch.testing.assert_close(a.float(), b.float(), rtol=_tol(dtype), atol=_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 64), (5, 96), (8, 256)])
def test_add_rms_norm_matches_residual_add_then_rmsnorm(dtype, rows, cols):
    g = torch.Generator().manual_seed(rows * cols)
    norm = RMSNorm(cols, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(cols, generator=g) + 0.5)
    norm = norm.to(DEVICE, dtype)
    x = torch.randn(rows, cols, generator=g).to(DEVICE, dtype)
    res = torch.randn(rows, cols, generator=g).to(DEVICE, dtype)

    want_sum = res + x
    want = norm(want_sum)
    res_in = res.clone()
    got = fused_ops.add_rms_norm(x, weight=norm.weight, eps=norm.eps, residual=res_in)
    torch.testing.assert_close(res_in, want_sum, rtol=0, atol=0)  # the add rounds exactly as torch's
    _close(got, want, dtype)
    _close(fused_ops.add_rms_norm(x, weight=norm.weight, eps=norm.eps), norm(x), dtype)  # no residual
    # the module's helper gives the same pair on either path
    h_f, r_f = norm.add_forward(x, res.clone(), fused=True)
    h_t, r_t = norm.add_forward(x, res.clone(), fused=False)
    _close(h_f, h_t, dtype)
    torch.testing.assert_close(r_f, r_t, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,hq,hkv,D", [(1, 4, 2, 32), (8, 8, 2, 64), (13, 6, 3, 128)])
def test_qk_norm_rope_store_matches_norm_rope_and_pool_store(dtype, T, hq, hkv, D):
    g = torch.Generator().manual_seed(T * 1000 + D)
    qkv = torch.randn(T, hq + 2 * hkv, D, generator=g).to(DEVICE, dtype)
    q_norm, k_norm = RMSNorm(D, 1e-6), RMSNorm(D, 1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(torch.rand(D, generator=g) + 2.5)
        k_norm.weight.copy_(torch.rand(D, generator=g) + 0.5)
    q_norm, k_norm = q_norm.to(DEVICE, dtype), k_norm.to(DEVICE, dtype)
    positions = torch.randint(0, 200_000, (T,), generator=g).to(DEVICE)  # long-context positions
    cos, sin = rope_cos_sin(positions, D, 1e6)
    slots_pool = 3 * T + 7
    slots = torch.randperm(slots_pool, generator=g)[:T].to(DEVICE)  # scattered slots
    k_pool = torch.zeros(slots_pool, hkv, D, device=DEVICE, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)

    q, k = fused_ops.qk_norm_rope_store(qkv, num_q_heads=hq, num_kv_heads=hkv, q_norm_weight=q_norm.weight,
                                        k_norm_weight=k_norm.weight, eps=1e-6, cos=cos, sin=sin, slots=slots,
                                        k_pool=k_pool, v_pool=v_pool)
    q_ref = apply_rope(q_norm(qkv[:, :hq]), cos, sin)
    k_ref = apply_rope(k_norm(qkv[:, hq:hq + hkv]), cos, sin)
    _close(q, q_ref, dtype)
    _close(k, k_ref, dtype)
    torch.testing.assert_close(k_pool[slots], k, rtol=0, atol=0)  # the pool holds exactly the returned keys
    torch.testing.assert_close(v_pool[slots], qkv[:, hq + hkv:], rtol=0, atol=0)
    untouched = torch.ones(slots_pool, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert not k_pool[untouched].any() and not v_pool[untouched].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,inter", [(1, 96), (8, 1500), (3, 4096)])
def test_silu_mul_matches_torch(dtype, T, inter):
    g = torch.Generator().manual_seed(T + inter)
    gate_up = (3 * torch.randn(T, 2 * inter, generator=g)).to(DEVICE, dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    _close(fused_ops.silu_mul(gate_up), torch.nn.functional.silu(gate) * up, dtype)


def test_bad_arguments_name_what_is_wrong():
    x = torch.randn(4, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\)"):
        fused_ops.add_rms_norm(x, weight=torch.ones(32, device=DEVICE), eps=1e-6)
    with pytest.raises(ValueError, match="residual"):
        fused_ops.add_rms_norm(x, weight=torch.ones(64, device=DEVICE), eps=1e-6, residual=torch.zeros(4, 32, device=DEVICE))
    qkv = torch.randn(2, 7, 32, device=DEVICE)
    cos = sin = torch.zeros(2, 32, device=DEVICE)
    pool = torch.zeros(8, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="expected num_q_heads"):
        fused_ops.qk_norm_rope_store(qkv, num_q_heads=4, num_kv_heads=2, q_norm_weight=torch.ones(32, device=DEVICE),
                                     k_norm_weight=torch.ones(32, device=DEVICE), eps=1e-6, cos=cos, sin=sin,
                                     slots=torch.arange(2, device=DEVICE), k_pool=pool, v_pool=pool)
    with pytest.raises(ValueError, match="odd"):
        fused_ops.silu_mul(torch.randn(2, 7, device=DEVICE))
