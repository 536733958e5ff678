"""MLA verify attention for sm_90 (H100 / H200) in Gluon: explicit wgmma, cp.async gathers, Dv over two warpgroups.

The plan's programs (verify_attention.plan_verify: item = (request b, prefix positions [lo, hi)), largest first;
at batch 1 instead P equal slices computed here from the prefix length, no plan) and one program per request's T
new tokens run one of two kernels, 8 warps in lockstep, each streaming its latent rows (576 = 512 + 64 rope dims;
for the new tokens k_new under the tree mask) through a two-stage shared-memory ring:
- calls of more than 32 rows (draft token x query head): _mla_verify_sm90_kernel, BLOCK_M = 64 rows a program,
    S = Q_nope K_nope^T + Q_pe K_pe^T       wgmma m64n32k16 per warpgroup (the two warpgroups split S's 64 columns)
    online softmax in registers (log2 domain; row sums per warpgroup until the end)
    O[:, 0:256] / O[:, 256:512] += P V      wgmma m64n256k16, one half of Dv per warpgroup (V = K_nope, same tile)
  An iteration takes two tiles: S of the second is issued before P V of the first, and the second's softmax runs
  while the tensor cores compute P V of the first (3.5-8.5% on compute-bound rows, H200 2026-12-01; a tile past the range
  is all masked: zero-filled, nothing read, it adds nothing; the one-tile loop measured -2% to +4% against the
  two-tile one); for T >= 2 the first tile's rescale and P exchange are issued after S of
  the second tile (under_s: 0.7-1.7% on T >= 2, 2026-12-02); each stage is refilled as soon as every warp is done with it, so two
  tiles are in flight across the iteration's boundary (+1-4%), and the slot / page words of a refill are
  loaded one refill ahead (page 1: +2-13%). The tree mask is loaded per tile in the new-token programs' branch, so
  no [64, 64] mask is live across the prefix loop (MASK_IN_BRANCH: 7-14% on 8 heads T 8..17, 2026-12-03). Every
  wgmma is waited for inside the iteration that issued
  it: one in flight across the loop's back edge made ptxas serialise every wgmma of the kernel (C7514), which cost
  10-20% (ptxas's own report; all figures H200, 2026-12-01, journal in docs/measurements/2026-12-01-h200/).
- calls of at most 32 rows (16 heads at T = 1 / 2, DeepSeek's decode under TP 8), and at batch 1, page 1 the last <= 32
  rows of a call past its full 64-row m-blocks (REMAINDER_BESIDE: 8 heads x a 9-node tree = 64 + 8): _mla_verify_sm90_narrow_kernel,
  the products swapped so that a tile's 64 keys fill wgmma's 64-row side instead of 16 rows padded to 64
  (S^T = K Q^T, O^T = V^T P^T: at 16 rows the 64-row product computed 4x the FLOPs, and at 128k that alone
  took longer than reading the latent rows).
Both write the normalised fp32 partial and log2-sum-exp of each item to the item's workspace slot and of each
request's new tokens to slot P + B + b, the layout verify_attention's merge reads; both signal the merge, a
programmatic dependent launch, as they start (_signal_dependents: 0.3-0.8 us on 6 of 7 batch-1 MLA shapes, 2026-12-01). The portable Triton
kernel (verify_triton.py) stays the path for GQA, for sm_120 and other GPUs, and for fp32.
"""
from __future__ import annotations

import torch
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
NARROW_MAX_ROWS = 32  # calls of at most this many rows (tokens x heads) run the swapped-product kernel
_CHUNK = 64  # columns per cp.async chunk (128 bytes of bf16: one swizzle row)
_LOG2E = 1.4426950408889634


