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
    mbarrier,
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
        acc = gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout)
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
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))  # no wgmma in flight across iterations

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


@gluon.jit
def _ws_producer(bufs, bars, scal, HQ: gl.constexpr, T: gl.constexpr, PAGE_SIZE: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr, CHUNK: gl.constexpr):
    """Producer warps: Q once, then the item's tiles into the two-stage ring (cp.async gathers)."""
    q_nope, q_pe, k_nope, k_pe, p_buf, m_buf, l_buf = bufs
    ready, empty, p_ready, q_ready, l_done = bars
    q_ptr, kv_ptr, idx_base, pid_m, b, lo, hi, stride_qb, stride_qt, stride_qh, stride_kvs = scal
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                               warps_per_cta=[4, 1], order=[1, 0])
    cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld_layout))
    q_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
    q_ok = gl.expand_dims(q_rows < T * HQ, 1)
    q_row_ptr = gl.expand_dims(q_ptr + b * stride_qb + (q_rows // HQ) * stride_qt + (q_rows % HQ) * stride_qh, 1)
    _gather_rows(q_nope, q_pe, q_row_ptr, q_ok, cols, CHUNK, DV)
    async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()
    fence_async_shared()
    mbarrier.arrive(q_ready)
    kv_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    for t in range(n_tiles):
        stage = t % 2
        mbarrier.wait(empty.index(stage), ((t // 2) & 1) ^ 1)  # consumed by both warpgroups (free at first)
        row_ptr, ok = _kv_row_ptrs(kv_ptr, idx_base, lo + t * BLOCK_N, hi, stride_kvs, kv_rows, PAGE_SIZE)
        _gather_rows(k_nope.index(stage), k_pe.index(stage), row_ptr, ok, cols, CHUNK, DV)
        async_copy.commit_group()
        async_copy.wait_group(0)
        gl.thread_barrier()
        fence_async_shared()
        mbarrier.arrive(ready.index(stage))


@gluon.jit
def _ws_softmax(s, m_prev, l_i, start, hi, qk_scale, s_cols):
    s = gl.where(gl.expand_dims(start + s_cols < hi, 0), s, float("-inf"))
    m_new = gl.maximum(m_prev, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_prev - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    return p, m_new, alpha, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _ws_consumer(bufs, bars, scal, W: gl.constexpr, HQ: gl.constexpr, T: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr):
    """Consumer warpgroup W: owns tiles W, W + 2, ... (S = Q K^T, softmax, publishes P and the row max) and the
    W-th half of O, to which it adds P V for every tile (its own P from registers, the other's from shared memory)."""
    q_nope, q_pe, k_nope, k_pe, p_buf, m_buf, l_buf = bufs
    ready, empty, p_ready, q_ready, l_done = bars
    part_out_ptr, part_lse_ptr, item, pid_m, lo, hi, qk_scale, stride_pos, stride_pot, stride_poh, stride_pls, \
        stride_plt = scal
    HALF: gl.constexpr = DV // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_nope.dtype

    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    s_cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_prev = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
    mbarrier.wait(q_ready, 0)
    if W == 0:  # tile 0 has no predecessor
        if n_tiles > 0:
            mbarrier.wait(ready.index(0), 0)
            s_tok = warpgroup_mma(q_nope, k_nope.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index(0).permute((1, 0)), s_tok, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p, m_prev, alpha, l_i = _ws_softmax(s, m_prev, l_i, lo, hi, qk_scale, s_cols)
            p_lo = p.to(dtype)
            p_buf.store(p_lo)
            m_buf.store(m_prev)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(p_ready)
            acc = warpgroup_mma(gl.convert_layout(p_lo, p_layout), k_nope.index(0).slice(W * HALF, HALF, dim=1), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()
            mbarrier.arrive(empty.index(0))
        first = 2
    else:
        first = 1
    for u in range(first, n_tiles, 2):  # the other's tile u - 1, then my tile u
        su = u % 2
        t = u - 1
        st = t % 2
        mbarrier.wait(p_ready, t & 1)
        mbarrier.wait(ready.index(st), (t // 2) & 1)
        m_t = m_buf.load(row_layout)
        alpha = gl.exp2(m_prev - m_t)
        m_prev = m_t
        l_i = l_i * alpha
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
        acc = warpgroup_mma(p_buf, k_nope.index(st).slice(W * HALF, HALF, dim=1), acc, is_async=True)
        mbarrier.wait(ready.index(su), (u // 2) & 1)
        s_tok = warpgroup_mma(q_nope, k_nope.index(su).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_tok = warpgroup_mma(q_pe, k_pe.index(su).permute((1, 0)), s_tok, is_async=True)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc))  # also P V of tile t (issued first)
        gl.thread_barrier()
        mbarrier.arrive(empty.index(st))
        p, m_prev, alpha, l_i = _ws_softmax(s, m_prev, l_i, lo + u * BLOCK_N, hi, qk_scale, s_cols)
        p_lo = p.to(dtype)
        p_buf.store(p_lo)
        m_buf.store(m_prev)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p_ready)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
        acc = warpgroup_mma(gl.convert_layout(p_lo, p_layout), k_nope.index(su).slice(W * HALF, HALF, dim=1), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))  # nothing in flight across iterations (ptxas
        gl.thread_barrier()  # would serialise every wgmma otherwise), and my tile's stage is free at once
        mbarrier.arrive(empty.index(su))
    last = n_tiles - 1
    if (last >= 0) & (last % 2 != W):  # the other's last tile
        st = last % 2
        mbarrier.wait(p_ready, last & 1)
        mbarrier.wait(ready.index(st), (last // 2) & 1)
        m_t = m_buf.load(row_layout)
        alpha = gl.exp2(m_prev - m_t)
        m_prev = m_t
        l_i = l_i * alpha
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
        acc = warpgroup_mma(p_buf, k_nope.index(st).slice(W * HALF, HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    # the row sums: each warpgroup summed its own tiles' P (same running max); add the other's
    l_buf.slice(W * BLOCK_M, BLOCK_M).store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(l_done)
    mbarrier.wait(l_done, 0)
    l_tot = l_i + l_buf.slice((1 - W) * BLOCK_M, BLOCK_M).load(row_layout)
    if n_tiles > 0:
        l_safe = gl.where(l_tot > 0, l_tot, 1.0)
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, orow_layout), 1)
        o_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=orow_layout)
        o_cols = W * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
        o_ptr = (part_out_ptr + item * stride_pos
                 + gl.expand_dims((o_rows // HQ) * stride_pot + (o_rows % HQ) * stride_poh, 1)
                 + gl.expand_dims(o_cols, 0))
        gl.store(o_ptr, out, mask=gl.expand_dims(o_rows < T * HQ, 1))
        if W == 0:
            lse = gl.where(l_tot > 0, m_prev + gl.log2(l_safe), float("-inf"))
            s_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
            gl.store(part_lse_ptr + item * stride_pls + (s_rows // HQ) * stride_plt + s_rows % HQ, lse,
                     mask=s_rows < T * HQ)


@gluon.jit
def _ws_consumer1(bufs, bars, scal, HQ: gl.constexpr, T: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, DV: gl.constexpr):
    _ws_consumer(bufs, bars, scal, 1, HQ, T, BLOCK_M, BLOCK_N, DV)


@gluon.jit
def _mla_prefix_sm90_ws_kernel(
    q_ptr, kv_ptr, indices_ptr, indptr_ptr, items_ptr, part_out_ptr, part_lse_ptr,
    qk_scale,
    stride_qb, stride_qt, stride_qh,
    stride_kvs,
    stride_ptb,
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
    CONSUMER_REGS: gl.constexpr,  # per thread of consumer warpgroup 1 (the default partition gets what is left)
    PRODUCER_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Warp-specialised: consumer warpgroup 0 (the default partition), consumer warpgroup 1 and a producer
    warpgroup; the consumers alternate tiles for S and the softmax and split O's columns (module docstring)."""
    gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
    gl.static_assert(DPE == CHUNK, "the rope part is one chunk")
    pid_m = gl.program_id(0)
    item = gl.program_id(1)
    b = gl.load(items_ptr + item * 4)
    lo = gl.load(items_ptr + item * 4 + 1)
    hi = gl.maximum(gl.load(items_ptr + item * 4 + 2), lo)
    if USE_INDPTR:
        idx_base = indices_ptr + gl.load(indptr_ptr + b)
    else:
        idx_base = indices_ptr + b * stride_ptb
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_nope = gl.allocate_shared_memory(dtype, [BLOCK_M, DV], smem_layout)
    q_pe = gl.allocate_shared_memory(dtype, [BLOCK_M, DPE], smem_layout)
    k_nope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DV], smem_layout)
    k_pe = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DPE], smem_layout)
    p_buf = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], smem_layout)
    m_buf = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec_layout)
    l_buf = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_M], vec_layout)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(q_ready, count=1)
    mbarrier.init(l_done, count=2)
    bufs = (q_nope, q_pe, k_nope, k_pe, p_buf, m_buf, l_buf)
    bars = (ready, empty, p_ready, q_ready, l_done)
    cons = (part_out_ptr, part_lse_ptr, item, pid_m, lo, hi, qk_scale, stride_pos, stride_pot, stride_poh,
            stride_pls, stride_plt)
    prod = (q_ptr, kv_ptr, idx_base, pid_m, b, lo, hi, stride_qb, stride_qt, stride_qh, stride_kvs)
    gl.warp_specialize([
        (_ws_consumer, (bufs, bars, cons, 0, HQ, T, BLOCK_M, BLOCK_N, DV)),
        (_ws_consumer1, (bufs, bars, cons, HQ, T, BLOCK_M, BLOCK_N, DV)),
        (_ws_producer, (bufs, bars, prod, HQ, T, PAGE_SIZE, BLOCK_M, BLOCK_N, DV, CHUNK)),
    ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


def mla_prefix_sm90(*, q, kv_buffer, indices, indptr, items, part_out, part_lse, sm_scale: float, page_size: int,
                    use_indptr: bool, page_table_stride: int, num_items: int, variant: str = "ws",
                    consumer_regs: int = 240, producer_regs: int = 24):
    """Launch over (m-blocks, num_items): item i = items[i] = (b, lo, hi, _) writes workspace slot i.
    q [B, T, Hq, 576], kv_buffer [slots, 1, 576] (bf16 / fp16), indices: kv_indices (use_indptr) or the page table.
    variant: "ws" (warp-specialised: two consumer warpgroups and a producer) or "coop" (8 warps in lockstep)."""
    batch, num_tokens, num_q_heads, dk = q.shape
    assert dk == _DV + _DPE and kv_buffer.shape[-1] == dk
    m_blocks = triton.cdiv(num_tokens * num_q_heads, MLA_SM90_BLOCK_M)
    args = (q, kv_buffer, indices, indptr, items, part_out, part_lse,
            sm_scale * 1.4426950408889634,
            q.stride(0), q.stride(1), q.stride(2),
            kv_buffer.stride(0),
            page_table_stride,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1))
    common = dict(HQ=num_q_heads, T=num_tokens, PAGE_SIZE=page_size, USE_INDPTR=use_indptr,
                  BLOCK_M=MLA_SM90_BLOCK_M, BLOCK_N=MLA_SM90_BLOCK_N, DV=_DV, DPE=_DPE, CHUNK=_CHUNK)
    if variant == "ws":
        # 12 warps: registers are given out per warpgroup (168 x 3 = 240 + 240 + 24 per thread)
        return _mla_prefix_sm90_ws_kernel[(m_blocks, num_items)](
            *args, **common, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs, num_warps=4, maxnreg=168)
    return _mla_prefix_sm90_kernel[(m_blocks, num_items)](*args, **common, num_warps=8)
