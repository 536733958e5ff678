"""Attention backends behind one small interface, chosen by `--attention-backend`.

A backend sees, per layer, the queries and the fresh K/V of the T new tokens of one request,
that layer's whole K/V pool and `AttentionMetadata`: the page table, the prefix length, the per-token
slots of the prefix and the T x T tree (ancestor) mask. Prefill chunks, decode steps and tree verifies
are all this one call: the prefix is visible to every new token (minus a sliding window), the new
tokens see each other through `tree_mask`. The model stores the new K/V in the pool (at `new_slots`)
before it calls the backend; a backend may read them from the pool or from `k_new` / `v_new`.

A batched forward (several requests, `BatchMetadata`) concatenates the requests' new tokens: the model's
projections and MLP see all rows at once, and `forward_batch` attends each request's rows against its own KV
(by default one `forward` call per request).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)


@dataclass
class AttentionMetadata:
    """One request's new tokens in a forward. Built once per forward, shared by all layers."""

    positions: Tensor      # [T] int64, RoPE positions of the new tokens (prefix_len + tree depth)
    new_slots: Tensor      # [T] int64, pool slots the new tokens' K/V are written to
    prefix_slots: Tensor   # [P] int64, pool slots of the cached prefix, position order
    prefix_len: int        # P
    tree_mask: Tensor      # [T, T] bool, True where new token i may attend new token j (causal for chains)
    page_table: Tensor     # [num_pages] int64, the request's pages (for kernels that walk pages)
    page_size: int
    _visible: dict = field(default_factory=dict, repr=False)
    # Static device tensors for the verify kernel under CUDA graphs (workers/reference/cuda_graph.py):
    # [1, max_pages] int32 page ids and [1] int32 prefix length. None: built from page_table / prefix_len.
    kernel_page_table: Tensor | None = None
    kernel_prefix_lens: Tensor | None = None

    @property
    def num_new(self) -> int:
        return self.positions.numel()

    def kv_slots(self) -> Tensor:
        """[P + T] pool slots of all keys (the new tokens' K/V are already stored there)."""
        if "slots" not in self._visible:
            self._visible["slots"] = torch.cat([self.prefix_slots, self.new_slots])
        return self._visible["slots"]

    def key_positions(self) -> Tensor:
        """[P + T] positions of all keys: the prefix, then the new tokens."""
        prefix = torch.arange(self.prefix_len, device=self.positions.device)
        return torch.cat([prefix, self.positions])

    def visible(self, window: int | None) -> Tensor:
        """[T, P + T] bool: which keys each new token attends to (cached per window size)."""
        cache = self._visible
        if window not in cache:
            mask = torch.ones(self.num_new, self.prefix_len + self.num_new, dtype=torch.bool,
                              device=self.positions.device)
            mask[:, self.prefix_len:] = self.tree_mask
            if window is not None:
                mask &= (self.positions[:, None] - self.key_positions()[None, :]) < window
            cache[window] = mask
        return cache[window]


@dataclass
class BatchMetadata:
    """One forward over several requests: their new tokens concatenated in request order (T_i rows each)."""

    requests: list[AttentionMetadata]
    positions: Tensor  # [sum T_i] int64
    new_slots: Tensor  # [sum T_i] int64

    @classmethod
    def of(cls, requests: list[AttentionMetadata]) -> "BatchMetadata":
        return cls(requests, torch.cat([m.positions for m in requests]), torch.cat([m.new_slots for m in requests]))

    @property
    def sizes(self) -> list[int]:
        return [m.num_new for m in self.requests]


class AttentionBackend:
    """Interface. `forward` returns the attention output [T, Hq, D] in q's dtype."""

    name = "base"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def forward(self, q: Tensor, k_new: Tensor, v_new: Tensor, k_pool: Tensor, v_pool: Tensor,
                meta: AttentionMetadata, *, scale: float, window: int | None) -> Tensor:
        # q: [T, Hq, D]; k_new, v_new: [T, Hkv, D]; k_pool, v_pool: [S, Hkv, D]
        raise NotImplementedError

    def forward_batch(self, q: Tensor, k_new: Tensor, v_new: Tensor, k_pool: Tensor, v_pool: Tensor,
                      meta: BatchMetadata, *, scale: float, window: int | None) -> Tensor:
        # q: [sum T_i, Hq, D]; k_new, v_new: [sum T_i, Hkv, D] -> [sum T_i, Hq, D]
        sizes = meta.sizes
        return torch.cat([self.forward(qi, ki, vi, k_pool, v_pool, m, scale=scale, window=window)
                          for qi, ki, vi, m in zip(q.split(sizes), k_new.split(sizes), v_new.split(sizes),
                                                   meta.requests)])


ATTENTION_BACKENDS: dict[str, Callable[..., AttentionBackend]] = {}


