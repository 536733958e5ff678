"""The plan of a batched verify step and the workspace it lives in.

plan_verify (verify_attention.py, the public entry) launches _plan_kernel: one program that cuts every request's
prefix tiles into at most P + B items of at most ceil(batch tiles / P) tiles, never crossing a request, and orders
them largest first for the attention kernels' prefix programs. Everything is computed on the device from the prefix
lengths, so a CUDA graph replay may change them. The workspace holds the plan and one fp32 partial slot per item
plus one per request's new tokens; its sizes do not depend on the prefix lengths.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specsweep_kernels.verify_config import _device_index, _device_limits, step_needs_plan

__all__ = ["VerifyPlan", "VerifyWorkspace", "allocate_workspace", "step_needs_plan"]


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
    PDL: tl.constexpr,  # the attention kernel is its programmatic dependent: let it be scheduled now
):
    """The plan (one program): cut every request's prefix tiles into items of at most `chunk` tiles,
    chunk = ceil(tiles / P), so there are at most P + B items and no item
    crosses a request. items[i] = (b, lo, hi, 0) in request order (slot i); req[b] = (first item, items);
    order[p] = the item program p runs: full items first, then the requests' last partial items by size,
    largest first, then the empty items (lo = hi = 0, b = 0) up to P + B.
    PDL: the attention kernel after it may start now; it waits (griddepcontrol.wait) before it reads the plan."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
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


def _launch_plan(workspace: VerifyWorkspace, lens_or_indptr: Tensor, use_indptr: bool, batch: int, block_n: int,
                 num_splits: int, pdl: bool = False) -> VerifyPlan:
    """The plan kernel into the workspace; pdl: the next launch is its programmatic dependent (it waits for the
    plan before reading it)."""
    num_items = num_splits + batch
    plan = VerifyPlan(items=workspace.items[:num_items], req=workspace.req[:batch], order=workspace.order[:num_items],
                      batch=batch, block_n=block_n, num_splits=num_splits)
    _plan_kernel[(1,)](
        lens_or_indptr, lens_or_indptr, plan.items, plan.req, plan.order, batch, num_splits,
        BLOCK_B=max(2, triton.next_power_of_2(batch)), BLOCK_K=32, BLOCK_I=128, BLOCK_N=block_n,
        USE_INDPTR=use_indptr, PDL=pdl, num_warps=4,
    )
    return plan


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
