"""verify_attention's argument checks: every shape, dtype, layout and device rule, raised as a ValueError or
TypeError naming the argument, what it is and what is allowed, before any kernel runs."""
from __future__ import annotations

import torch
from torch import Tensor

from specsweep_kernels.verify_config import _is_pow2, _shape
from specsweep_kernels.verify_plan import VerifyWorkspace

__all__: list[str] = []


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