@gluon.jit
def _signal_dependents():
    """griddepcontrol.launch_dependents: the merge (a programmatic dependent launch) may be launched now; its
    programs take SMs as this kernel's programs leave them and wait in griddepcontrol.wait until it has completed."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _wait_prerequisite():
    """griddepcontrol.wait: until the kernel this one is a programmatic dependent of (the plan) has completed and
    its writes are visible; launched without that attribute it returns at once."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gather_rows(dst_nope, dst_pe, row_ptr, mask, cols, CHUNK: gl.constexpr, DV: gl.constexpr):
    """cp.async of [rows, DV + DPE] (row_ptr [rows, 1] pointers to each row's first element) into the two buffers,
    one CHUNK-column slice at a time (keeps the pointer tensors small). Masked rows are zero-filled."""
    for c in gl.static_range(DV // CHUNK):
        async_copy.async_copy_global_to_shared(dst_nope.slice(c * CHUNK, CHUNK, dim=1),
                                               row_ptr + gl.expand_dims(c * CHUNK + cols, 0), mask=mask)
    async_copy.async_copy_global_to_shared(dst_pe, row_ptr + gl.expand_dims(DV + cols, 0), mask=mask)


@gluon.jit
def _tile_index(idx_base, is_new, start, hi, rows, PAGE_SIZE: gl.constexpr):
    """The slot (page 1) or page (page > 1) words of positions start .. start + BLOCK_N - 1 (< hi) of a prefix, 0
    past hi and for new-token programs. The 64-row kernel loads them one refill ahead of the copies that use them
    (_tile_ptrs), so its gathers do not wait for the words' latency (page 1: 2-13% faster, H200 2026-12-01)."""
    pos = start + rows
    ok = (pos < hi) & (not is_new)
    if PAGE_SIZE == 1:
        return gl.load(idx_base + pos, mask=ok, other=0)
    else:
        return gl.load(idx_base + pos // PAGE_SIZE, mask=ok, other=0)


@gluon.jit
def _tile_ptrs(kv_ptr, new_base, is_new, idx, start, hi, stride_kvs, stride_knt, rows, PAGE_SIZE: gl.constexpr):
    """Row pointers [BLOCK_N, 1] and mask of positions start .. start + BLOCK_N - 1 (< hi): prefix positions at
    the slots of idx (_tile_index of the same positions), or (is_new) the request's new tokens in k_new."""
    pos = start + rows
    ok = pos < hi
    if is_new:
        ptr = new_base + pos.to(gl.int64) * stride_knt
    else:
        if PAGE_SIZE == 1:
            slot = idx.to(gl.int64)
        else:
            slot = idx.to(gl.int64) * PAGE_SIZE + (pos % PAGE_SIZE)
        ptr = kv_ptr + slot * stride_kvs
    return gl.expand_dims(ptr, 1), gl.expand_dims(ok, 1)


@gluon.jit
def _load_tile(dst_nope, dst_pe, kv_ptr, new_base, is_new, idx, start, hi, stride_kvs, stride_knt, rows, cols,
               PAGE_SIZE: gl.constexpr, CHUNK: gl.constexpr, DV: gl.constexpr):
    """One cp.async group: the latent rows of positions start .. start + BLOCK_N - 1 at the slots of idx
    (_tile_index of the same positions) or the new tokens into one ring stage; rows at or past hi are zero-filled
    and read nothing (a tile wholly past the range adds nothing to the products)."""
    row_ptr, ok = _tile_ptrs(kv_ptr, new_base, is_new, idx, start, hi, stride_kvs, stride_knt, rows, PAGE_SIZE)
    _gather_rows(dst_nope, dst_pe, row_ptr, ok, cols, CHUNK, DV)
    async_copy.commit_group()


@gluon.jit
def _request_setup(q_nope, q_pe, q_ptr, q_rows, q_cols, b, stride_qb, stride_qt, stride_qh, indices_ptr, indptr_ptr,
                   stride_ptb, k_new_ptr, stride_knb, T: gl.constexpr, HQ: gl.constexpr, USE_INDPTR: gl.constexpr,
                   CHUNK: gl.constexpr, DV: gl.constexpr):
    """cp.async of request b's Q rows q_rows (row r = token r // HQ, head r % HQ; rows past T * HQ zero-filled) into
    q_nope / q_pe, and the request's bases: its index words (kv_indices + indptr[b], or its page-table row) and its
    new tokens in k_new."""
    q_ok = gl.expand_dims(q_rows < T * HQ, 1)
    q_row_ptr = gl.expand_dims(q_ptr + b * stride_qb + (q_rows // HQ) * stride_qt + (q_rows % HQ) * stride_qh, 1)
    _gather_rows(q_nope, q_pe, q_row_ptr, q_ok, q_cols, CHUNK, DV)
    if USE_INDPTR:
        idx_base = indices_ptr + gl.load(indptr_ptr + b)
    else:
        idx_base = indices_ptr + b * stride_ptb
    return idx_base, k_new_ptr + b.to(gl.int64) * stride_knb


@gluon.jit
def _tree_visible(tree_mask_ptr, b, stride_mb, stride_mt, rows, keys, is_new, T: gl.constexpr, HQ: gl.constexpr):
    """May row r (token r // HQ) see new token k under request b's tree mask; rows / keys are 2-D index tensors that
    broadcast (either orientation: [rows, 1] x [1, keys] or [1, rows] x [keys, 1]); every prefix position is
    visible (not is_new)."""
    return gl.load(tree_mask_ptr + b * stride_mb + (rows // HQ) * stride_mt + keys,
                   mask=(rows < T * HQ) & is_new & (keys < T), other=1) != 0


@gluon.jit
def _store_partial(part_out_ptr, part_lse_ptr, slot, acc, l_i, m_i, o_rows, o_dims, lse_rows, stride_pos, stride_pot,
                   stride_poh, stride_pls, stride_plt, T: gl.constexpr, HQ: gl.constexpr, ROW_AXIS: gl.constexpr):
    """The normalised partial acc / l (acc's rows along ROW_AXIS; o_rows / o_dims its 2-D broadcastable row and Dv
    indices) and its log2-sum-exp m + log2(l) (l_i, m_i per row of lse_rows) into workspace slot `slot`; an empty
    row (l = 0) gets -inf."""
    l_safe = gl.where(l_i > 0, l_i, 1.0)
    lse = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
    out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1 - ROW_AXIS, acc.type.layout)), 1 - ROW_AXIS)
    gl.store(part_out_ptr + slot * stride_pos + (o_rows // HQ) * stride_pot + (o_rows % HQ) * stride_poh + o_dims, out,
             mask=o_rows < T * HQ)
    gl.store(part_lse_ptr + slot * stride_pls + (lse_rows // HQ) * stride_plt + lse_rows % HQ, lse,
             mask=lse_rows < T * HQ)


@gluon.jit
def _online_softmax(s, start, hi, visible, m_i, l_i, qk_scale, s_cols, s_rows, is_new, tree_mask_ptr, b, stride_mb,
                    stride_mt, T: gl.constexpr, HQ: gl.constexpr, MASK_IN_BRANCH: gl.constexpr):
    """One tile's scores into the running (max, sum): columns past hi and (new tokens) outside the tree are out.
    MASK_IN_BRANCH: the tree mask is loaded here, in a branch only new-token programs take, so no [M, N] mask stays
    live across the prefix loop (visible is then unused); else visible (loaded before the loop) is applied.
    The sum is kept per warpgroup (l_i [M, 2], each warpgroup's own 32 columns, reduced within the warp) and added
    up once after the loop: a row's full sum every tile was a cross-warpgroup exchange through shared memory
    (4-6% of the compute-bound calls, H200 2026-12-01; the row max still needs one, for the common scale of P).
    Returns (P, new max, the old accumulator's scale, new per-warpgroup sums)."""
    if MASK_IN_BRANCH:
        s = gl.where(gl.expand_dims(start + s_cols < hi, 0), s, float("-inf"))
        if is_new:
            seen = _tree_visible(tree_mask_ptr, b, stride_mb, stride_mt, gl.expand_dims(s_rows, 1),
                                 gl.expand_dims(s_cols, 0), is_new, T, HQ)
            s = gl.where(seen, s, float("-inf"))
    else:
        s = gl.where(gl.expand_dims(start + s_cols < hi, 0) & visible, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    part = gl.sum(gl.reshape(p, [p.shape[0], 2, p.shape[1] // 2]), axis=2)  # [M, 2]: the 2 is the warpgroup
    alpha_l = gl.convert_layout(alpha, gl.SliceLayout(1, part.type.layout))
    return p, m_new, alpha, l_i * gl.expand_dims(alpha_l, 1) + part


@gluon.jit
def _program_item(pid_z, num_items, items_ptr, order_ptr, indptr_ptr, lens_ptr, T: gl.constexpr,
                  USE_INDPTR: gl.constexpr, SINGLE: gl.constexpr, ALIGN: gl.constexpr):
    """What program pid_z streams: (request b, prefix positions [lo, hi) or, is_new, its T new tokens, the
    workspace slot its partial goes to). Programs >= num_items do request pid_z - num_items's new tokens; SINGLE
    (batch 1, no plan): program s < P takes the s-th equal ALIGN-aligned slice of the prefix (the Triton kernel's
    batch-1 slices, which its merge reads); else the plan's item order[pid_z] (b, lo, hi, -)."""
    is_new = pid_z >= num_items
    if is_new:
        b = pid_z - num_items
        lo = 0
        hi = T
        slot = pid_z
    elif SINGLE:
        b = 0
        if USE_INDPTR:
            prefix_len = gl.load(indptr_ptr + 1) - gl.load(indptr_ptr)
        else:
            prefix_len = gl.load(lens_ptr)
        per_split = gl.cdiv(gl.cdiv(prefix_len, num_items), ALIGN) * ALIGN
        lo = gl.minimum(pid_z * per_split, prefix_len)
        hi = gl.minimum(lo + per_split, prefix_len)
        slot = pid_z
    else:
        slot = gl.load(order_ptr + pid_z)
        b = gl.load(items_ptr + slot * 4)
        lo = gl.load(items_ptr + slot * 4 + 1)
        hi = gl.load(items_ptr + slot * 4 + 2)
    return b, lo, hi, slot, is_new


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
    UNDER_S: gl.constexpr,  # first tile's rescale and P exchange after S of the second is issued (under_s)
    MASK_IN_BRANCH: gl.constexpr,  # the tree mask loaded per tile in the new-token programs' branch (_online_softmax)
    WAIT_PLAN: gl.constexpr,  # launched as the plan kernel's programmatic dependent: wait for it before reading it
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 8, "two warpgroups: the Dv halves")
    gl.static_assert(DPE == CHUNK, "the rope part is one chunk")
    gl.static_assert(T <= BLOCK_N, "the new tokens are one tile")
    _signal_dependents()
    if WAIT_PLAN:
        _wait_prerequisite()
    pid_m = gl.program_id(0)
    pid_z = gl.program_id(1)
    b, lo, hi, slot, is_new = _program_item(pid_z, num_items, items_ptr, order_ptr, indptr_ptr, lens_ptr, T,
                                            USE_INDPTR, SINGLE, BLOCK_N)
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
        idx_base, new_base = _request_setup(q_nope, q_pe, q_ptr, q_rows, cols, b, stride_qb, stride_qt, stride_qh,
                                            indices_ptr, indptr_ptr, stride_ptb, k_new_ptr, stride_knb, T, HQ,
                                            USE_INDPTR, CHUNK, DV)
        kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        for i in gl.static_range(2):  # tiles 0 (with Q) and 1
            _load_tile(k_nope.index(i), k_pe.index(i), kv_ptr, new_base, is_new,
                       _tile_index(idx_base, is_new, lo + i * BLOCK_N, hi, kv_rows, PAGE_SIZE), lo + i * BLOCK_N, hi,
                       stride_kvs, stride_knt, kv_rows, cols, PAGE_SIZE, CHUNK, DV)
        idx0 = _tile_index(idx_base, is_new, lo + 2 * BLOCK_N, hi, kv_rows, PAGE_SIZE)  # the next refills' words
        idx1 = _tile_index(idx_base, is_new, lo + 3 * BLOCK_N, hi, kv_rows, PAGE_SIZE)

        s_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        s_cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        # the tree mask of the new tokens ([row's token, new token j]); every prefix position is visible
        if MASK_IN_BRANCH:
            visible = s_cols  # unused: _online_softmax loads the mask in the new-token programs' branch
        else:
            visible = _tree_visible(tree_mask_ptr, b, stride_mb, stride_mt, gl.expand_dims(s_rows, 1),
                                    gl.expand_dims(s_cols, 0), is_new, T, HQ)
        m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        l_i = gl.sum(gl.reshape(s_zero, [BLOCK_M, 2, BLOCK_N // 2]), axis=2)  # [M, 2]: per-warpgroup row sums
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        # two tiles per iteration: the second's S is issued before the first's P V, and its softmax runs under it
        for jj in range(0, n_tiles, 2):
            start = lo + jj * BLOCK_N
            async_copy.wait_group(1)  # tile jj (stage 0) has landed for this thread's copies; jj + 1 may be in flight
            gl.thread_barrier()  # ... and for every thread's
            fence_async_shared()  # generic-proxy writes before wgmma's async-proxy reads
            s_tok = warpgroup_mma(q_nope, k_nope.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index(0).permute((1, 0)), s_tok, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p, m_i, alpha, l_i = _online_softmax(s, start, hi, visible, m_i, l_i, qk_scale, s_cols, s_rows, is_new,
                                                 tree_mask_ptr, b, stride_mb, stride_mt, T, HQ, MASK_IN_BRANCH)
            if not UNDER_S:
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            async_copy.wait_group(0)  # tile jj + 1
            gl.thread_barrier()
            fence_async_shared()
            # S of tile jj + 1 first, then P V of tile jj: the softmax of jj + 1 runs while P V of jj is computed
            s_tok = warpgroup_mma(q_nope, k_nope.index(1).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index(1).permute((1, 0)), s_tok, is_async=True)
            if UNDER_S:  # the rescale and P's exchange while the tensor cores compute S of tile jj + 1
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p_op, k_nope.index(0), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S of jj + 1 done, P V of jj in flight
            p, m_i, alpha, l_i = _online_softmax(s, start + BLOCK_N, hi, visible, m_i, l_i, qk_scale, s_cols, s_rows, is_new,
                                                 tree_mask_ptr, b, stride_mb, stride_mt, T, HQ, MASK_IN_BRANCH)
            if UNDER_S:  # P of tile jj + 1 exchanged while P V of jj runs
                p_op1 = gl.convert_layout(p.to(dtype), p_layout)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_op))  # P V of tile jj
            more = jj + 2 < n_tiles
            gl.thread_barrier()  # every warp is done with stage 0
            if more:  # tile jj + 2 into stage 0
                _load_tile(k_nope.index(0), k_pe.index(0), kv_ptr, new_base, is_new, idx0, start + 2 * BLOCK_N, hi,
                           stride_kvs, stride_knt, kv_rows, cols, PAGE_SIZE, CHUNK, DV)
                idx0 = _tile_index(idx_base, is_new, start + 4 * BLOCK_N, hi, kv_rows, PAGE_SIZE)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            if not UNDER_S:
                p_op1 = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p_op1, k_nope.index(1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))  # nothing in flight across iterations
            if more:  # tile jj + 3 into stage 1 as soon as every warp is done with it: two tiles in flight
                gl.thread_barrier()
                _load_tile(k_nope.index(1), k_pe.index(1), kv_ptr, new_base, is_new, idx1, start + 3 * BLOCK_N, hi,
                           stride_kvs, stride_knt, kv_rows, cols, PAGE_SIZE, CHUNK, DV)
                idx1 = _tile_index(idx_base, is_new, start + 5 * BLOCK_N, hi, kv_rows, PAGE_SIZE)

        l_i = gl.convert_layout(gl.sum(l_i, axis=1), gl.SliceLayout(1, s_layout))
        o_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
        _store_partial(part_out_ptr, part_lse_ptr, slot, acc, l_i, m_i, gl.expand_dims(o_rows, 1),
                       gl.expand_dims(o_cols, 0), s_rows, stride_pos, stride_pot, stride_poh, stride_pls, stride_plt,
                       T, HQ, 0)


@gluon.jit
def _mla_verify_sm90_narrow_kernel(
    q_ptr, kv_ptr, k_new_ptr, tree_mask_ptr, indices_ptr, indptr_ptr, lens_ptr, items_ptr, order_ptr,
    part_out_ptr, part_lse_ptr,
    qk_scale, num_items,
    stride_qb, stride_qt, stride_qh,
    stride_kvs,
    stride_knb, stride_knt,
    stride_mb, stride_mt,
    stride_ptb,
    stride_pos, stride_pot, stride_poh,
    stride_pls, stride_plt,
    HQ: gl.constexpr,
    T: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    USE_INDPTR: gl.constexpr,
    SINGLE: gl.constexpr,
    BLOCK_R: gl.constexpr,  # 16 or 32 rows (draft token x query head): rows ROW0 .. T * HQ - 1, one m-block
    BLOCK_N: gl.constexpr,
    DV: gl.constexpr,
    DPE: gl.constexpr,
    CHUNK: gl.constexpr,
    WAIT_PLAN: gl.constexpr,
    ROW0: gl.constexpr,  # 0, or (the remainder beside the 64-row kernel) the first row past its full m-blocks
    WAIT_END: gl.constexpr,  # the remainder: griddepcontrol.wait before exiting (see launch_mla_sm90)
    num_warps: gl.constexpr,
):
    """The same work and workspace layout as _mla_verify_sm90_kernel for calls of at most 32 rows, with the
    products swapped so that the 64 keys of a tile, not the padded rows, fill wgmma's 64-row side:
      S^T [keys, rows] = K_nope Q_nope^T + K_pe Q_pe^T   (wgmma m64nRk16; the two warpgroups split the rows)
      O^T [Dv, rows]  += V^T P^T                        (V^T: the tile read transposed; the warpgroups split Dv)
    16 rows through the 64-row product did 4x the FLOPs the call needs, and at 128k that padded compute alone took
    longer than reading the latent rows (H200, 2026-12-01). P^T goes through shared memory (wgmma's B side).
    The softmax runs down S^T's columns (a column's max within its warpgroup; sums kept per thread until the end).
    Two-stage ring, one tile per iteration, the refill of a stage issued as soon as the tile in it is done, so the
    next two tiles are in flight while one is computed."""
    gl.static_assert(num_warps == 8, "two warpgroups")
    gl.static_assert(DPE == CHUNK, "the rope part is one chunk")
    gl.static_assert(T <= BLOCK_N, "the new tokens are one tile")
    gl.static_assert(T * HQ - ROW0 <= BLOCK_R, "one m-block holds every row from ROW0 on")
    _signal_dependents()
    if WAIT_PLAN:
        _wait_prerequisite()
    pid_z = gl.program_id(1)
    b, lo, hi, slot, is_new = _program_item(pid_z, num_items, items_ptr, order_ptr, indptr_ptr, lens_ptr, T,
                                            USE_INDPTR, SINGLE, BLOCK_N)
    if hi > lo:
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_R // 2, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, BLOCK_R, 16])
        ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                   warps_per_cta=[8, 1], order=[1, 0])
        q_ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8 * BLOCK_R // 32], threads_per_warp=[4, 8],
                                                     warps_per_cta=[BLOCK_R // 4, 32 // BLOCK_R], order=[1, 0])
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        dtype: gl.constexpr = q_ptr.dtype.element_ty

        q_nope = gl.allocate_shared_memory(dtype, [BLOCK_R, DV], smem_layout)
        q_pe = gl.allocate_shared_memory(dtype, [BLOCK_R, DPE], smem_layout)
        k_nope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DV], smem_layout)
        k_pe = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DPE], smem_layout)
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_R, BLOCK_N], smem_layout)

        q_cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, q_ld_layout))
        q_rows = ROW0 + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, q_ld_layout))
        idx_base, new_base = _request_setup(q_nope, q_pe, q_ptr, q_rows, q_cols, b, stride_qb, stride_qt, stride_qh,
                                            indices_ptr, indptr_ptr, stride_ptb, k_new_ptr, stride_knb, T, HQ,
                                            USE_INDPTR, CHUNK, DV)
        cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld_layout))
        kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        for i in gl.static_range(2):  # tiles 0 (with Q) and 1
            _load_tile(k_nope.index(i), k_pe.index(i), kv_ptr, new_base, is_new,
                       _tile_index(idx_base, is_new, lo + i * BLOCK_N, hi, kv_rows, PAGE_SIZE), lo + i * BLOCK_N, hi,
                       stride_kvs, stride_knt, kv_rows, cols, PAGE_SIZE, CHUNK, DV)

        keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
        r_cols = ROW0 + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, s_layout))
        # the tree mask of the new tokens: S^T[key j, row r] needs tree_mask[b, token of r, j]
        visible = _tree_visible(tree_mask_ptr, b, stride_mb, stride_mt, gl.expand_dims(r_cols, 0),
                                gl.expand_dims(keys, 1), is_new, T, HQ)
        m_i = gl.full([BLOCK_R], -1.0e30, gl.float32, layout=gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([BLOCK_N, BLOCK_R], gl.float32, layout=s_layout)
        l_acc = gl.zeros([BLOCK_N, BLOCK_R], gl.float32, layout=s_layout)  # per-thread sums, reduced at the end
        acc = gl.zeros([DV, BLOCK_R], gl.float32, layout=o_layout)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for j in range(0, n_tiles):
            stage = j % 2
            start = lo + j * BLOCK_N
            async_copy.wait_group(1)  # tile j has landed for this thread's copies; tile j + 1 may be in flight
            gl.thread_barrier()  # ... and for every thread's
            fence_async_shared()
            s_tok = warpgroup_mma(k_nope.index(stage), q_nope.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(k_pe.index(stage), q_pe.permute((1, 0)), s_tok, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            s = gl.where(gl.expand_dims(start + keys < hi, 1) & visible, s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=0) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 0))
            l_acc = l_acc * gl.expand_dims(alpha, 0) + p
            m_i = m_new
            p_smem.store(gl.permute(p.to(dtype), (1, 0)))
            fence_async_shared()  # generic-proxy stores before wgmma's async-proxy reads
            gl.thread_barrier()  # every warp's keys of P^T are in
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, o_layout)), 0)
            acc_tok = warpgroup_mma(k_nope.index(stage).permute((1, 0)), p_smem.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))
            gl.thread_barrier()  # every warp is done with this stage and with P^T
            # the words are loaded here, not a tile ahead as in the 64-row kernel: ahead was 9-15% slower on the
            # ragged T = 1 rows (page 16, H200 2026-12-01)
            _load_tile(k_nope.index(stage), k_pe.index(stage), kv_ptr, new_base, is_new,
                       _tile_index(idx_base, is_new, start + 2 * BLOCK_N, hi, kv_rows, PAGE_SIZE), start + 2 * BLOCK_N,
                       hi, stride_kvs, stride_knt, kv_rows, cols, PAGE_SIZE, CHUNK, DV)
        async_copy.wait_group(0)  # the masked refills past the end

        o_rows = ROW0 + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, o_layout))
        o_dims = gl.arange(0, DV, layout=gl.SliceLayout(1, o_layout))
        _store_partial(part_out_ptr, part_lse_ptr, slot, acc, gl.sum(l_acc, axis=0), m_i, gl.expand_dims(o_rows, 0),
                       gl.expand_dims(o_dims, 1), r_cols, stride_pos, stride_pot, stride_poh, stride_pls, stride_plt,
                       T, HQ, 1)
    if WAIT_END:  # not complete before the 64-row kernel beside it: the merge waits for this kernel alone
        _wait_prerequisite()


