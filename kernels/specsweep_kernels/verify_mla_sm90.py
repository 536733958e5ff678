"""MLA verify attention for sm_90 (H100 / H200) in Gluon: explicit wgmma, cp.async gathers, Dv over two warpgroups.

The plan's programs (verify_attention.plan_verify: item = (request b, prefix positions [lo, hi)), largest first;
at batch 1 instead P equal slices computed here from the prefix length, no plan) and one program per request's T
new tokens run this kernel; each owns BLOCK_M = 64 rows (draft token x query head)
and streams its latent rows (576 = 512 + 64 rope dims; for the new tokens k_new under the tree mask) through a
two-stage shared-memory ring, 8 warps in lockstep:
  S = Q_nope K_nope^T + Q_pe K_pe^T       wgmma m64n32k16 per warpgroup (the two warpgroups split S's 64 columns)
  online softmax in registers (log2 domain; row sums per warpgroup until the end)
  O[:, 0:256] / O[:, 256:512] += P V      wgmma m64n256k16, one half of Dv per warpgroup (V = K_nope, same tile)
The gather of tile j + 1 is in flight while tile j is computed, and an iteration takes two tiles: P V of the first
runs under S of the second (a tile past the range is all masked: zero-filled, nothing read, it adds nothing; the
one-tile loop measured -2% to +4% against this, docs/kernels.md item 20). Every wgmma is waited for inside the iteration
that issued it: one in flight across the loop's back edge made ptxas serialise every wgmma of the kernel
(C7514), which cost 10-20% (docs/kernels.md). It writes the normalised fp32 partial and log2-sum-exp of each
item to the item's workspace slot and of each request's new tokens to slot P + B + b, the layout
verify_attention's merge reads. The portable Triton kernel (verify_attention.py) stays the path for GQA, for
sm_120 and other GPUs, and for fp32.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__ = ["BLOCK_M", "BLOCK_N", "launch_mla_sm90", "mla_sm90_supported"]

BLOCK_M = 64
BLOCK_N = 64
_DV = 512
_DPE = 64
_CHUNK = 64  # columns per cp.async chunk (128 bytes of bf16: one swizzle row)
_LOG2E = 1.4426950408889634


@gluon.jit
def _gather_rows(dst_nope, dst_pe, row_ptr, mask, cols, CHUNK: gl.constexpr, DV: gl.constexpr):
    """cp.async of [rows, DV + DPE] (row_ptr [rows, 1] pointers to each row's first element) into the two buffers,
    one CHUNK-column slice at a time (keeps the pointer tensors small). Masked rows are zero-filled."""
    for c in gl.static_range(DV // CHUNK):
        async_copy.async_copy_global_to_shared(dst_nope.slice(c * CHUNK, CHUNK, dim=1),
                                               row_ptr + gl.expand_dims(c * CHUNK + cols, 0), mask=mask)
    async_copy.async_copy_global_to_shared(dst_pe, row_ptr + gl.expand_dims(DV + cols, 0), mask=mask)


@gluon.jit
def _tile_row_ptrs(kv_ptr, idx_base, new_base, is_new, start, hi, stride_kvs, stride_knt, rows,
                   PAGE_SIZE: gl.constexpr):
    """Row pointers [BLOCK_N, 1] and mask of positions start .. start + BLOCK_N - 1 (< hi): prefix positions
    through the page table / slot list, or (is_new) the request's new tokens in k_new."""
    pos = start + rows
    ok = pos < hi
    if is_new:
        ptr = new_base + pos.to(gl.int64) * stride_knt
    else:
        if PAGE_SIZE == 1:
            slot = gl.load(idx_base + pos, mask=ok, other=0).to(gl.int64)
        else:
            page = gl.load(idx_base + pos // PAGE_SIZE, mask=ok, other=0).to(gl.int64)
            slot = page * PAGE_SIZE + (pos % PAGE_SIZE)
        ptr = kv_ptr + slot * stride_kvs
    return gl.expand_dims(ptr, 1), gl.expand_dims(ok, 1)


@gluon.jit
def _online_softmax(s, start, hi, visible, m_i, l_i, qk_scale, s_cols):
    """One tile's scores into the running (max, sum): columns past hi and (new tokens) outside the tree are out.
    The sum is kept per warpgroup (l_i [M, 2], each warpgroup's own 32 columns, reduced within the warp) and added
    up once after the loop: a row's full sum every tile was a cross-warpgroup exchange through shared memory
    (4-6% of the compute-bound calls, run 21; the row max still needs one, for the common scale of P).
    Returns (P, new max, the old accumulator's scale, new per-warpgroup sums)."""
    s = gl.where(gl.expand_dims(start + s_cols < hi, 0) & visible, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    part = gl.sum(gl.reshape(p, [p.shape[0], 2, p.shape[1] // 2]), axis=2)  # [M, 2]: the 2 is the warpgroup
    alpha_l = gl.convert_layout(alpha, gl.SliceLayout(1, part.type.layout))
    return p, m_new, alpha, l_i * gl.expand_dims(alpha_l, 1) + part


@gluon.jit
def _mla_verify_sm90_kernel(
    q_ptr, kv_ptr, k_new_ptr, tree_mask_ptr, indices_ptr, indptr_ptr, lens_ptr, items_ptr, order_ptr,
    part_out_ptr, part_lse_ptr,
    qk_scale,  # sm_scale * log2(e)
    num_items,  # P + B: the plan's item slots (SINGLE: the P slices); program num_items + b does b's new tokens
    stride_qb, stride_qt, stride_qh,
    stride_kvs,
    stride_knb, stride_knt,
    stride_mb, stride_mt,
    stride_ptb,  # page-table row stride (page-table mode)
    stride_pos, stride_pot, stride_poh,
    stride_pls, stride_plt,
    HQ: gl.constexpr,
    T: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    USE_INDPTR: gl.constexpr,
    SINGLE: gl.constexpr,  # batch 1 without a plan: program s < P streams the s-th equal slice of the prefix
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    DV: gl.constexpr,
    DPE: gl.constexpr,
    CHUNK: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 8, "two warpgroups: the Dv halves")
    gl.static_assert(DPE == CHUNK, "the rope part is one chunk")
    gl.static_assert(T <= BLOCK_N, "the new tokens are one tile")
    pid_m = gl.program_id(0)
    pid_z = gl.program_id(1)
    is_new = pid_z >= num_items
    if is_new:
        b = pid_z - num_items
        lo = 0
        hi = T
        slot = pid_z
    elif SINGLE:  # the slices and slot layout of the Triton kernel's batch 1 (its merge reads them)
        b = 0
        if USE_INDPTR:
            prefix_len = gl.load(indptr_ptr + 1) - gl.load(indptr_ptr)
        else:
            prefix_len = gl.load(lens_ptr)
        per_split = gl.cdiv(gl.cdiv(prefix_len, num_items), BLOCK_N) * BLOCK_N
        lo = gl.minimum(pid_z * per_split, prefix_len)
        hi = gl.minimum(lo + per_split, prefix_len)
        slot = pid_z
    else:
        slot = gl.load(order_ptr + pid_z)
        b = gl.load(items_ptr + slot * 4)
        lo = gl.load(items_ptr + slot * 4 + 1)
        hi = gl.load(items_ptr + slot * 4 + 2)
    if hi > lo:
        # register layouts: S [M, N] and O [M, DV] split over the 2 warpgroups along their columns
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, DV // 2, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                   warps_per_cta=[8, 1], order=[1, 0])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        dtype: gl.constexpr = q_ptr.dtype.element_ty

        q_nope = gl.allocate_shared_memory(dtype, [BLOCK_M, DV], smem_layout)
        q_pe = gl.allocate_shared_memory(dtype, [BLOCK_M, DPE], smem_layout)
        k_nope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DV], smem_layout)
        k_pe = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DPE], smem_layout)

        cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld_layout))
        # Q rows: row r = t * HQ + h of this m-block
        q_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
        q_ok = gl.expand_dims(q_rows < T * HQ, 1)
        q_row_ptr = gl.expand_dims(q_ptr + b * stride_qb + (q_rows // HQ) * stride_qt + (q_rows % HQ) * stride_qh, 1)
        _gather_rows(q_nope, q_pe, q_row_ptr, q_ok, cols, CHUNK, DV)

        if USE_INDPTR:
            idx_base = indices_ptr + gl.load(indptr_ptr + b)
        else:
            idx_base = indices_ptr + b * stride_ptb
        new_base = k_new_ptr + b.to(gl.int64) * stride_knb
        kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        row_ptr, ok = _tile_row_ptrs(kv_ptr, idx_base, new_base, is_new, lo, hi, stride_kvs, stride_knt, kv_rows,
                                     PAGE_SIZE)
        _gather_rows(k_nope.index(0), k_pe.index(0), row_ptr, ok, cols, CHUNK, DV)
        async_copy.commit_group()

        s_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        s_cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        # the tree mask of the new tokens ([row's token, new token j]); every prefix position is visible
        visible = gl.load(tree_mask_ptr + b * stride_mb + gl.expand_dims((s_rows // HQ) * stride_mt, 1)
                          + gl.expand_dims(s_cols, 0),
                          mask=gl.expand_dims((s_rows < T * HQ) & is_new, 1) & gl.expand_dims(s_cols < T, 0),
                          other=1) != 0
        m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        l_i = gl.sum(gl.reshape(s_zero, [BLOCK_M, 2, BLOCK_N // 2]), axis=2)  # [M, 2]: per-warpgroup row sums
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        # two tiles per iteration: P V of the first runs while S of the second is computed
        for jj in range(0, n_tiles, 2):
            start = lo + jj * BLOCK_N
            async_copy.wait_group(0)  # tile jj (stage 0) has landed for this thread's copies
            gl.thread_barrier()  # ... and for every thread's; every warp is done with stage 1
            fence_async_shared()  # generic-proxy writes before wgmma's async-proxy reads
            s_tok = warpgroup_mma(q_nope, k_nope.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index(0).permute((1, 0)), s_tok, is_async=True)
            # tile jj + 1 into stage 1 (past hi: all rows masked, nothing read, the tile adds nothing)
            row_ptr, ok = _tile_row_ptrs(kv_ptr, idx_base, new_base, is_new, start + BLOCK_N, hi, stride_kvs,
                                         stride_knt, kv_rows, PAGE_SIZE)
            _gather_rows(k_nope.index(1), k_pe.index(1), row_ptr, ok, cols, CHUNK, DV)
            async_copy.commit_group()
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p, m_i, alpha, l_i = _online_softmax(s, start, hi, visible, m_i, l_i, qk_scale, s_cols)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            acc_tok = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), k_nope.index(0), acc, is_async=True)
            async_copy.wait_group(0)  # tile jj + 1
            gl.thread_barrier()
            fence_async_shared()
            s_tok = warpgroup_mma(q_nope, k_nope.index(1).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index(1).permute((1, 0)), s_tok, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc_tok,))  # P V of tile jj (issued before S)
            gl.thread_barrier()  # every warp is done with stage 0
            if jj + 2 < n_tiles:
                row_ptr, ok = _tile_row_ptrs(kv_ptr, idx_base, new_base, is_new, start + 2 * BLOCK_N, hi,
                                             stride_kvs, stride_knt, kv_rows, PAGE_SIZE)
                _gather_rows(k_nope.index(0), k_pe.index(0), row_ptr, ok, cols, CHUNK, DV)
                async_copy.commit_group()
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p, m_i, alpha, l_i = _online_softmax(s, start + BLOCK_N, hi, visible, m_i, l_i, qk_scale, s_cols)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            acc_tok = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), k_nope.index(1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))  # nothing in flight across iterations

        l_i = gl.convert_layout(gl.sum(l_i, axis=1), gl.SliceLayout(1, s_layout))
        l_safe = gl.where(l_i > 0, l_i, 1.0)
        lse = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), 1)
        o_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
        o_ptr = (part_out_ptr + slot * stride_pos + gl.expand_dims((o_rows // HQ) * stride_pot
                                                                   + (o_rows % HQ) * stride_poh, 1)
                 + gl.expand_dims(o_cols, 0))
        gl.store(o_ptr, out, mask=gl.expand_dims(o_rows < T * HQ, 1))
        gl.store(part_lse_ptr + slot * stride_pls + (s_rows // HQ) * stride_plt + s_rows % HQ, lse,
                 mask=s_rows < T * HQ)


def mla_sm90_supported(q: torch.Tensor, *, v_is_k: bool, dk: int, dv: int) -> bool:
    """This kernel's domain: MLA (576 = 512 + 64, one latent head), bf16 / fp16, on a CUDA sm_90 device."""
    return (v_is_k and dk == _DV + _DPE and dv == _DV and q.dtype in (torch.bfloat16, torch.float16)
            and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9)


def launch_mla_sm90(*, q, kv_buffer, k_new, tree_mask, indices, kv_indptr, prefix_lens, page_table_stride: int,
                    items, order, part_out, part_lse, num_items: int, sm_scale: float, page_size: int,
                    use_indptr: bool, single: bool = False):
    """One launch over (m-blocks, num_items + B): the plan's items (program p runs item order[p]), then each
    request's new tokens; single (batch 1, no plan): num_items = P equal slices of the prefix in slots 0..P-1, the
    new tokens in slot P. q [B, T, Hq, 576], kv_buffer [slots, 1, 576], k_new [B, T, 1, 576], tree_mask [B, T, T]
    uint8, indices: kv_indices (use_indptr) or the page table; part_out / part_lse: the workspace's partials.
    Returns the compiled kernel."""
    batch, num_tokens, num_q_heads, _ = q.shape
    m_blocks = triton.cdiv(num_tokens * num_q_heads, BLOCK_M)
    return _mla_verify_sm90_kernel[(m_blocks, num_items + batch)](
        q, kv_buffer, k_new, tree_mask, indices, kv_indptr, prefix_lens, items, order, part_out, part_lse,
        sm_scale * _LOG2E,
        num_items,
        q.stride(0), q.stride(1), q.stride(2),
        kv_buffer.stride(0),
        k_new.stride(0), k_new.stride(1),
        tree_mask.stride(0), tree_mask.stride(1),
        page_table_stride,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        HQ=num_q_heads, T=num_tokens, PAGE_SIZE=page_size, USE_INDPTR=use_indptr, SINGLE=single,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DV=_DV, DPE=_DPE, CHUNK=_CHUNK,
        num_warps=8,
    )
