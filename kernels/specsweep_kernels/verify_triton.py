"""The portable split-KV verify attention kernel (Triton).

One program owns BLOCK_M rows (draft token x query head of one KV group) and streams one range of the paged prefix,
or the request's T new tokens under the tree mask, with tl.dot; it writes a normalised fp32 partial and its
log2-sum-exp into a workspace slot. verify_attention.py has the API and the design, verify_plan.py the plan that
hands out the ranges, verify_merge.py the merge of the partials, verify_config.py the tiles and split counts.
It compiles for any GPU Triton targets (tl.dot lowers to mma.sync or wgmma; no TMA, no Gluon), which makes it the
path of sm_120 and other non-Hopper GPUs, of GQA and of fp32, and it runs on CPU tensors through Triton's
interpreter (TRITON_INTERPRET=1 set before import).
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["kernel_is_interpreted"]


@triton.jit
def _prefix_tile(
    start_n, hi, q, q_pe, m_i, l_i, acc, indices_ptr, k_head, v_head, stride_kbs, stride_vbs,
    offs_d, offs_dpe, offs_dv, qk_scale,
    BLOCK_N: tl.constexpr, BLOCK_DPE: tl.constexpr, PAGE_SIZE: tl.constexpr, V_IS_K: tl.constexpr,
    MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One BLOCK_N tile of the prefix: online-softmax update of (m_i, l_i, acc). MASKED: positions >= hi
    are out (the last, partial tile); otherwise no bounds work at all."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        mask_n = offs_n < hi
        if PAGE_SIZE == 1:
            slot = tl.load(indices_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
        else:
            page = tl.load(indices_ptr + offs_n // PAGE_SIZE, mask=mask_n, other=0)
            slot = page.to(tl.int64) * PAGE_SIZE + offs_n % PAGE_SIZE
        k_row = k_head + slot[:, None] * stride_kbs
        k = tl.load(k_row + offs_d[None, :], mask=mask_n[:, None], other=0.0)  # [N, D]
    else:
        if PAGE_SIZE == 1:
            slot = tl.load(indices_ptr + offs_n).to(tl.int64)
        else:
            slot = tl.load(indices_ptr + offs_n // PAGE_SIZE).to(tl.int64) * PAGE_SIZE + offs_n % PAGE_SIZE
        k_row = k_head + slot[:, None] * stride_kbs
        k = tl.load(k_row + offs_d[None, :])
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if BLOCK_DPE > 0:
        if MASKED:
            k_pe = tl.load(k_row + offs_dpe[None, :], mask=mask_n[:, None], other=0.0)
        else:
            k_pe = tl.load(k_row + offs_dpe[None, :])
        qk = tl.dot(q_pe, tl.trans(k_pe), qk, input_precision=DOT_PRECISION)
    if MASKED:
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
    if V_IS_K:
        v = k
    else:
        v_row = v_head + slot[:, None] * stride_vbs + offs_dv[None, :]
        if MASKED:
            v = tl.load(v_row, mask=mask_n[:, None], other=0.0)
        else:
            v = tl.load(v_row)
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # qk_scale > 0: max commutes with the scaling
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _load_q(q_ptr, b, offs_t, offs_h, mask_m, offs_d, offs_dpe, stride_qb, stride_qt, stride_qh,
            BLOCK_DPE: tl.constexpr):
    """Request b's query rows: q [M, D] and its rope part q_pe [M, DPE] (q again when there is none)."""
    q_row = q_ptr + b * stride_qb + offs_t[:, None] * stride_qt + offs_h[:, None] * stride_qh
    q = tl.load(q_row + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    if BLOCK_DPE > 0:
        q_pe = tl.load(q_row + offs_dpe[None, :], mask=mask_m[:, None], other=0.0)
    else:
        q_pe = q  # unused
    return q, q_pe


@triton.jit
def _prefix_range(lo, hi, q, q_pe, indices_ptr, k_head, v_head, stride_kbs, stride_vbs, offs_d, offs_dpe, offs_dv,
                  qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DPE: tl.constexpr,
                  BLOCK_DV: tl.constexpr, PAGE_SIZE: tl.constexpr, V_IS_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  WARP_SPECIALIZE: tl.constexpr):
    """(m_i, l_i, acc) over prefix positions [lo, hi), lo on a tile boundary: full tiles without masks, then the
    last partial tile masked, so the compute-bound shapes spend no ALU work on bounds."""
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: exp2(-inf - m_i) = 0, alpha = 1
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    hi_full = lo + (hi - lo) // BLOCK_N * BLOCK_N
    for start_n in tl.range(lo, hi_full, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        m_i, l_i, acc = _prefix_tile(
            start_n, hi, q, q_pe, m_i, l_i, acc, indices_ptr, k_head, v_head, stride_kbs, stride_vbs,
            offs_d, offs_dpe, offs_dv, qk_scale, BLOCK_N, BLOCK_DPE, PAGE_SIZE, V_IS_K, False, DOT_PRECISION)
    if hi_full < hi:
        m_i, l_i, acc = _prefix_tile(
            hi_full, hi, q, q_pe, m_i, l_i, acc, indices_ptr, k_head, v_head, stride_kbs, stride_vbs,
            offs_d, offs_dpe, offs_dv, qk_scale, BLOCK_N, BLOCK_DPE, PAGE_SIZE, V_IS_K, True, DOT_PRECISION)
    return m_i, l_i, acc


@triton.jit
def _new_tokens_tile(
    b, q, q_pe, k_new_ptr, v_new_ptr, tree_mask_ptr, kvh, offs_t, mask_m, offs_d, offs_dpe, offs_dv, qk_scale,
    stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh, stride_mb, stride_mt,
    T: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DPE: tl.constexpr, V_IS_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Request b's T new tokens: the T x T block under the tree mask, one tile. Returns (m_i, l_i, acc)."""
    offs_j = tl.arange(0, BLOCK_T)
    mask_j = offs_j < T
    k_row = k_new_ptr + b * stride_knb + offs_j[:, None] * stride_knt + kvh * stride_knh
    k = tl.load(k_row + offs_d[None, :], mask=mask_j[:, None], other=0.0)  # [BLOCK_T, D]
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if BLOCK_DPE > 0:
        k_pe = tl.load(k_row + offs_dpe[None, :], mask=mask_j[:, None], other=0.0)
        qk = tl.dot(q_pe, tl.trans(k_pe), qk, input_precision=DOT_PRECISION)
    visible = tl.load(tree_mask_ptr + b * stride_mb + offs_t[:, None] * stride_mt + offs_j[None, :],
                      mask=mask_m[:, None] & mask_j[None, :], other=0)
    qk = tl.where(visible != 0, qk * qk_scale, float("-inf"))
    if V_IS_K:
        v = k
    else:
        v = tl.load(v_new_ptr + b * stride_vnb + offs_j[:, None] * stride_vnt + kvh * stride_vnh
                    + offs_dv[None, :], mask=mask_j[:, None], other=0.0)
    m_i = tl.maximum(tl.max(qk, 1), -1.0e30)  # a row that sees nothing: p = 0, l = 0
    p = tl.exp2(qk - m_i[:, None])
    return m_i, tl.sum(p, 1), tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)


@triton.jit
def _store_part(part_out_ptr, part_lse_ptr, slot, m_i, l_i, acc, offs_t, offs_h, offs_dv, mask,
                stride_pos, stride_pot, stride_poh, stride_pls, stride_plt):
    """Workspace slot `slot`: the normalised partial output and its log2-sum-exp (-inf where nothing was seen)."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    part_row = offs_t[:, None] * stride_pot + offs_h[:, None] * stride_poh + offs_dv[None, :]
    tl.store(part_out_ptr + slot * stride_pos + part_row, acc / l_safe[:, None], mask=mask[:, None])
    tl.store(part_lse_ptr + slot * stride_pls + offs_t * stride_plt + offs_h,
             tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf")), mask=mask)


@triton.jit
def _verify_attention_kernel(
    q_ptr, k_buffer_ptr, v_buffer_ptr, k_new_ptr, v_new_ptr, tree_mask_ptr,
    kv_indices_ptr, kv_indptr_ptr, prefix_lens_ptr,
    items_ptr, order_ptr,  # the plan (_plan_kernel); unused at B = 1
    part_out_ptr, part_lse_ptr,
    qk_scale,  # sm_scale * log2(e)
    batch,
    num_splits,  # P: prefix programs (B = 1: slices; else the plan has P + B item slots)
    stride_qb, stride_qt, stride_qh,
    stride_kbs, stride_kbh,
    stride_vbs, stride_vbh,
    stride_knb, stride_knt, stride_knh,
    stride_vnb, stride_vnt, stride_vnh,
    stride_mb, stride_mt,
    stride_ptb,
    stride_pos, stride_pot, stride_poh,
    stride_pls, stride_plt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # Hq // Hkv
    T: tl.constexpr,
    BLOCK_T: tl.constexpr,  # pow2 >= max(T, 16)
    BLOCK_D: tl.constexpr,  # main key dims (= Dv for MLA)
    BLOCK_DPE: tl.constexpr,  # extra key dims (MLA rope), 0 if none
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    USE_INDPTR: tl.constexpr,  # kv_indptr/kv_indices (token slots) vs page_table/prefix_lens
    V_IS_K: tl.constexpr,  # MLA: V = first BLOCK_DV dims of the K row
    SINGLE_REQUEST: tl.constexpr,  # batch 1: P equal slices of the one prefix (module docstring)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32), "tf32" (unused) for fp16 / bf16
    WARP_SPECIALIZE: tl.constexpr,  # Triton's automatic warp specialisation of the prefix loop (tuning)
    PDL: tl.constexpr,  # the merge is a programmatic dependent launch: let it be scheduled now (_pdl_supported)
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_m = tl.program_id(0)
    kvh = tl.program_id(1)
    pid_z = tl.program_id(2)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row = t * GROUP + g
    mask_m = offs_m < T * GROUP
    offs_t = offs_m // GROUP
    offs_h = kvh * GROUP + offs_m % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if BLOCK_DPE > 0:
        offs_dpe = BLOCK_D + tl.arange(0, BLOCK_DPE)
    else:
        offs_dpe = offs_d  # unused
    k_head = k_buffer_ptr + kvh * stride_kbh
    v_head = v_buffer_ptr + kvh * stride_vbh
    if SINGLE_REQUEST:
        # Program s < num_splits streams the s-th slice of the one prefix; program num_splits (an empty slice)
        # does the new tokens. No branch around the tile loop: at B = 1 a loop around it cost 5-25% (H200, 2026-12-01).
        q, q_pe = _load_q(q_ptr, 0, offs_t, offs_h, mask_m, offs_d, offs_dpe, stride_qb, stride_qt, stride_qh,
                          BLOCK_DPE)
        if USE_INDPTR:
            idx_start = tl.load(kv_indptr_ptr)
            prefix_len = tl.load(kv_indptr_ptr + 1) - idx_start
        else:
            idx_start = 0
            prefix_len = tl.load(prefix_lens_ptr)
        per_split = tl.cdiv(tl.cdiv(prefix_len, num_splits), BLOCK_N) * BLOCK_N
        lo = tl.minimum(pid_z * per_split, prefix_len)
        hi = tl.where(pid_z < num_splits, tl.minimum(lo + per_split, prefix_len), lo)
        m_i, l_i, acc = _prefix_range(
            lo, hi, q, q_pe, kv_indices_ptr + idx_start, k_head, v_head, stride_kbs, stride_vbs, offs_d, offs_dpe,
            offs_dv, qk_scale, BLOCK_M, BLOCK_N, BLOCK_DPE, BLOCK_DV, PAGE_SIZE, V_IS_K, DOT_PRECISION, WARP_SPECIALIZE)
        if pid_z == num_splits:
            m_i, l_i, acc = _new_tokens_tile(
                0, q, q_pe, k_new_ptr, v_new_ptr, tree_mask_ptr, kvh, offs_t, mask_m, offs_d, offs_dpe, offs_dv,
                qk_scale, stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh, stride_mb, stride_mt,
                T, BLOCK_T, BLOCK_DPE, V_IS_K, DOT_PRECISION)
        zero_m = offs_m * 0  # block-shaped conditions: the interpreter rejects a scalar bool in a mask
        is_new = (zero_m + pid_z) == num_splits
        _store_part(part_out_ptr, part_lse_ptr, pid_z, m_i, l_i, acc, offs_t, offs_h, offs_dv,
                    mask_m & (((zero_m + lo) < hi) | is_new),  # the merge reads the slices with work
                    stride_pos, stride_pot, stride_poh, stride_pls, stride_plt)
    elif pid_z >= num_splits + batch:  # request b's new tokens, slot P + B + b
        b = pid_z - num_splits - batch
        q, q_pe = _load_q(q_ptr, b, offs_t, offs_h, mask_m, offs_d, offs_dpe, stride_qb, stride_qt, stride_qh,
                          BLOCK_DPE)
        m_i, l_i, acc = _new_tokens_tile(
            b, q, q_pe, k_new_ptr, v_new_ptr, tree_mask_ptr, kvh, offs_t, mask_m, offs_d, offs_dpe, offs_dv,
            qk_scale, stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh, stride_mb, stride_mt,
            T, BLOCK_T, BLOCK_DPE, V_IS_K, DOT_PRECISION)
        _store_part(part_out_ptr, part_lse_ptr, pid_z, m_i, l_i, acc, offs_t, offs_h, offs_dv, mask_m,
                    stride_pos, stride_pot, stride_poh, stride_pls, stride_plt)
    else:  # prefix program z runs the plan's item order[z]: one range [lo, hi) of request b, into slot order[z]
        item = tl.load(order_ptr + pid_z)
        b = tl.load(items_ptr + item * 4)
        lo = tl.load(items_ptr + item * 4 + 1)
        hi = tl.load(items_ptr + item * 4 + 2)
        if USE_INDPTR:
            indices = kv_indices_ptr + tl.load(kv_indptr_ptr + b)
        else:
            indices = kv_indices_ptr + b * stride_ptb
        q, q_pe = _load_q(q_ptr, b, offs_t, offs_h, mask_m, offs_d, offs_dpe, stride_qb, stride_qt, stride_qh,
                          BLOCK_DPE)
        m_i, l_i, acc = _prefix_range(
            lo, hi, q, q_pe, indices, k_head, v_head, stride_kbs, stride_vbs, offs_d, offs_dpe, offs_dv, qk_scale,
            BLOCK_M, BLOCK_N, BLOCK_DPE, BLOCK_DV, PAGE_SIZE, V_IS_K, DOT_PRECISION, WARP_SPECIALIZE)
        zero_m = offs_m * 0  # block-shaped conditions: the interpreter rejects a scalar bool in a mask
        _store_part(part_out_ptr, part_lse_ptr, item, m_i, l_i, acc, offs_t, offs_h, offs_dv,
                    mask_m & ((zero_m + lo) < hi), stride_pos, stride_pot, stride_poh, stride_pls, stride_plt)


def kernel_is_interpreted() -> bool:
    """True when Triton's CPU interpreter runs the kernels (TRITON_INTERPRET=1 before this module was imported)."""
    return not isinstance(_verify_attention_kernel, triton.runtime.JITFunction)
