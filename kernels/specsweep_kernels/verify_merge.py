"""The merge of a verify call: out = each request's partials (its prefix items and its new tokens) combined by
their log2-sum-exps, one program per (request, token, head) and Dv block, in one round of loads where a request
has few parts. Launched after either attention kernel (Triton or Gluon), as a programmatic dependent launch on
sm_90 and newer (the caller decides: verify_attention._pdl_supported).
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from specsweep_kernels.verify_plan import VerifyWorkspace

__all__ = ["merge_tiles"]


@triton.jit
def _verify_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    kv_indptr_ptr, prefix_lens_ptr, req_ptr,
    batch,
    num_splits,
    stride_pos, stride_pot, stride_poh,
    stride_pls, stride_plt,
    stride_ob, stride_ot, stride_oh,
    T: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr,
    BLOCK_N: tl.constexpr,  # the attention kernel's, to count batch 1's slices
    BLOCK_DV: tl.constexpr,  # dims of Dv handled by this program
    BLOCK_SC: tl.constexpr,  # parts loaded at once (all of them whenever a request has <= BLOCK_SC)
    USE_INDPTR: tl.constexpr,
    SINGLE_REQUEST: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent of the attention kernel (_pdl_supported)
):
    """out[b, t, h, dv block] = the request's partials combined by their log2-sum-exps, in one pass: every load of
    a chunk (its log-sum-exps and its partial rows) is issued together and folded into a running (max, sum, acc),
    so a request with <= BLOCK_SC parts costs one round of loads after the slot lookup.
    PDL: the program may start while the attention kernel still runs; until griddepcontrol.wait returns (the
    attention kernel has completed and its partials are visible) it reads only what kernels before the attention
    kernel wrote (the prefix lengths, the plan's req)."""
    pid = tl.program_id(0)
    b = pid // (T * NUM_Q_HEADS)
    t = (pid // NUM_Q_HEADS) % T
    h = pid % NUM_Q_HEADS
    if SINGLE_REQUEST:  # slices 0 .. num_parts - 1 have work
        if USE_INDPTR:
            prefix_len = tl.load(kv_indptr_ptr + 1) - tl.load(kv_indptr_ptr)
        else:
            prefix_len = tl.load(prefix_lens_ptr)
        per_split = tl.cdiv(tl.cdiv(prefix_len, num_splits), BLOCK_N) * BLOCK_N
        first_slot = 0
        num_parts = tl.where(prefix_len > 0, tl.cdiv(prefix_len, tl.maximum(per_split, 1)), 0)
        new_slot = num_splits
    else:  # the plan: request b's items are slots req[b, 0] .. + req[b, 1] - 1
        first_slot = tl.load(req_ptr + b * 2)
        num_parts = tl.load(req_ptr + b * 2 + 1)
        new_slot = num_splits + batch + b
    offs_dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    row = t * stride_pot + h * stride_poh
    lse_row = part_lse_ptr + t * stride_plt + h
    if PDL:
        tl.extra.cuda.gdc_wait()
    # the new tokens' part: its weight is 1 relative to its own log-sum-exp
    m_i = tl.load(lse_row + new_slot * stride_pls)
    acc = tl.load(part_out_ptr + new_slot * stride_pos + row + offs_dv)
    l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    acc = tl.where(m_i == float("-inf"), 0.0, acc)
    for s0 in range(0, num_parts, BLOCK_SC):
        offs_sc = first_slot + s0 + tl.arange(0, BLOCK_SC)
        mask_sc = s0 + tl.arange(0, BLOCK_SC) < num_parts
        lse = tl.load(lse_row + offs_sc * stride_pls, mask=mask_sc, other=float("-inf"))  # [SC]
        o = tl.load(part_out_ptr + offs_sc[:, None] * stride_pos + row + offs_dv[None, :], mask=mask_sc[:, None],
                    other=0.0)  # [SC, DV]
        m_new = tl.maximum(m_i, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: every weight is 0
        alpha = tl.exp2(m_i - m_safe)
        w = tl.exp2(lse - m_safe)
        acc = acc * alpha + tl.sum(w[:, None] * o, 0)
        l_i = l_i * alpha + tl.sum(w, 0)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)  # nothing visible: output 0
    tl.store(out_ptr + b * stride_ob + t * stride_ot + h * stride_oh + offs_dv, acc.to(out_ptr.dtype.element_ty))


def merge_tiles(*, dv: int, num_splits: int, batch: int) -> tuple[int, int]:
    """(BLOCK_SC, BLOCK_DV) of the merge. Batch 1: all P slices in one load (up to 256; one round of loads per
    program instead of one per 16 parts). Batches: a request has about P / B parts (a long one more; the loop takes
    the rest), so the chunk is sized by that, at least 16 (sized by P it was 13-21% slower on ragged MLA batches,
    H200 2026-12-01). The Dv block as wide as keeps a program's chunk at <= 8192 fp32 (64 registers a thread at 4 warps)."""
    parts = num_splits if batch == 1 else max(16, -(-num_splits // batch) + 1)
    block_sc = min(256, triton.next_power_of_2(parts))
    block_dv = min(dv, max(16, 8192 // block_sc))
    return block_sc, block_dv


def _launch_merge(workspace: VerifyWorkspace, out: Tensor, kv_indptr: Tensor, prefix_lens: Tensor, *, num_splits: int,
                  block_n: int, use_indptr: bool, single: bool, pdl: bool) -> None:
    """out = the partials of each request (its prefix parts and its new tokens) combined by their log-sum-exps
    (a programmatic dependent launch where _pdl_supported)."""
    batch, num_tokens, num_q_heads, dv = out.shape
    po, pl = workspace.part_out, workspace.part_lse
    block_sc, block_dv = merge_tiles(dv=dv, num_splits=num_splits, batch=batch)
    _verify_merge_kernel[(batch * num_tokens * num_q_heads, triton.cdiv(dv, block_dv))](
        po, pl, out,
        kv_indptr, prefix_lens, workspace.req,
        batch,
        num_splits,
        po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        T=num_tokens, NUM_Q_HEADS=num_q_heads, BLOCK_N=block_n,
        BLOCK_DV=block_dv, BLOCK_SC=block_sc, USE_INDPTR=use_indptr, SINGLE_REQUEST=single, PDL=pdl,
        num_warps=4, **({"launch_pdl": True} if pdl else {}),
    )