# The 64-row kernel's tree mask: loaded per tile in a branch only the new-token programs take, not once before the
# loop as a [64, 64] mask live across every prefix program's loop. That freed registers in a kernel at 255 (T = 9:
# 255 regs and 2 spills before, 254 and none after) and was, A/B in one process (H200, 2026-12-03, exp_mask.py in
# docs/measurements/2026-12-03-h200/): 13.3% faster on 8 heads x a 9-node tree at 185k page 1 (154.5 -> 134.0 us),
# 14.3% at T = 12, 10.2% at T = 17, 7.0% at T = 8, 9.6% at 64k T = 9, 1.2-2.9% on 64 / 128-head and ragged 16-head
# rows; slower on one row, 16 heads x a 9-node tree at 185k (+2.7%: 178.1 -> 182.9 us); the batch-1 grid of
# 2026-12-02 re-run on this code (2026-12-03 10:03 UTC) within -3.7% .. +0.9% of it. False restores the old order
# (the A/B's other arm).
MASK_IN_BRANCH = True

# Batch-1 page-1 calls whose last 64-row m-block would hold at most 32 real rows (72 = 8 heads x a 9-node tree, 80,
# 96, 136, 144 rows) run their full m-blocks on the 64-row kernel and the rest on the narrow kernel beside it, each
# program streaming the same slice of the prefix, instead of one more 64-row m-block of mostly padding (see
# launch_mla_sm90 and remainder_beside: 1.4-3.3% on those rows, H200 2026-12-03). False: every row on the 64-row
# kernel (the A/B's other arm).
REMAINDER_BESIDE = True


