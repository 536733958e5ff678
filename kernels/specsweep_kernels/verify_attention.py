"""Split-KV tree-verify attention over a paged KV cache (Triton).

For each request b, T query tokens (one decode token, or a draft tree being verified) attend to
  (a) the cached prefix of L_b tokens, read through a paged pool, every query sees all of it, and
  (b) the T new tokens themselves, under a tree (ancestor) mask over the T x T block.

API (keyword-only; shapes are checked):

    verify_attention(
        q=...,            # [B, T, Hq, Dk]            fp16 / bf16 / fp32, last dim contiguous
        k_buffer=...,     # [slots, Hkv, Dk]          the flat per-layer pool (a page is page_size rows)
        v_buffer=...,     # [slots, Hkv, Dv] or None  None = MLA: V is k_buffer[..., :Dv] (one latent head)
        k_new=...,        # [B, T, Hkv, Dk]           keys of the T new tokens
        v_new=...,        # [B, T, Hkv, Dv] or None   None = MLA: V is k_new[..., :Dv]
        tree_mask=...,    # [B, T, T] bool            [b, i, j]: query i sees new token j (diagonal included)
        sm_scale=...,     # float
        out=...,          # [B, T, Hq, Dv]            written
        workspace=...,    # VerifyWorkspace from allocate_workspace(), reused across calls / graph replays
        # prefix addressing, one of:
        kv_indptr=..., kv_indices=...,                     # SGLang: [B+1] int32 cumsum, per-token slot ids int32
        page_table=..., prefix_lens=..., page_size=...,    # FlashInfer / reference engine: [B, max_pages] int32
                                                           # page ids, [B] int32 lengths, rows per page
        config=None, num_splits=None,                      # overrides of the tile / split heuristics (tuning)
        plan=None,                                         # this step's plan_verify(), reused by every layer
        impl="auto",                                       # "auto" | "triton" | "gluon" (the MLA kernel for sm_90)
    ) -> out

Plan once per step, reuse for every layer (graph-safe; without plan= each call plans for itself; at batch 1
step_needs_plan() is False: both kernels cut equal slices themselves and a plan is only checked):

    config, num_splits = verify_launch_params(**same_arguments_as_verify_attention)   # once (compiles)
    plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=num_splits,
                       prefix_lens=prefix_lens)            # or kv_indptr=kv_indptr; per step, on the device
    verify_attention(..., workspace=ws, plan=plan)         # per layer; a plan of other block_n / num_splits /
                                                           # batch / workspace is refused (ValueError)

The plan lives in the workspace (VerifyPlan views): items [P + B, 4] int32, item i = (b, lo, hi, 0), request b's
prefix positions [lo, hi) (lo a multiple of block_n, lo = hi: empty), in request order, its partial in workspace
slot i; req [B, 2] int32 = request b's (first item, number of non-empty items); order [P + B] int32 = the item
prefix program p runs. Request b's new-token partial is slot P + B + b. A new plan (or a call without plan=)
overwrites the workspace's previous one.

Call it once outside a CUDA graph before capturing it (that compiles the kernels and measures their occupancy);
replays may then change prefix lengths, page tables and inputs in place. On CPU tensors it runs through Triton's
interpreter when TRITON_INTERPRET=1 was set before import, else it falls back to `specsweep_kernels.reference`.

Slot s of the pool is row s of k_buffer; page p holds slots p * page_size .. p * page_size + page_size - 1.
GQA needs Hq % Hkv == 0 and Dk = Dv in {16, ..., 256} (powers of two). MLA needs Hkv = 1 and
Dk = Dv + Dpe with Dv and Dpe powers of two (DeepSeek: 576 = 512 + 64).

Design. One program owns BLOCK_M rows of the (draft token t, query head g of the KV group) matrix of one KV
head, so every KV tile it loads is used by all Hq/Hkv heads x T tokens at once (tl.dot; for MLA 16 heads x T
rows). B > 1: a plan (plan_verify: one small device kernel, no host sync) cuts each request's prefix tiles into
items of at most chunk = ceil(batch's tiles / P) tiles, never crossing a request, so there
are at most P + B items; grid = (m-blocks, Hkv, P + 2B): prefix program p runs item order[p] (full items first,
then the requests' partial items largest first, so the hardware's in-order dispatch balances them), one
_prefix_range each, no loop; the last B programs do each request's T new tokens under the tree mask. The plan is
recomputed on the device from the prefix lengths, so CUDA-graph replays may change them; an engine plans once
per step and passes plan= to every layer.
B = 1: the loop-free SINGLE_REQUEST branch (P equal slices of the one prefix, program P the new tokens; a plan
passed at B = 1 is checked, not read). Each part writes an fp32 partial output and its log2-sum-exp into the
workspace slot of its item; a merge kernel combines a request's slots (req[b] of the plan) with its new-token slot.
MLA in bf16 / fp16 on sm_90 runs Gluon kernels instead (verify_mla_sm90.py: wgmma, cp.async, Dv over two
warpgroups; calls of <= 32 rows with the products swapped) over the same plan at every batch size, the same slots
and the same merge; impl= picks the kernel.
The grid depends only on static shapes (B, T, heads, P). Block sizes come from the device's per-block
shared-memory limit (sm_90 ~227 KB, sm_120 ~100 KB), with a fall-back to the next smaller tile if the compiler
still runs out of resources; P fills one wave of the SMs, counted from the compiled kernel's shared memory,
registers and warps. docs/kernels.md has the measurements behind the choices.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

__all__ = ["verify_kernel", "VerifyConfig", "VerifyPlan", "VerifyWorkspace", "allocate_workspace", "candidate_configs",
           "kernel_is_interpreted", "pick_config", "plan_verify", "verify_attention", "verify_launch_params"]

_LOG2E = 1.4426950408889634
_IMPLS = ("auto", "triton", "gluon")  # verify_attention(impl=...)


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
def _prefix_lens_vec(kv_indptr_ptr, prefix_lens_ptr, offs_b, mask_b, USE_INDPTR: tl.constexpr):
    if USE_INDPTR:
        lens = (tl.load(kv_indptr_ptr + offs_b + 1, mask=mask_b, other=0)
                - tl.load(kv_indptr_ptr + offs_b, mask=mask_b, other=0))
    else:
        lens = tl.load(prefix_lens_ptr + offs_b, mask=mask_b, other=0)
    return lens


@triton.jit
def _plan_kernel(
    kv_indptr_ptr, prefix_lens_ptr, items_ptr, req_ptr, order_ptr,
    batch,
    num_splits,  # P: prefix programs of one wave per (m-block, KV head)
    BLOCK_B: tl.constexpr,  # pow2 >= batch
    BLOCK_K: tl.constexpr,  # items written per request and step
    BLOCK_I: tl.constexpr,  # empty items written per step
    BLOCK_N: tl.constexpr,
    USE_INDPTR: tl.constexpr,
):
    """The plan (one program): cut every request's prefix tiles into items of at most `chunk` tiles,
    chunk = ceil(tiles / P), so there are at most P + B items and no item
    crosses a request. items[i] = (b, lo, hi, 0) in request order (slot i); req[b] = (first item, items);
    order[p] = the item program p runs: full items first, then the requests' last partial items by size,
    largest first, then the empty items (lo = hi = 0, b = 0) up to P + B."""
    offs_b = tl.arange(0, BLOCK_B)
    mask_b = offs_b < batch
    lens = _prefix_lens_vec(kv_indptr_ptr, prefix_lens_ptr, offs_b, mask_b, USE_INDPTR)
    tiles = (lens + BLOCK_N - 1) // BLOCK_N
    chunk = tl.maximum((tl.sum(tiles, 0) + num_splits - 1) // num_splits, 1)
    n_items = (tiles + chunk - 1) // chunk
    first = tl.cumsum(n_items, 0) - n_items
    count = tl.sum(n_items, 0)
    n_full = tiles // chunk
    part = tiles - n_full * chunk  # tiles of the last, partial item (0: none)
    full_first = tl.cumsum(n_full, 0) - n_full
    total_full = tl.sum(n_full, 0)
    ahead = (part[None, :] > part[:, None]) | ((part[None, :] == part[:, None]) & (offs_b[None, :] < offs_b[:, None]))
    rank = tl.sum((ahead & (part[None, :] > 0)).to(tl.int32), 1)  # partial items larger (or equal and earlier)
    tl.store(req_ptr + offs_b * 2, first, mask=mask_b)
    tl.store(req_ptr + offs_b * 2 + 1, n_items, mask=mask_b)
    max_items = num_splits + batch
    for k0 in range(0, tl.max(n_items, 0), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = mask_b[:, None] & (offs_k[None, :] < n_items[:, None])
        item = first[:, None] + offs_k[None, :]
        lo = offs_k[None, :] * (chunk * BLOCK_N)
        hi = tl.minimum(lo + chunk * BLOCK_N, lens[:, None])
        row = items_ptr + item * 4
        tl.store(row, offs_b[:, None] + offs_k[None, :] * 0, mask=mask)
        tl.store(row + 1, lo + offs_b[:, None] * 0, mask=mask)
        tl.store(row + 2, hi, mask=mask)
        tl.store(row + 3, item * 0, mask=mask)
        program = tl.where(offs_k[None, :] < n_full[:, None], full_first[:, None] + offs_k[None, :],
                           total_full + rank[:, None])
        tl.store(order_ptr + program, item, mask=mask)
    for i0 in range(count, max_items, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        mask_i = offs_i < max_items
        for col in tl.static_range(4):
            tl.store(items_ptr + offs_i * 4 + col, offs_i * 0, mask=mask_i)
        tl.store(order_ptr + offs_i, offs_i, mask=mask_i)


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
        # does the new tokens. No branch around the tile loop: at B = 1 a loop around it cost 5-25% (notes).
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


@dataclass(frozen=True)
class VerifyConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    warp_specialize: bool = False


@dataclass(frozen=True)
class VerifyWorkspace:
    """fp32 partials, one slot per plan item (P + B at most) plus one per request's new tokens, and the int32 plan
    (see plan_verify). Allocate once for the largest shapes; its sizes do not depend on the prefix lengths."""

    part_out: Tensor  # [max_splits + 2 * max_batch, T_max, Hq, Dv] fp32
    part_lse: Tensor  # [max_splits + 2 * max_batch, T_max, Hq] fp32 (log2 domain)
    max_batch: int
    items: Tensor  # [max_splits + max_batch, 4] int32: item i = (b, lo, hi, 0), its partial in slot i
    req: Tensor  # [max_batch, 2] int32: request b's (first item, number of non-empty items)
    order: Tensor  # [max_splits + max_batch] int32: program p of the prefix programs runs item order[p]

    @property
    def max_splits(self) -> int:
        return self.part_lse.shape[0] - 2 * self.max_batch


@dataclass(frozen=True)
class VerifyPlan:
    """One step's split of the batch's prefix work, written on the device by plan_verify into the workspace's
    items / req / order (views below), for `batch` requests, tiles of `block_n` tokens and `num_splits` prefix
    programs per (m-block, KV head). Valid for every verify_attention call of that step with the same block_n,
    num_splits and batch on that workspace, until the next plan on the workspace (a call without plan= plans
    into it too)."""

    items: Tensor  # [num_splits + batch, 4] int32: (b, lo, hi, 0); request order; lo = hi: empty
    req: Tensor  # [batch, 2] int32: (first item, non-empty items) of request b
    order: Tensor  # [num_splits + batch] int32: prefix program p runs item order[p] (largest first)
    batch: int
    block_n: int
    num_splits: int

    @property
    def num_items(self) -> int:
        return self.num_splits + self.batch


@functools.lru_cache(maxsize=None)
def _device_limits(device_index: int) -> tuple[int, int]:
    """(shared memory bytes per block, multiprocessor count); CPU / interpreter: a small device."""
    if not torch.cuda.is_available():
        return 101376, 8
    props = torch.cuda.get_device_properties(device_index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 101376
    return int(smem), int(props.multi_processor_count)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)


def _smem_bytes(cfg: VerifyConfig, dk: int, dv: int, v_is_k: bool, elt: int) -> int:
    """Rough shared memory of one program: (stages - 1) KV tiles in flight plus the Q tile."""
    kv_row = dk + (0 if v_is_k else dv)
    return elt * (max(1, cfg.num_stages - 1) * cfg.block_n * kv_row + cfg.block_m * dk)


def candidate_configs(*, rows: int, dk: int, dv: int, v_is_k: bool, elt: int, smem_limit: int) -> list[VerifyConfig]:
    """Tiles in order of preference that fit the per-block shared-memory limit. rows = T * Hq / Hkv."""
    # First choices: the fastest of those timed on an H200 (docs/kernels.md); the rest are smaller fallbacks.
    if dv >= 512:  # MLA: the [M, 512] fp32 accumulator bounds M at 64 (8 warps)
        block_m = min(64, max(16, triton.next_power_of_2(rows)))
        first = [VerifyConfig(16, 128, 4, 2), VerifyConfig(16, 64, 4, 2)] if block_m == 16 else []
        # (block_m, 64, 8, 3): 2% faster than 2 stages at 128 heads, 32k, T = 4 and 16 (same 216 KB; notes, item 14)
        candidates = first + [VerifyConfig(block_m, 64, 8, 3), VerifyConfig(block_m, 64, 8, 2),
                              VerifyConfig(block_m, 32, 8, 3),
                              VerifyConfig(block_m, 32, 8, 2), VerifyConfig(min(block_m, 32), 32, 4, 2),
                              VerifyConfig(16, 32, 4, 2), VerifyConfig(16, 16, 4, 1)]
    else:
        block_m = min(128 if dv <= 128 else 64, max(16, triton.next_power_of_2(rows)))
        if rows <= 32:
            first = [VerifyConfig(block_m, 128, 4, 3)]
        else:  # T = 32 and (since the unmasked main loop) T = 64: 364 vs 403 µs for (128, 128, 8, 3) at 128k
            first = [VerifyConfig(block_m, 64, 4, 4)]
        candidates = first + [VerifyConfig(block_m, 64, 8, 3), VerifyConfig(block_m, 64, 4, 3),
                              VerifyConfig(min(block_m, 64), 32, 4, 2), VerifyConfig(16, 16, 4, 1)]
    fitting = [cfg for cfg in candidates if _smem_bytes(cfg, dk, dv, v_is_k, elt) <= smem_limit]
    return fitting or candidates[-1:]


_last_compiled = None  # the last launched compiled attention kernel (benchmark diagnostics)
_TOO_LARGE: set[tuple] = set()  # (config, shape key) the compiler rejected for lack of resources


def pick_config(*, rows: int, dk: int, dv: int, v_is_k: bool, elt: int, smem_limit: int) -> VerifyConfig:
    """The preferred tile that fits and that the compiler has not rejected."""
    key = (rows, dk, dv, v_is_k, elt, smem_limit)
    configs = candidate_configs(rows=rows, dk=dk, dv=dv, v_is_k=v_is_k, elt=elt, smem_limit=smem_limit)
    return next((cfg for cfg in configs if (cfg, key) not in _TOO_LARGE), configs[-1])


def _num_splits(*, num_kv_heads: int, m_blocks: int, slots: int, max_splits: int) -> int:
    """Prefix programs per (m-block, KV head): one full wave, slots = SMs x programs resident per SM. The batch's
    prefix work is shared among them by the plan (_plan_kernel), whatever the mix of lengths. More programs only add
    workspace traffic, and a partial second wave costs a whole one (both measured on an H200)."""
    return max(1, min(max_splits, slots // (num_kv_heads * m_blocks)))


def _gluon_num_splits(*, m_blocks: int, batch: int, slots: int, max_splits: int) -> int:
    """Prefix programs per m-block of the Gluon MLA kernels (one program per SM): one wave, as _num_splits, except
    that at batch 1 with <= 2 m-blocks one prefix program fewer lets the new-token program(s) run in the first wave
    (0.1-1.0 us a call, run 33; with more m-blocks the lost prefix share costs more than the wave: 128 heads T = 16,
    P 4 -> 3, 335 -> 442 us; docs/kernels.md, runs 33-37)."""
    num_splits = _num_splits(num_kv_heads=1, m_blocks=m_blocks, slots=slots, max_splits=max_splits)
    if not step_needs_plan(batch) and m_blocks <= 2 and m_blocks * (num_splits + 1) > slots and num_splits > 1:
        num_splits -= 1
    return num_splits


def allocate_workspace(
    *, max_batch: int, max_tokens: int, num_q_heads: int, v_head_dim: int, device: torch.device | str,
    max_splits: int | None = None,
) -> VerifyWorkspace:
    """Workspace for any call with B <= max_batch and T <= max_tokens (allocate once, before graph capture).
    max_splits bounds the prefix programs per (m-block, KV head) of one call (default 4 x SMs)."""
    device = torch.device(device)
    if max_splits is None:
        max_splits = 4 * _device_limits(_device_index(device))[1]
    shape = (max_splits + 2 * max_batch, max_tokens, num_q_heads)
    max_items = max_splits + max_batch
    return VerifyWorkspace(
        part_out=torch.empty(*shape, v_head_dim, device=device, dtype=torch.float32),
        part_lse=torch.empty(*shape, device=device, dtype=torch.float32),
        max_batch=max_batch,
        items=torch.zeros(max_items, 4, device=device, dtype=torch.int32),
        req=torch.zeros(max_batch, 2, device=device, dtype=torch.int32),
        order=torch.zeros(max_items, device=device, dtype=torch.int32),
    )


def step_needs_plan(batch: int) -> bool:
    """Whether a step of `batch` requests runs from a plan (plan_verify). Batch 1 does not: both kernels cut its
    prefix into P equal tile-aligned slices in the kernel (a plan measured 1-14% slower there, docs/kernels.md
    item 16), so an engine plans nothing for it."""
    return batch > 1


def _launch_plan(workspace: VerifyWorkspace, lens_or_indptr: Tensor, use_indptr: bool, batch: int, block_n: int,
                 num_splits: int) -> VerifyPlan:
    num_items = num_splits + batch
    plan = VerifyPlan(items=workspace.items[:num_items], req=workspace.req[:batch], order=workspace.order[:num_items],
                      batch=batch, block_n=block_n, num_splits=num_splits)
    _plan_kernel[(1,)](
        lens_or_indptr, lens_or_indptr, plan.items, plan.req, plan.order, batch, num_splits,
        BLOCK_B=max(2, triton.next_power_of_2(batch)), BLOCK_K=32, BLOCK_I=128, BLOCK_N=block_n,
        USE_INDPTR=use_indptr, num_warps=4,
    )
    return plan


def plan_verify(
    *, workspace: VerifyWorkspace, block_n: int, num_splits: int, prefix_lens: Tensor | None = None,
    kv_indptr: Tensor | None = None,
) -> VerifyPlan:
    """Plan one step's prefix work on the device (one small kernel, no host sync: CUDA-graph safe) from the
    prefix lengths ([B] int32) or the SGLang indptr ([B+1] int32). block_n and num_splits are the attention
    launch's: verify_launch_params() gives them. An engine plans once per step and passes plan= to every layer's
    verify_attention; without plan= verify_attention plans itself (one more launch per call)."""
    if (prefix_lens is None) == (kv_indptr is None):
        raise ValueError(f"prefix_lens={None if prefix_lens is None else _shape(prefix_lens)}, kv_indptr="
                         f"{None if kv_indptr is None else _shape(kv_indptr)}; allowed: exactly one of them")
    lens = prefix_lens if kv_indptr is None else kv_indptr
    name = "prefix_lens" if kv_indptr is None else "kv_indptr"
    if lens.dtype != torch.int32:
        raise TypeError(f"{name}: dtype {lens.dtype}; allowed: torch.int32")
    if lens.dim() != 1 or lens.device != workspace.part_out.device:
        raise ValueError(f"{name}: shape {_shape(lens)} on {lens.device}; allowed: [B] (prefix_lens) or [B+1] "
                         f"(kv_indptr) on the workspace's device {workspace.part_out.device}")
    batch = lens.shape[0] - (kv_indptr is not None)
    if not 1 <= batch <= workspace.max_batch:
        raise ValueError(f"{name}: batch {batch}; allowed: 1..{workspace.max_batch} (the workspace's max_batch)")
    if not 1 <= num_splits <= workspace.max_splits:
        raise ValueError(f"num_splits={num_splits}; allowed: 1..{workspace.max_splits} (the workspace's max_splits)")
    if not _is_pow2(block_n):
        raise ValueError(f"block_n={block_n}; allowed: a power of two (the attention tile's BLOCK_N)")
    return _launch_plan(workspace, lens, kv_indptr is not None, batch, block_n, num_splits)


def _verify_attention_launch(
    q: Tensor, k_buffer: Tensor, v_buffer: Tensor, k_new: Tensor, v_new: Tensor, tree_mask: Tensor,
    kv_indices: Tensor, kv_indptr: Tensor, prefix_lens: Tensor, page_table_stride: int,
    out: Tensor, workspace: VerifyWorkspace, sm_scale: float, page_size: int, use_indptr: bool, v_is_k: bool,
    config: VerifyConfig | None, num_splits: int | None, plan: VerifyPlan | None, launch: bool = True,
    impl: str = "auto",
) -> tuple[VerifyConfig, int]:
    """Pick the kernel, tile and split count (unless given), then (launch) plan, attention and merge.
    Returns the (config, num_splits) used."""
    batch, num_tokens, num_q_heads, dk = q.shape
    num_kv_heads = k_buffer.shape[1]
    dv = out.shape[-1]
    if _runs_gluon(impl, config, q, v_is_k=v_is_k, dk=dk, dv=dv):
        return _mla_sm90_launch(q, k_buffer, k_new, tree_mask, kv_indices, kv_indptr, prefix_lens, page_table_stride,
                                out, workspace, sm_scale, page_size, use_indptr, num_splits, plan, launch)
    group = num_q_heads // num_kv_heads
    block_d, block_dpe = (dv, dk - dv) if v_is_k else (dk, 0)
    smem_limit, sm_count = _device_limits(_device_index(q.device))
    rows = num_tokens * group
    if config is None:
        key = dict(rows=rows, dk=dk, dv=dv, v_is_k=v_is_k, elt=q.element_size(), smem_limit=smem_limit)
        while True:  # our shared-memory estimate is rough: fall back to the next tile if the compiler says no
            config = pick_config(**key)
            try:
                return _verify_attention_launch(q, k_buffer, v_buffer, k_new, v_new, tree_mask, kv_indices, kv_indptr,
                                                prefix_lens, page_table_stride, out, workspace, sm_scale, page_size,
                                                use_indptr, v_is_k, config, num_splits, plan, launch)
            except OutOfResources:
                if config == candidate_configs(**key)[-1]:
                    raise
                _TOO_LARGE.add((config, tuple(key.values())))
    m_blocks = triton.cdiv(rows, config.block_m)
    single = not step_needs_plan(batch)
    po, pl = workspace.part_out, workspace.part_lse
    args = [
        q, k_buffer, v_buffer, k_new, v_new, tree_mask,
        kv_indices, kv_indptr, prefix_lens,
        workspace.items, workspace.order,
        po, pl,
        sm_scale * _LOG2E,
        batch,
        num_splits or 3,  # a placeholder while warming up: 1 and multiples of 16 are specialised
        q.stride(0), q.stride(1), q.stride(2),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        k_new.stride(0), k_new.stride(1), k_new.stride(2),
        v_new.stride(0), v_new.stride(1), v_new.stride(2),
        tree_mask.stride(0), tree_mask.stride(1),
        page_table_stride,
        po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1),
    ]
    constexprs = dict(
        NUM_KV_HEADS=num_kv_heads, GROUP=group, T=num_tokens, BLOCK_T=max(16, triton.next_power_of_2(num_tokens)),
        BLOCK_D=block_d, BLOCK_DPE=block_dpe, BLOCK_DV=dv,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, PAGE_SIZE=page_size,
        USE_INDPTR=use_indptr, V_IS_K=v_is_k, SINGLE_REQUEST=single,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", WARP_SPECIALIZE=config.warp_specialize,
        PDL=q.is_cuda and _pdl_supported(_device_index(q.device)),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if num_splits is None:
        per_sm = _programs_per_sm(_verify_attention_kernel, tuple(args), constexprs, q)
        num_splits = _num_splits(num_kv_heads=num_kv_heads, m_blocks=m_blocks, slots=sm_count * per_sm,
                                 max_splits=workspace.max_splits)
    _check_plan(plan, workspace, batch=batch, block_n=config.block_n, num_splits=num_splits)
    if not launch:
        return config, num_splits
    if not single and plan is None:
        plan = _launch_plan(workspace, kv_indptr if use_indptr else prefix_lens, use_indptr, batch, config.block_n,
                            num_splits)
    args[15] = num_splits
    global _last_compiled
    # B = 1 (slices): programs 0..P-1 the prefix slices, P the new tokens; else 0..P+B-1 the plan's items
    # (largest first), then one per request's new tokens
    grid = (m_blocks, num_kv_heads, num_splits + 1 if single else num_splits + 2 * batch)
    _last_compiled = _verify_attention_kernel[grid](*args, **constexprs)
    _launch_merge(workspace, out, kv_indptr, prefix_lens, num_splits=num_splits, block_n=config.block_n,
                  use_indptr=use_indptr, single=single)
    return config, num_splits


def _check_plan(plan: VerifyPlan | None, workspace: VerifyWorkspace, *, batch: int, block_n: int,
                num_splits: int) -> None:
    if plan is None:
        return
    wanted = dict(batch=batch, block_n=block_n, num_splits=num_splits)
    got = dict(batch=plan.batch, block_n=plan.block_n, num_splits=plan.num_splits)
    wrong = [f"{k}={got[k]} (this call: {v})" for k, v in wanted.items() if got[k] != v]
    if plan.items.data_ptr() != workspace.items.data_ptr():
        wrong.append("made on another workspace")
    if wrong:
        raise ValueError(f"plan: {', '.join(wrong)}; allowed: a plan_verify(...) of this workspace with this "
                         "call's block_n / num_splits (verify_launch_params) and batch")


def merge_tiles(*, dv: int, num_splits: int, batch: int) -> tuple[int, int]:
    """(BLOCK_SC, BLOCK_DV) of the merge. Batch 1: all P slices in one load (up to 256; one round of loads per
    program instead of one per 16 parts). Batches: a request has about P / B parts (a long one more; the loop takes
    the rest), so the chunk is sized by that, at least 16 (sized by P it was 13-21% slower on ragged MLA batches,
    run 17). The Dv block as wide as keeps a program's chunk at <= 8192 fp32 (64 registers a thread at 4 warps)."""
    parts = num_splits if batch == 1 else max(16, -(-num_splits // batch) + 1)
    block_sc = min(256, triton.next_power_of_2(parts))
    block_dv = min(dv, max(16, 8192 // block_sc))
    return block_sc, block_dv


@functools.lru_cache(maxsize=None)
def _pdl_supported(device_index: int) -> bool:
    """Whether the merge is launched as a programmatic dependent launch (PDL) of the attention kernel: compiled
    kernels on an sm_90 or newer GPU (griddepcontrol). The attention kernels signal their dependents as they start,
    so the merge is launched early and its programs take SMs as the attention programs leave them, then wait in
    griddepcontrol.wait, instead of the merge being launched once the attention kernel has drained: 0.3-0.8 us on
    6 of 7 batch-1 MLA shapes, -0.2 us on one (run 33, docs/kernels.md item 31)."""
    return (not kernel_is_interpreted() and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


def _launch_merge(workspace: VerifyWorkspace, out: Tensor, kv_indptr: Tensor, prefix_lens: Tensor, *, num_splits: int,
                  block_n: int, use_indptr: bool, single: bool) -> None:
    """out = the partials of each request (its prefix parts and its new tokens) combined by their log-sum-exps
    (a programmatic dependent launch where _pdl_supported)."""
    batch, num_tokens, num_q_heads, dv = out.shape
    po, pl = workspace.part_out, workspace.part_lse
    block_sc, block_dv = merge_tiles(dv=dv, num_splits=num_splits, batch=batch)
    pdl = out.is_cuda and _pdl_supported(_device_index(out.device))
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


@functools.lru_cache(maxsize=None)
def _gluon_mla():
    """specsweep_kernels.verify_mla_sm90, or None where this Triton has no Gluon for Hopper."""
    try:
        from specsweep_kernels import verify_mla_sm90
    except ImportError:
        return None
    return verify_mla_sm90


def _use_gluon_mla(impl: str, q: Tensor, *, v_is_k: bool, dk: int, dv: int) -> bool:
    """impl "auto": the Gluon kernels wherever they apply (MLA, bf16 / fp16, sm_90; calls of <= 32 rows run the
    swapped-product one, docs/kernels.md item 27);
    "gluon": it wherever it applies, or an error."""
    if impl == "triton" or kernel_is_interpreted():
        ok = False
    else:
        gluon = _gluon_mla()
        ok = gluon is not None and gluon.mla_sm90_supported(q, v_is_k=v_is_k, dk=dk, dv=dv)
    if impl == "auto":
        return ok
    if impl == "gluon" and not ok:
        where = (f"{torch.cuda.get_device_name(q.device)} (sm_{''.join(map(str, torch.cuda.get_device_capability(q.device)))})"
                 if q.is_cuda else str(q.device))
        raise ValueError(f"impl='gluon' with {'MLA' if v_is_k else 'GQA'} Dk={dk} Dv={dv} {q.dtype} on {where}"
                         f"{'' if _gluon_mla() is not None else ' (this Triton has no Gluon for Hopper)'}; allowed: "
                         "MLA (v_buffer=None, Dk 576 = 512 + 64), bf16 or fp16, an sm_90 GPU (H100 / H200), "
                         "or impl='auto' / 'triton'")
    return ok


def _runs_gluon(impl: str, config: VerifyConfig | None, q: Tensor, *, v_is_k: bool, dk: int, dv: int) -> bool:
    """Whether a call launches the Gluon MLA kernel (a Triton tile config always means the Triton kernel)."""
    return config is None and _use_gluon_mla(impl, q, v_is_k=v_is_k, dk=dk, dv=dv)


def _mla_sm90_launch(q: Tensor, k_buffer: Tensor, k_new: Tensor, tree_mask: Tensor, kv_indices: Tensor,
                     kv_indptr: Tensor, prefix_lens: Tensor, page_table_stride: int, out: Tensor,
                     workspace: VerifyWorkspace, sm_scale: float, page_size: int, use_indptr: bool,
                     num_splits: int | None, plan: VerifyPlan | None, launch: bool) -> tuple[VerifyConfig, int]:
    """The Gluon kernel (one 220 KB program per SM) over the plan's items and the new tokens, then the merge."""
    gluon = _gluon_mla()
    batch, num_tokens, num_q_heads, _ = q.shape
    config = VerifyConfig(gluon.BLOCK_M, gluon.BLOCK_N, 8, 2)
    m_blocks = triton.cdiv(num_tokens * num_q_heads, gluon.BLOCK_M)
    if num_splits is None:
        num_splits = _gluon_num_splits(m_blocks=m_blocks, batch=batch, slots=_device_limits(_device_index(q.device))[1],
                                       max_splits=workspace.max_splits)
    _check_plan(plan, workspace, batch=batch, block_n=gluon.BLOCK_N, num_splits=num_splits)
    if not launch:
        return config, num_splits
    single = not step_needs_plan(batch)  # equal slices, no plan launch (a given plan is checked, not needed)
    if plan is None and not single:
        plan = _launch_plan(workspace, kv_indptr if use_indptr else prefix_lens, use_indptr, batch, gluon.BLOCK_N,
                            num_splits)
    global _last_compiled
    _last_compiled = gluon.launch_mla_sm90(
        q=q, kv_buffer=k_buffer, k_new=k_new, tree_mask=tree_mask, indices=kv_indices, kv_indptr=kv_indptr,
        prefix_lens=prefix_lens, page_table_stride=page_table_stride, items=workspace.items, order=workspace.order,
        part_out=workspace.part_out, part_lse=workspace.part_lse,
        num_items=num_splits if single else plan.num_items, sm_scale=sm_scale, page_size=page_size,
        use_indptr=use_indptr, single=single)
    _launch_merge(workspace, out, kv_indptr, prefix_lens, num_splits=num_splits, block_n=gluon.BLOCK_N,
                  use_indptr=use_indptr, single=single)
    return config, num_splits


_OCCUPANCY: dict[tuple, int] = {}


def _programs_per_sm(kernel, args: tuple, constexprs: dict, q: Tensor) -> int:
    """Attention programs resident per SM, from the compiled kernel's shared memory, registers and warps."""
    if kernel_is_interpreted():
        return 1
    key = (kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), q.device, q.dtype,
           tuple(sorted(constexprs.items())))
    if key not in _OCCUPANCY:
        compiled = kernel.warmup(*args, grid=(1,), **constexprs)
        try:
            compiled._init_handles()  # raises OutOfResources when the tile does not fit
            shared, n_regs = compiled.metadata.shared, compiled.n_regs
        except AttributeError:  # another Triton's internals: assume one program per SM
            _OCCUPANCY[key] = 1
            return 1
        props = torch.cuda.get_device_properties(q.device)
        threads = 32 * constexprs["num_warps"]
        smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
        regs = getattr(props, "regs_per_multiprocessor", 65536)
        max_threads = getattr(props, "max_threads_per_multi_processor", 2048)
        _OCCUPANCY[key] = max(1, min(smem // max(1, shared), regs // max(1, n_regs * threads), max_threads // threads))
    return _OCCUPANCY[key]


def kernel_is_interpreted() -> bool:
    """True when Triton's CPU interpreter runs the kernels (TRITON_INTERPRET=1 before this module was imported)."""
    return not isinstance(_verify_attention_kernel, triton.runtime.JITFunction)


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_inputs(
    *, q: Tensor, k_buffer: Tensor, v_buffer: Tensor | None, k_new: Tensor, v_new: Tensor | None, tree_mask: Tensor,
    out: Tensor, workspace: VerifyWorkspace, kv_indptr: Tensor | None, kv_indices: Tensor | None,
    page_table: Tensor | None, prefix_lens: Tensor | None, page_size: int, num_splits: int | None,
) -> None:
    """verify_attention's arguments: ValueError (shape, layout, range) or TypeError (dtype) naming the argument,
    what it is and what is allowed; raised before any kernel runs (explicit checks: `python -O` keeps them)."""
    if q.dim() != 4:
        raise ValueError(f"q: shape {_shape(q)}; allowed: [B, T, Hq, Dk]")
    batch, num_tokens, num_q_heads, dk = q.shape
    if k_buffer.dim() != 3 or k_buffer.shape[2] != dk:
        raise ValueError(f"k_buffer: shape {_shape(k_buffer)}; allowed: [slots, Hkv, Dk={dk}]")
    num_kv_heads = k_buffer.shape[1]
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"k_buffer: Hkv={num_kv_heads} with q's Hq={num_q_heads}; allowed: Hkv dividing Hq")
    if not 1 <= num_tokens <= 64:
        raise ValueError(f"q: T={num_tokens} new tokens; allowed: 1..64")
    if out.dim() != 4 or _shape(out)[:3] != (batch, num_tokens, num_q_heads):
        raise ValueError(f"out: shape {_shape(out)}; allowed: [B, T, Hq, Dv] = [{batch}, {num_tokens}, {num_q_heads}, Dv]")
    dv = out.shape[3]
    if _shape(k_new) != (batch, num_tokens, num_kv_heads, dk):
        raise ValueError(f"k_new: shape {_shape(k_new)}; allowed: [B, T, Hkv, Dk] = "
                         f"[{batch}, {num_tokens}, {num_kv_heads}, {dk}]")
    tensors = {"q": q, "k_buffer": k_buffer, "k_new": k_new, "out": out}
    if v_buffer is None:
        if v_new is not None:
            raise ValueError(f"v_new: shape {_shape(v_new)} with v_buffer=None (MLA); allowed: None "
                             "(V is the first Dv dims of K)")
        if num_kv_heads != 1 or not dv < dk or not _is_pow2(dv) or not _is_pow2(dk - dv):
            raise ValueError(f"MLA (v_buffer=None): Hkv={num_kv_heads} Dk={dk} Dv={dv}; allowed: Hkv=1 and "
                             "Dk = Dv + Dpe, Dv and Dpe powers of two (DeepSeek: 576 = 512 + 64)")
    else:
        if _shape(v_buffer) != (k_buffer.shape[0], num_kv_heads, dv):
            raise ValueError(f"v_buffer: shape {_shape(v_buffer)}; allowed: [slots, Hkv, Dv] = "
                             f"[{k_buffer.shape[0]}, {num_kv_heads}, {dv}]")
        if v_new is None or _shape(v_new) != (batch, num_tokens, num_kv_heads, dv):
            raise ValueError(f"v_new: {None if v_new is None else _shape(v_new)}; allowed: [B, T, Hkv, Dv] = "
                             f"[{batch}, {num_tokens}, {num_kv_heads}, {dv}]")
        if dv != dk or not _is_pow2(dk) or not 16 <= dk <= 256:
            raise ValueError(f"GQA (v_buffer given): Dk={dk} Dv={dv}; allowed: Dk = Dv, a power of two in 16..256")
        tensors |= {"v_buffer": v_buffer, "v_new": v_new}
    for name, t in tensors.items():
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {t.dtype}; allowed: q's dtype {q.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: strides {t.stride()}; allowed: contiguous in the last dim (stride 1)")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}; allowed: q's device {q.device}")
    if tree_mask.dtype != torch.bool:
        raise TypeError(f"tree_mask: dtype {tree_mask.dtype}; allowed: torch.bool")
    if _shape(tree_mask) != (batch, num_tokens, num_tokens) or tree_mask.stride(2) != 1:
        raise ValueError(f"tree_mask: shape {_shape(tree_mask)} strides {tree_mask.stride()}; allowed: "
                         f"[B, T, T] = [{batch}, {num_tokens}, {num_tokens}], contiguous in the last dim")
    ws = workspace.part_out.shape  # [splits + 2 * max_batch, max_tokens, Hq, Dv]
    if workspace.max_batch < batch or ws[1] < num_tokens or ws[2] != num_q_heads or ws[3] != dv:
        raise ValueError(f"workspace too small: max_batch={workspace.max_batch} max_tokens={ws[1]} num_q_heads={ws[2]} "
                         f"v_head_dim={ws[3]}; allowed: allocate_workspace(max_batch>={batch}, max_tokens>={num_tokens}, "
                         f"num_q_heads={num_q_heads}, v_head_dim={dv})")
    if num_splits is not None and not 1 <= num_splits <= workspace.max_splits:
        raise ValueError(f"num_splits={num_splits}; allowed: None or 1..{workspace.max_splits} (the workspace's "
                         "max_splits)")
    if kv_indptr is not None:
        if page_table is not None or prefix_lens is not None or page_size != 1:
            raise ValueError(f"kv_indptr given with page_table={None if page_table is None else _shape(page_table)} "
                             f"prefix_lens={None if prefix_lens is None else _shape(prefix_lens)} "
                             f"page_size={page_size}; allowed: page_table=None, prefix_lens=None, page_size=1 "
                             "(kv_indices are per-token slots)")
        if kv_indices is None:
            raise ValueError("kv_indices=None with kv_indptr given; allowed: an int32 tensor of slot ids")
        if _shape(kv_indptr) != (batch + 1,):
            raise ValueError(f"kv_indptr: shape {_shape(kv_indptr)}; allowed: [B+1] = [{batch + 1}]")
        for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
            if t.dtype != torch.int32:
                raise TypeError(f"{name}: dtype {t.dtype}; allowed: torch.int32")
        return
    if page_table is None or prefix_lens is None:
        raise ValueError(f"page_table={None if page_table is None else _shape(page_table)}, "
                         f"prefix_lens={None if prefix_lens is None else _shape(prefix_lens)}; allowed: both tensors "
                         "(page_table + prefix_lens + page_size), or kv_indptr + kv_indices")
    if page_table.dim() != 2 or page_table.shape[0] != batch or page_table.stride(1) != 1:
        raise ValueError(f"page_table: shape {_shape(page_table)} strides {page_table.stride()}; allowed: "
                         f"[B={batch}, max_pages], contiguous rows")
    if _shape(prefix_lens) != (batch,):
        raise ValueError(f"prefix_lens: shape {_shape(prefix_lens)}; allowed: [B] = [{batch}]")
    for name, t in (("page_table", page_table), ("prefix_lens", prefix_lens)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name}: dtype {t.dtype}; allowed: torch.int32")
    if not page_size >= 1:
        raise ValueError(f"page_size={page_size!r}; allowed: an integer >= 1")


def _run(kw: dict, *, plan: VerifyPlan | None, launch: bool) -> tuple[VerifyConfig, int] | None:
    """verify_attention's body: check, then the reference fallback (returns None) or the kernels."""
    _check_inputs(**{k: kw[k] for k in ("q", "k_buffer", "v_buffer", "k_new", "v_new", "tree_mask", "out",
                                        "workspace", "kv_indptr", "kv_indices", "page_table", "prefix_lens",
                                        "page_size", "num_splits")})
    impl = kw["impl"]
    if impl not in _IMPLS:
        raise ValueError(f"impl={impl!r}; allowed: {', '.join(map(repr, _IMPLS))}")
    if impl == "gluon":  # before the CPU fallback: an explicit request for the Gluon kernel is never ignored
        _use_gluon_mla(impl, kw["q"], v_is_k=kw["v_buffer"] is None, dk=kw["q"].shape[-1], dv=kw["out"].shape[-1])
    if impl == "gluon" and kw["config"] is not None:
        raise ValueError(f"config={kw['config']} with impl='gluon'; allowed: config=None (config tunes the Triton "
                         "kernel: impl='auto' or 'triton')")
    q, k_buffer, v_buffer, k_new, v_new = kw["q"], kw["k_buffer"], kw["v_buffer"], kw["k_new"], kw["v_new"]
    kv_indptr, kv_indices, page_table, prefix_lens = kw["kv_indptr"], kw["kv_indices"], kw["page_table"], kw["prefix_lens"]
    v_is_k = v_buffer is None
    if v_is_k:
        v_buffer, v_new = k_buffer, k_new  # unused by the kernel
    if q.device.type != "cuda" and not kernel_is_interpreted():
        if not launch:
            return None
        from specsweep_kernels.reference import verify_attention_reference

        verify_attention_reference(
            q=q, k_buffer=k_buffer, v_buffer=None if v_is_k else v_buffer, k_new=k_new,
            v_new=None if v_is_k else v_new, tree_mask=kw["tree_mask"], sm_scale=kw["sm_scale"], out=kw["out"],
            kv_indptr=kv_indptr, kv_indices=kv_indices, page_table=page_table, prefix_lens=prefix_lens,
            page_size=kw["page_size"])
        return None
    use_indptr = kv_indptr is not None
    if use_indptr:
        page_table_stride = 0
        prefix_lens = kv_indptr
        indices = kv_indices
    else:
        page_table_stride = page_table.stride(0)
        indices = page_table
        kv_indptr = prefix_lens
    return _verify_attention_launch(q, k_buffer, v_buffer, k_new, v_new, kw["tree_mask"].view(torch.uint8), indices,
                                    kv_indptr, prefix_lens, page_table_stride, kw["out"], kw["workspace"],
                                    kw["sm_scale"], kw["page_size"], use_indptr, v_is_k, kw["config"],
                                    kw["num_splits"], plan, launch, impl)


def verify_attention(
    *,
    q: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor | None,
    k_new: Tensor,
    v_new: Tensor | None,
    tree_mask: Tensor,
    sm_scale: float,
    out: Tensor,
    workspace: VerifyWorkspace,
    kv_indptr: Tensor | None = None,
    kv_indices: Tensor | None = None,
    page_table: Tensor | None = None,
    prefix_lens: Tensor | None = None,
    page_size: int = 1,
    config: VerifyConfig | None = None,
    num_splits: int | None = None,
    plan: VerifyPlan | None = None,
    impl: str = "auto",
) -> Tensor:
    """Attention of T new tokens over a paged prefix plus themselves (tree mask). See the module docstring.

    On a CPU tensor without Triton's interpreter this falls back to `specsweep_kernels.reference` (same result, slow).

    config / num_splits override the tile and split heuristics (benchmarks, tuning); leave them None.
    plan: this step's plan_verify() on this workspace, reused by every layer (else the call plans itself).
    impl: "auto" (the Gluon kernel for MLA in bf16 / fp16 on sm_90; the Triton
    kernel elsewhere), "triton" (always the portable kernel), "gluon" (the Gluon kernel, or ValueError where it
    does not apply)."""
    kw = dict(q=q, k_buffer=k_buffer, v_buffer=v_buffer, k_new=k_new, v_new=v_new, tree_mask=tree_mask,
              sm_scale=sm_scale, out=out, workspace=workspace, kv_indptr=kv_indptr, kv_indices=kv_indices,
              page_table=page_table, prefix_lens=prefix_lens, page_size=page_size, config=config, num_splits=num_splits,
              impl=impl)
    _run(kw, plan=plan, launch=True)
    return out


def verify_launch_params(**kwargs) -> tuple[VerifyConfig, int]:
    """(tile config, prefix programs P) that verify_attention(**kwargs) uses: plan_verify's block_n is
    config.block_n and its num_splits P. Takes verify_attention's arguments (checked the same way); compiles the
    kernel on first use, launches nothing. On CPU without the interpreter: (first candidate tile, 1)."""
    kw = dict(v_buffer=None, v_new=None, kv_indptr=None, kv_indices=None, page_table=None, prefix_lens=None,
              page_size=1, config=None, num_splits=None, sm_scale=1.0, impl="auto") | kwargs
    params = _run(kw, plan=None, launch=False)
    if params is None:
        q, out = kw["q"], kw["out"]
        rows = q.shape[1] * q.shape[2] // kw["k_buffer"].shape[1]
        config = kw["config"] or pick_config(rows=rows, dk=q.shape[3], dv=out.shape[3], v_is_k=kw["v_buffer"] is None,
                                             elt=q.element_size(), smem_limit=_device_limits(0)[0])
        return config, kw["num_splits"] or 1
    return params


def verify_kernel(**kwargs) -> str:
    """"gluon" or "triton": the attention kernel verify_attention(**kwargs) launches (launches nothing; on a CPU
    without the interpreter the call runs the torch reference instead). Both kernels run batch 1 as equal slices
    without a plan (a plan= given there is checked, not needed) and batches from a plan."""
    kw = dict(v_buffer=None, config=None, impl="auto") | kwargs
    q = kw["q"]
    return "gluon" if _runs_gluon(kw["impl"], kw["config"], q, v_is_k=kw["v_buffer"] is None, dk=q.shape[-1],
                                  dv=kw["out"].shape[-1]) else "triton"