def register_attention_backend(name: str):
    def wrap(cls):
        ATTENTION_BACKENDS[name] = cls
        cls.name = name
        return cls
    return wrap


def create_attention_backend(name: str, device: torch.device | str = "cpu") -> AttentionBackend:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name](device)


@register_attention_backend("torch")
class TorchAttentionBackend(AttentionBackend):
    """Gather all keys through their pool slots, masked attention with an fp32 softmax. Few new tokens
    (decode, tree verify): grouped fp32 matmuls; prefill chunks: SDPA (no [T, P+T] score matrix per head)."""

    SMALL_T = 64

    def forward(self, q, k_new, v_new, k_pool, v_pool, meta, *, scale, window):
        keys = k_pool.index_select(0, meta.kv_slots()).float()  # [P+T, Hkv, D]
        vals = v_pool.index_select(0, meta.kv_slots()).float()
        visible = meta.visible(window)  # [T, P+T]
        if q.shape[0] <= self.SMALL_T:
            return self._grouped(q, keys, vals, visible, scale)
        out = F.scaled_dot_product_attention(
            q.float().transpose(0, 1).unsqueeze(0),  # [1, Hq, T, D]
            keys.transpose(0, 1).unsqueeze(0),       # [1, Hkv, P+T, D]
            vals.transpose(0, 1).unsqueeze(0),
            attn_mask=visible, scale=scale, enable_gqa=True,
        )  # [1, Hq, T, D]
        return out[0].transpose(0, 1).to(q.dtype)

    @staticmethod
    def _grouped(q, keys, vals, visible, scale):
        T, num_q_heads, D = q.shape
        num_kv_heads = keys.shape[1]
        group = num_q_heads // num_kv_heads  # query head h reads KV head h // group
        qg = q.float().view(T, num_kv_heads, group, D).permute(1, 2, 0, 3).reshape(num_kv_heads, group * T, D)
        scores = torch.matmul(qg, keys.permute(1, 2, 0)) * scale  # [Hkv, G*T, P+T]
        scores = scores.view(num_kv_heads, group, T, -1).masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(num_kv_heads, group * T, -1)
        out = torch.matmul(probs, vals.transpose(0, 1))  # [Hkv, G*T, D]
        return out.view(num_kv_heads, group, T, D).permute(2, 0, 1, 3).reshape(T, num_q_heads, D).to(q.dtype)


@register_attention_backend("specsweep_verify")
class SpecsweepVerifyBackend(AttentionBackend):
    """This project's Triton verify kernel (`specsweep_kernels.verify_attention`) for decode and tree verify on
    full-attention layers; prefill chunks (T > 64) and sliding-window layers use the torch backend."""

    MAX_TOKENS = 64  # the kernel's T limit

    def __init__(self, device="cpu"):
        super().__init__(device)
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("attention backend 'specsweep_verify' needs CUDA + specsweep_kernels.verify_attention "
                               "(use --device cuda on a GPU machine, or --attention-backend torch)")
        from specsweep_kernels import verify_attention  # fails early if the kernel is missing

        self._kernel = verify_attention
        self._fallback = TorchAttentionBackend(device)
        self._workspace = None

    def forward(self, q, k_new, v_new, k_pool, v_pool, meta, *, scale, window):
        T, num_q_heads, head_dim = q.shape
        if window is not None or T > self.MAX_TOKENS:
            return self._fallback.forward(q, k_new, v_new, k_pool, v_pool, meta, scale=scale, window=window)
        if self._workspace is None:  # once, sized for any call: B = 1, T <= 64
            self._workspace = self._kernel.allocate_workspace(
                max_batch=1, max_tokens=self.MAX_TOKENS, num_q_heads=num_q_heads, v_head_dim=head_dim,
                device=q.device)
        if meta.kernel_page_table is None:  # eager: built once per forward, shared by the layers
            meta.kernel_page_table = meta.page_table.to(torch.int32).unsqueeze(0)
            meta.kernel_prefix_lens = torch.tensor([meta.prefix_len], device=q.device, dtype=torch.int32)
        out = torch.empty(1, T, num_q_heads, head_dim, device=q.device, dtype=q.dtype)
        self._kernel.verify_attention(
            q=q.unsqueeze(0), k_buffer=k_pool, v_buffer=v_pool, k_new=k_new.to(q.dtype).unsqueeze(0),
            v_new=v_new.to(q.dtype).unsqueeze(0), tree_mask=meta.tree_mask.unsqueeze(0), sm_scale=scale,
            out=out, workspace=self._workspace, page_table=meta.kernel_page_table,
            prefix_lens=meta.kernel_prefix_lens, page_size=meta.page_size,
        )  # [1, T, Hq, D]
        return out[0]