def under_s(num_tokens: int) -> bool:
    """Whether the 64-row kernel issues the first tile's accumulator rescale and P exchange after S of the second
    tile (so they run while the tensor cores compute it) and the second tile's P exchange before waiting for P V of
    the first. Measured both ways in one process (H200, 2026-12-02): 0.7-1.7% faster on 8 of 9
    verify shapes (T >= 2: 64 / 128 heads T = 2, 128 heads T = 4 / 16, 16 / 64 heads T = 16, 32k and 128k; +0.3%
    on the ninth), 0.7-2.3% slower on every decode shape (T = 1: 64 and 128 heads); ptxas then also schedules
    the first softmax's exp2s among the S wgmmas. No cause found for the T = 1 loss, so the rule is the
    measurement's."""
    return num_tokens >= 2


def mla_sm90_supported(q: torch.Tensor, *, v_is_k: bool, dk: int, dv: int) -> bool:
    """This kernel's domain: MLA (576 = 512 + 64, one latent head), bf16 / fp16, on a CUDA sm_90 device."""
    return (v_is_k and dk == _DV + _DPE and dv == _DV and q.dtype in (torch.bfloat16, torch.float16)
            and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9)


def remainder_beside(num_tokens: int, num_q_heads: int, batch: int, page_size: int) -> int:
    """Rows run by the narrow kernel beside the 64-row kernel's full m-blocks, or 0: at batch 1 (no plan) and page
    size 1, when a call has more than 64 rows and its last m-block would hold at most NARROW_MAX_ROWS real rows
    (8 heads x a 9..12-node tree or T = 17, 16 heads x T = 5 / 9 / 13 / 17: that m-block is mostly padding, yet a
    second pass over the prefix). Measured (H200, 2026-12-03, exp_remainder.py in
    docs/measurements/2026-12-03-h200/): page 1 1.4-3.3% faster on all 15 such rows (64k-256k); page 64 -0.6% .. +3.7%
    (slower at 8 heads x 9), so not there; page 16 not measured, so not there."""
    rows = num_tokens * num_q_heads
    rest = rows % BLOCK_M
    return (rest if REMAINDER_BESIDE and batch == 1 and page_size == 1 and rows > BLOCK_M
            and 0 < rest <= NARROW_MAX_ROWS else 0)


