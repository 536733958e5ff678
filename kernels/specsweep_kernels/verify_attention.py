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
registers and warps. Each constant's measured reason sits next to it; docs/kernels.md has the current figures and
docs/measurements/ the runs behind them.
"""
from __future__ import annotations

import functools

import torch
import triton
from torch import Tensor
from triton.runtime.errors import OutOfResources

from specsweep_kernels import verify_merge
from specsweep_kernels.verify_checks import _check_inputs
from specsweep_kernels.verify_config import (_TOO_LARGE, VerifyConfig, _device_index, _device_limits,
                                             _gluon_num_splits, _is_pow2, _num_splits, _programs_per_sm, _shape,
                                             candidate_configs, pick_config)
from specsweep_kernels.verify_plan import (VerifyPlan, VerifyWorkspace, _check_plan, _launch_plan, allocate_workspace,
                                           step_needs_plan)
from specsweep_kernels.verify_triton import _verify_attention_kernel, kernel_is_interpreted

__all__ = ["verify_kernel", "VerifyConfig", "VerifyPlan", "VerifyWorkspace", "allocate_workspace", "candidate_configs",
           "kernel_is_interpreted", "pick_config", "plan_verify", "verify_attention", "verify_launch_params"]


_LOG2E = 1.4426950408889634


_IMPLS = ("auto", "triton", "gluon")  # verify_attention(impl=...)


_last_compiled = None  # the last launched compiled attention kernel (benchmark diagnostics)



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


# A call that plans itself (batch >= 2, no plan= given; on sm_90 with the Gluon kernel) launches the attention kernel
# as the plan kernel's programmatic dependent: its programs are scheduled while the plan runs and wait for it in
# griddepcontrol.wait. False launches it after the plan has drained (the A/B's other arm, H200 2026-12-03).
PLAN_PDL = True


@functools.lru_cache(maxsize=None)
def _pdl_supported(device_index: int) -> bool:
    """Whether the merge is launched as a programmatic dependent launch (PDL) of the attention kernel: compiled
    kernels on an sm_90 or newer GPU (griddepcontrol). The attention kernels signal their dependents as they start,
    so the merge is launched early and its programs take SMs as the attention programs leave them, then wait in
    griddepcontrol.wait, instead of the merge being launched once the attention kernel has drained: 0.3-0.8 us on
    6 of 7 batch-1 MLA shapes, -0.2 us on one (H200, 2026-12-01)."""
    return (not kernel_is_interpreted() and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device_index)[0] >= 9)



def _launch_merge(workspace: VerifyWorkspace, out: Tensor, kv_indptr: Tensor, prefix_lens: Tensor, *, num_splits: int,
                  block_n: int, use_indptr: bool, single: bool) -> None:
    """verify_merge._launch_merge, as a programmatic dependent launch where _pdl_supported."""
    verify_merge._launch_merge(workspace, out, kv_indptr, prefix_lens, num_splits=num_splits, block_n=block_n,
                               use_indptr=use_indptr, single=single,
                               pdl=out.is_cuda and _pdl_supported(_device_index(out.device)))


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
    swapped-product one: at 16 rows a 64-row product computes 4x the FLOPs);
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
    pdl = _pdl_supported(_device_index(q.device))
    plan_pdl = False
    if plan is None and not single:
        plan_pdl = PLAN_PDL and pdl
        plan = _launch_plan(workspace, kv_indptr if use_indptr else prefix_lens, use_indptr, batch, gluon.BLOCK_N,
                            num_splits, pdl=plan_pdl)
    global _last_compiled
    _last_compiled = gluon.launch_mla_sm90(
        q=q, kv_buffer=k_buffer, k_new=k_new, tree_mask=tree_mask, indices=kv_indices, kv_indptr=kv_indptr,
        prefix_lens=prefix_lens, page_table_stride=page_table_stride, items=workspace.items, order=workspace.order,
        part_out=workspace.part_out, part_lse=workspace.part_lse,
        num_items=num_splits if single else plan.num_items, sm_scale=sm_scale, page_size=page_size,
        use_indptr=use_indptr, single=single, wait_plan=plan_pdl, pdl=pdl)
    _launch_merge(workspace, out, kv_indptr, prefix_lens, num_splits=num_splits, block_n=gluon.BLOCK_N,
                  use_indptr=use_indptr, single=single)
    return config, num_splits


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
