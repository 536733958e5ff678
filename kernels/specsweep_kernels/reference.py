"""Torch truth for `specsweep_kernels.verify_attention`: gather the prefix, fp32 softmax, same API semantics.

Used by the tests, by the benchmark's correctness check and as the CPU fallback. It materialises the
gathered prefix and the [Hq, T, L] score matrix per request, so it is for checking, not for speed.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["verify_attention_reference", "prefix_slots"]


def prefix_slots(
    *, batch: int, kv_indptr: Tensor | None = None, kv_indices: Tensor | None = None,
    page_table: Tensor | None = None, prefix_lens: Tensor | None = None, page_size: int = 1,
) -> list[Tensor]:
    """Per-request token slot ids [L_b] (int64) into the flat pool, from either addressing mode."""
    slots = []
    for b in range(batch):
        if kv_indptr is not None:
            lo, hi = int(kv_indptr[b]), int(kv_indptr[b + 1])
            slots.append(kv_indices[lo:hi].long())
        else:
            n = int(prefix_lens[b])
            pos = torch.arange(n, device=page_table.device)
            pages = page_table[b, pos // page_size].long()
            slots.append(pages * page_size + pos % page_size)
    return slots


def verify_attention_reference(
    *, q: Tensor, k_buffer: Tensor, v_buffer: Tensor | None, k_new: Tensor, v_new: Tensor | None, tree_mask: Tensor,
    sm_scale: float, out: Tensor | None = None, v_head_dim: int | None = None, **addressing: Any,
) -> Tensor:
    """Same arguments as `verify_attention` (no workspace); returns out [B, T, Hq, Dv] (fp32 if out is None).

    v_buffer / v_new None means MLA: V is the first Dv dims of the K rows (Dv from out or v_head_dim).
    addressing: kv_indptr + kv_indices, or page_table + prefix_lens + page_size (`prefix_slots`).
    """
    batch, num_tokens, num_q_heads, _ = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_q_heads // num_kv_heads
    dv = out.shape[-1] if out is not None else (v_head_dim or v_buffer.shape[-1])
    slots = prefix_slots(batch=batch, **addressing)
    result = torch.empty(batch, num_tokens, num_q_heads, dv, device=q.device, dtype=torch.float32)
    for b in range(batch):
        k_pre = k_buffer[slots[b]].float()  # [L, Hkv, Dk]
        v_pre = (v_buffer[slots[b]] if v_buffer is not None else k_buffer[slots[b]][..., :dv]).float()
        kn = k_new[b].float()  # [T, Hkv, Dk]
        vn = (v_new[b] if v_new is not None else k_new[b][..., :dv]).float()
        keys = torch.cat([k_pre, kn]).repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L+T, Dk]
        vals = torch.cat([v_pre, vn]).repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L+T, Dv]
        qb = q[b].float().transpose(0, 1)  # [Hq, T, Dk]
        scores = torch.matmul(qb, keys.transpose(1, 2)) * sm_scale  # [Hq, T, L+T]
        visible = torch.ones(num_tokens, k_pre.shape[0] + num_tokens, dtype=torch.bool, device=q.device)
        visible[:, k_pre.shape[0]:] = tree_mask[b].bool()
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees nothing gives 0
        result[b] = torch.matmul(probs, vals).transpose(0, 1)
    if out is not None:
        out.copy_(result)
        return out
    return result
