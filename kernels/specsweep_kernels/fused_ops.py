"""Fused element-wise kernels for the reference engine's decoder layer (Triton).

A Qwen3 layer run op by op launches ~45 kernels per layer (RMSNorm, residual adds, q/k-norm and RoPE each
as several fp32 element-wise pieces, the KV store, SiLU x up). At decode and verify sizes (T <= 64 tokens)
each one is a few microseconds of launch and latency, which on a 36-layer model is milliseconds per step
(docs/gpu.md). These three kernels replace them with three launches per layer:

- `add_rms_norm(x, weight, eps, residual=None)`: `residual += x` (rounded to the activation dtype, as the
  unfused `x + residual`), then RMSNorm of the sum: one read and one write per row.
- `qk_norm_rope_store(qkv, ...)`: from the fused QKV projection, q/k RMSNorm + rotary embedding (half-split
  layout, HF's `rotate_half`) for q and k, and the store of the new K/V rows into the paged pool at their
  slots; returns q and k for the attention call.
- `silu_mul(gate_up)`: SiLU(gate) * up of the fused gate/up projection.

Numerics follow the unfused torch code step by step (fp32 math, rounding to the activation dtype where torch
rounds: after the normalisation, after the weight, after SiLU), so outputs agree with it to within an ulp of
the activation dtype (tests/kernels/test_fused_ops.py). All arguments keyword-only after the first, shapes
and dtypes checked. On CPU tensors the kernels run through Triton's interpreter when TRITON_INTERPRET=1 was
set before import (tests); `available(device)` says whether they can run on a device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["add_rms_norm", "available", "qk_norm_rope_store", "silu_mul"]


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_r, stride_o,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)  # the unfused `x + residual`
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    y = (xf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)  # F.rms_norm(x.float()).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, slots_ptr,
    q_out_ptr, k_out_ptr, k_pool_ptr, v_pool_ptr,
    eps,
    stride_qkv_t, stride_qkv_h, stride_cos_t, stride_sin_t,
    stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h,
    stride_kp_s, stride_kp_h, stride_vp_s, stride_vp_h,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)  # 0..Hq-1: q heads, then Hkv k heads, then Hkv v heads
    lo = tl.arange(0, HALF)
    src = qkv_ptr + t * stride_qkv_t + h * stride_qkv_h
    x1 = tl.load(src + lo)
    x2 = tl.load(src + HALF + lo)
    dtype = x1.dtype
    if h < NUM_Q_HEADS + NUM_KV_HEADS:
        is_q = h < NUM_Q_HEADS
        if is_q:
            w1 = tl.load(q_norm_ptr + lo).to(tl.float32)
            w2 = tl.load(q_norm_ptr + HALF + lo).to(tl.float32)
        else:
            w1 = tl.load(k_norm_ptr + lo).to(tl.float32)
            w2 = tl.load(k_norm_ptr + HALF + lo).to(tl.float32)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0)) / (2 * HALF) + eps)
        n1 = ((f1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)  # q_norm(x) as the unfused RMSNorm
        n2 = ((f2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
        c = tl.load(cos_ptr + t * stride_cos_t + lo)
        s = tl.load(sin_ptr + t * stride_sin_t + lo)
        o1 = (n1 * c + (-n2) * s).to(dtype)  # x * cos + rotate_half(x) * sin, first half
        o2 = (n2 * c + n1 * s).to(dtype)
        if is_q:
            dst = q_out_ptr + t * stride_qo_t + h * stride_qo_h
            tl.store(dst + lo, o1)
            tl.store(dst + HALF + lo, o2)
        else:
            kh = h - NUM_Q_HEADS
            dst = k_out_ptr + t * stride_ko_t + kh * stride_ko_h
            tl.store(dst + lo, o1)
            tl.store(dst + HALF + lo, o2)
            slot = tl.load(slots_ptr + t).to(tl.int64)
            pool = k_pool_ptr + slot * stride_kp_s + kh * stride_kp_h
            tl.store(pool + lo, o1.to(k_pool_ptr.dtype.element_ty))
            tl.store(pool + HALF + lo, o2.to(k_pool_ptr.dtype.element_ty))
    else:
        vh = h - NUM_Q_HEADS - NUM_KV_HEADS
        slot = tl.load(slots_ptr + t).to(tl.int64)
        pool = v_pool_ptr + slot * stride_vp_s + vh * stride_vp_h
        tl.store(pool + lo, x1.to(v_pool_ptr.dtype.element_ty))
        tl.store(pool + HALF + lo, x2.to(v_pool_ptr.dtype.element_ty))


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, stride_gu, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n_cols + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)  # F.silu(gate), rounded as torch does
    tl.store(out_ptr + row * stride_o + cols, (act * u.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


def _interpreted() -> bool:
    return not isinstance(_silu_mul_kernel, triton.runtime.JITFunction)


def available(device: torch.device | str) -> bool:
    """The kernels can run on `device`: compiled on CUDA, or through the interpreter on CPU."""
    device = torch.device(device)
    return (device.type == "cuda" and torch.cuda.is_available()) or (device.type == "cpu" and _interpreted())


def _check(name: str, t: Tensor, ndim: int, like: Tensor | None = None) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous, strides {t.stride()}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, expected {like.device}")


def add_rms_norm(x: Tensor, *, weight: Tensor, eps: float, residual: Tensor | None = None,
                 out: Tensor | None = None) -> Tensor:
    """RMSNorm of `x` ([T, H]) or, with `residual`, of `residual + x` — then `residual` holds the sum
    (updated in place, the next layer's residual stream). Returns the normed rows (new tensor or `out`)."""
    _check("x", x, 2)
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight: expected shape ({x.shape[1]},), got {tuple(weight.shape)}")
    if residual is not None:
        _check("residual", residual, 2, x)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x "
                             f"{tuple(x.shape)} {x.dtype}")
    out = torch.empty_like(x) if out is None else out
    n_rows, n_cols = x.shape
    if n_rows:
        _add_rms_norm_kernel[(n_rows,)](
            x, residual if residual is not None else x, weight, out, n_cols, eps, x.stride(0),
            residual.stride(0) if residual is not None else 0, out.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n_cols), num_warps=4)
    return out


