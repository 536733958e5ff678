"""MLA prefix attention for sm_90 (Hopper) in Gluon: explicit wgmma, cp.async gathers, Dv split over two warpgroups.

One program owns BLOCK_M = 64 rows (draft token x query head) of one work item (request b, prefix positions
[lo, hi)) and streams the item's latent rows (576 = 512 + 64 rope dims) through a two-stage shared-memory ring:
  S = Q_nope K_nope^T + Q_pe K_pe^T       wgmma m64n32 per warpgroup (the two warpgroups split the 64 columns)
  online softmax in registers (log2 domain)
  O[:, 0:256] / O[:, 256:512] += P V      wgmma m64n256, one half of Dv per warpgroup (V = K_nope, same tile)
The load of tile j + 1 is in flight while tile j is computed, and P V of tile j runs while S of tile j + 1 is
issued. It writes the item's normalised fp32 partial and log2-sum-exp to workspace slot `item`, the format
verify_attention's merge reads. The portable Triton kernel (verify_attention.py) stays the path for sm_120 and
for GQA.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

__all__ = ["mla_prefix_sm90", "MLA_SM90_BLOCK_M", "MLA_SM90_BLOCK_N"]

MLA_SM90_BLOCK_M = 64
MLA_SM90_BLOCK_N = 64
_DV = 512
_DPE = 64
_CHUNK = 64  # columns per cp.async chunk (128 bytes of bf16: one swizzle row)


@gluon.jit
def _gather_rows(dst_nope, dst_pe, row_ptr, mask, cols, CHUNK: gl.constexpr, DV: gl.constexpr):
    """cp.async of [rows, DV + DPE] (row_ptr [rows, 1] pointers to each row's first element) into the two buffers,
    one CHUNK-column slice at a time (keeps the pointer tensors small). Masked rows are zero-filled."""
    for c in gl.static_range(DV // CHUNK):
        async_copy.async_copy_global_to_shared(dst_nope.slice(c * CHUNK, CHUNK, dim=1),
                                               row_ptr + gl.expand_dims(c * CHUNK + cols, 0), mask=mask)
    async_copy.async_copy_global_to_shared(dst_pe, row_ptr + gl.expand_dims(DV + cols, 0), mask=mask)


@gluon.jit
def _kv_row_ptrs(kv_ptr, idx_base, start, hi, stride_kvs, rows, PAGE_SIZE: gl.constexpr):
    """Row pointers [BLOCK_N, 1] and mask of prefix positions start .. start + BLOCK_N - 1 (< hi)."""
    pos = start + rows
    ok = pos < hi
    if PAGE_SIZE == 1:
        slot = gl.load(idx_base + pos, mask=ok, other=0).to(gl.int64)
    else:
        page = gl.load(idx_base + pos // PAGE_SIZE, mask=ok, other=0).to(gl.int64)
        slot = page * PAGE_SIZE + (pos % PAGE_SIZE)
    return gl.expand_dims(kv_ptr + slot * stride_kvs, 1), gl.expand_dims(ok, 1)


@gluon.jit
def _mla_prefix_sm90_kernel(
    q_ptr, kv_ptr, indices_ptr, indptr_ptr, items_ptr, part_out_ptr, part_lse_ptr,
    qk_scale,  # sm_scale * log2(e)
    stride_qb, stride_qt, stride_qh,
    stride_kvs,
    stride_ptb,  # page-table row stride (page-table mode)
    stride_pos, stride_pot, stride_poh,
    stride_pls, stride_plt,
    HQ: gl.constexpr,
    T: gl.constexpr,
    PAGE_SIZE: gl.constexpr,
    USE_INDPTR: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    DV: gl.constexpr,
    DPE: gl.constexpr,
    CHUNK: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 8, "two warpgroups: the Dv halves")
    gl.static_assert(DPE == CHUNK, "the rope part is one chunk")
    pid_m = gl.program_id(0)
    item = gl.program_id(1)
    b = gl.load(items_ptr + item * 4)
    lo = gl.load(items_ptr + item * 4 + 1)
    hi = gl.load(items_ptr + item * 4 + 2)
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
        kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        row_ptr, ok = _kv_row_ptrs(kv_ptr, idx_base, lo, hi, stride_kvs, kv_rows, PAGE_SIZE)
        _gather_rows(k_nope.index(0), k_pe.index(0), row_ptr, ok, cols, CHUNK, DV)
        async_copy.commit_group()

        m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = warpgroup_mma_init(gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for j in range(n_tiles):
            stage = j % 2
            start = lo + j * BLOCK_N
            async_copy.wait_group(0)  # tile j (and, at j = 0, Q) has landed for this thread's copies
            gl.thread_barrier()  # ... and for every thread's
            fence_async_shared()  # generic-proxy writes before wgmma's async-proxy reads
            kn = k_nope.index(stage)
            s_tok = warpgroup_mma(q_nope, kn.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index(stage).permute((1, 0)), s_tok, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc,))  # P V of tile j - 1 (issued before S) done
            gl.thread_barrier()  # both warpgroups are done with the other stage
            if j + 1 < n_tiles:
                row_ptr, ok = _kv_row_ptrs(kv_ptr, idx_base, start + BLOCK_N, hi, stride_kvs, kv_rows, PAGE_SIZE)
                _gather_rows(k_nope.index(1 - stage), k_pe.index(1 - stage), row_ptr, ok, cols, CHUNK, DV)
                async_copy.commit_group()
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            s = gl.where(gl.expand_dims(start + s_cols < hi, 0), s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
            acc = acc * gl.expand_dims(alpha_o, 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma(p_op, kn, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

        l_safe = gl.where(l_i > 0, l_i, 1.0)
        lse = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), 1)
        o_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
        o_ptr = (part_out_ptr + item * stride_pos + gl.expand_dims((o_rows // HQ) * stride_pot
                                                                   + (o_rows % HQ) * stride_poh, 1)
                 + gl.expand_dims(o_cols, 0))
        gl.store(o_ptr, out, mask=gl.expand_dims(o_rows < T * HQ, 1))
        s_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        gl.store(part_lse_ptr + item * stride_pls + (s_rows // HQ) * stride_plt + s_rows % HQ, lse,
                 mask=s_rows < T * HQ)


def mla_prefix_sm90(*, q, kv_buffer, indices, indptr, items, part_out, part_lse, sm_scale: float, page_size: int,
                    use_indptr: bool, page_table_stride: int, num_items: int):
    """Launch over (m-blocks, num_items): item i = items[i] = (b, lo, hi, _) writes workspace slot i.
    q [B, T, Hq, 576], kv_buffer [slots, 1, 576] (bf16 / fp16), indices: kv_indices (use_indptr) or the page table."""
    batch, num_tokens, num_q_heads, dk = q.shape
    assert dk == _DV + _DPE and kv_buffer.shape[-1] == dk
    m_blocks = triton.cdiv(num_tokens * num_q_heads, MLA_SM90_BLOCK_M)
    return _mla_prefix_sm90_kernel[(m_blocks, num_items)](
        q, kv_buffer, indices, indptr, items, part_out, part_lse,
        sm_scale * 1.4426950408889634,
        q.stride(0), q.stride(1), q.stride(2),
        kv_buffer.stride(0),
        page_table_stride,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        HQ=num_q_heads, T=num_tokens, PAGE_SIZE=page_size, USE_INDPTR=use_indptr,
        BLOCK_M=MLA_SM90_BLOCK_M, BLOCK_N=MLA_SM90_BLOCK_N, DV=_DV, DPE=_DPE, CHUNK=_CHUNK,
        num_warps=8,
    )