def launch_mla_sm90(*, q, kv_buffer, k_new, tree_mask, indices, kv_indptr, prefix_lens, page_table_stride: int,
                    items, order, part_out, part_lse, num_items: int, sm_scale: float, page_size: int,
                    use_indptr: bool, single: bool = False, wait_plan: bool = False, pdl: bool = True):
    """One launch over (m-blocks, num_items + B): the plan's items (program p runs item order[p]), then each
    request's new tokens; single (batch 1, no plan): num_items = P equal slices of the prefix in slots 0..P-1, the
    new tokens in slot P. q [B, T, Hq, 576], kv_buffer [slots, 1, 576], k_new [B, T, 1, 576], tree_mask [B, T, T]
    uint8, indices: kv_indices (use_indptr) or the page table; part_out / part_lse: the workspace's partials.
    wait_plan: launched as the programmatic dependent of the plan kernel launched just before it (which then must
    have been launched with pdl=True), so its programs are scheduled while the plan runs and wait for it.
    A remainder (remainder_beside) is a second launch, of the narrow kernel over the rows past the full m-blocks,
    as the 64-row kernel's programmatic dependent: its programs take the SMs beside the 64-row kernel's at once
    (neither reads what the other writes) and wait for the 64-row kernel before they exit, so the merge after it
    (a programmatic dependent of the narrow kernel) sees both kernels' partials; without pdl (a caller whose merge
    is a normal launch) the narrow kernel runs after the 64-row kernel has drained.
    Returns the (first) compiled kernel."""
    batch, num_tokens, num_q_heads, _ = q.shape
    rows = num_tokens * num_q_heads
    rest = remainder_beside(num_tokens, num_q_heads, batch, page_size)
    args = (
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
    )
    common = dict(HQ=num_q_heads, T=num_tokens, PAGE_SIZE=page_size, USE_INDPTR=use_indptr, SINGLE=single,
                  BLOCK_N=BLOCK_N, DV=_DV, DPE=_DPE, CHUNK=_CHUNK, WAIT_PLAN=wait_plan, num_warps=8)
    after_plan = {"launch_pdl": True} if wait_plan else {}
    if rows <= NARROW_MAX_ROWS:  # S^T / O^T: the keys fill wgmma's 64-row side (one m-block: grid dim 0 is 1)
        return _mla_verify_sm90_narrow_kernel[(1, num_items + batch)](
            *args, BLOCK_R=16 if rows <= 16 else 32, ROW0=0, WAIT_END=False, **common, **after_plan)
    compiled = _mla_verify_sm90_kernel[(-(-(rows - rest) // BLOCK_M), num_items + batch)](  # the rest: whole m-blocks
        *args, BLOCK_M=BLOCK_M, UNDER_S=under_s(num_tokens), MASK_IN_BRANCH=MASK_IN_BRANCH, **common, **after_plan)
    if rest:
        _mla_verify_sm90_narrow_kernel[(1, num_items + batch)](
            *args, BLOCK_R=16 if rest <= 16 else 32, ROW0=rows - rest, WAIT_END=pdl, **common,
            **({"launch_pdl": True} if pdl else {}))
    return compiled