def qk_norm_rope_store(qkv: Tensor, *, num_q_heads: int, num_kv_heads: int, q_norm_weight: Tensor,
                       k_norm_weight: Tensor, eps: float, cos: Tensor, sin: Tensor, slots: Tensor,
                       k_pool: Tensor, v_pool: Tensor) -> tuple[Tensor, Tensor]:
    """qkv: [T, Hq + 2 Hkv, D] (the fused projection's output viewed per head). q/k RMSNorm with their
    weights [D], RoPE with cos/sin [T, D] (or [T, 1, D]; half-split, both halves equal), K and V stored at
    pool rows `slots` [T] of k_pool/v_pool [S, Hkv, D]. Returns q [T, Hq, D] and k [T, Hkv, D] (roped)."""
    _check("qkv", qkv, 3)
    T, heads, D = qkv.shape
    if heads != num_q_heads + 2 * num_kv_heads:
        raise ValueError(f"qkv has {heads} heads, expected num_q_heads + 2 * num_kv_heads = "
                         f"{num_q_heads + 2 * num_kv_heads}")
    if D % 2 or (D // 2) & (D // 2 - 1):
        raise ValueError(f"head dim {D}: need 2 * a power of two")
    cos, sin = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (T, D) or t.dtype != torch.float32:
            raise ValueError(f"{name}: expected [{T}, {D}] float32, got {tuple(t.shape)} {t.dtype}")
        _check(name, t, 2, qkv)
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w.shape != (D,):
            raise ValueError(f"{name}: expected shape ({D},), got {tuple(w.shape)}")
    if slots.shape != (T,):
        raise ValueError(f"slots: expected shape ({T},), got {tuple(slots.shape)}")
    for name, p in (("k_pool", k_pool), ("v_pool", v_pool)):
        _check(name, p, 3, qkv)
        if p.shape[1:] != (num_kv_heads, D):
            raise ValueError(f"{name}: expected [slots, {num_kv_heads}, {D}], got {tuple(p.shape)}")
    q = torch.empty(T, num_q_heads, D, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(T, num_kv_heads, D, device=qkv.device, dtype=qkv.dtype)
    if T:
        _qk_norm_rope_store_kernel[(T, heads)](
            qkv, q_norm_weight, k_norm_weight, cos, sin, slots, q, k, k_pool, v_pool, eps,
            qkv.stride(0), qkv.stride(1), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
            k.stride(0), k.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HALF=D // 2, num_warps=1)
    return q, k


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up: [T, 2 I] (gate first, as the fused projection writes it) -> SiLU(gate) * up, [T, I]."""
    _check("gate_up", gate_up, 2)
    T, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up: last dim {two_i} is odd")
    n = two_i // 2
    out = torch.empty(T, n, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    if T:
        _silu_mul_kernel[(T, triton.cdiv(n, block))](gate_up, out, n, gate_up.stride(0), out.stride(0), BLOCK=block,
                                                      num_warps=4)
    return out
