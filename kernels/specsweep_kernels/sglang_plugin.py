"""`specsweep_verify`: this project's verify kernel as an SGLang attention backend (a plugin, no fork).

    register()          add `specsweep_verify` to `--attention-backend` choices and register its factory
    backend_class()     the backend class (a subclass of SGLang's `TritonAttnBackend`), built on first use
    tree_mask_from_custom_mask(custom_mask, mask_indptr, prefix_lens, num_tokens) -> [B, T, T] bool
    decode_page_table(req_to_token, req_pool_indices, seq_lens) -> (page_table [B, W] int32, prefix_lens [B] int32)

How SGLang finds it (shared/docs/sglang-facts.md §3):
- SGLang >= 0.5.16: the `sglang.srt.plugins` entry point `specsweep_verify` in pyproject.toml; SGLang's
  `load_plugins()` runs `register()` in the launcher, every scheduler, the detokenizer and the DP controller.
- SGLang 0.5.10 (no plugin framework): `python -m workers.sglang_launch ...` registers at module top level, so
  the spawned scheduler processes (which re-import `__main__` as `__mp_main__`) register too.
Both are what workers/sglang.py emits for `attention=specsweep_verify`. `register()` is idempotent.

What runs our kernel: `forward_extend` in TARGET_VERIFY mode (T draft tokens per request against the cached
prefix, `spec_info.custom_mask` -> tree mask; None = a linear chain, causal) and `forward_decode` (T = 1). Everything
else (prefill / plain extend, draft-extend, MLA, sliding window, sinks, logit soft-cap, fp8 KV scales, decode
context parallelism, head dims the kernel does not take, T > 64) goes to `TritonAttnBackend` unchanged. Because
MLA layers would silently run Triton, `orchestrator.validate` refuses specsweep_verify with an MLA model on SGLang,
and refuses split backends where SGLang would verify on the other backend (docs/sglang.md).
Metadata is the parent's: `forward_metadata.kv_indptr/kv_indices` (verify prefix, token slot ids at any page
size), `req_to_token` rows (decode prefix), and its CUDA-graph buffers; the kernel's workspace is allocated in
`init_cuda_graph_state` (or on first use) for the largest batch, so replays allocate nothing.

The forward paths need a CUDA GPU and a running SGLang model runner: they are not exercised on CPU.
tests/kernels/test_sglang_plugin.py checks on CPU that the plugin loads through `load_plugins()`, that the name
parses as `--attention-backend`, that the class subclasses the real `TritonAttnBackend` and leaves none of
`AttentionBackend`'s methods unimplemented, and the two pure helpers above against hand-built metadata.
SGLang is imported only inside `register()` / `backend_class()`: importing this module needs torch alone.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

NAME = "specsweep_verify"
MAX_VERIFY_TOKENS = 64  # specsweep_kernels.verify_attention: T in 1..64


def register() -> None:
    """Make `--attention-backend specsweep_verify` parse and build our backend (safe to call again)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.server_args import add_attention_backend_choices

    if NAME in ATTENTION_BACKENDS:
        return
    try:
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES  # >= 0.5.20
    except ImportError:
        from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES  # 0.5.10
    if NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([NAME])
    register_attention_backend(NAME)(create_backend)
    logger.info("registered SGLang attention backend %s", NAME)


def create_backend(model_runner: Any) -> Any:
    """The factory SGLang calls with its ModelRunner."""
    return backend_class()(model_runner)


# ---------------------------------------------------------------- metadata -> kernel arguments (pure torch)


def tree_mask_from_custom_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor, prefix_lens: torch.Tensor,
                               num_tokens: int) -> torch.Tensor:
    """SGLang's flattened verify mask -> our [B, T, T] tree mask.

    custom_mask: flat bool, per request b a row-major [T, prefix_b + T] block starting at mask_indptr[b];
    column prefix_b + j of row i says whether draft token i sees draft token j (the prefix columns are all True).
    """
    t = num_tokens
    rows = torch.arange(t, device=custom_mask.device)
    width = prefix_lens.to(torch.int64) + t  # [B]
    start = mask_indptr[:-1].to(torch.int64) + prefix_lens.to(torch.int64)  # first tree column of row 0
    idx = start[:, None, None] + rows[None, :, None] * width[:, None, None] + rows[None, None, :]
    return custom_mask[idx].to(torch.bool).contiguous()


def causal_tree_mask(batch: int, num_tokens: int, device: torch.device) -> torch.Tensor:
    """A linear draft chain (DFLASH, EAGLE topk=1, decode): token i sees tokens 0..i."""
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril().expand(
        batch, num_tokens, num_tokens).contiguous()


def decode_page_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                      seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: the prefix is every cached token but the one being decoded (our kernel takes it as k_new).

    Returns the request rows of `req_to_token` (token slot ids, read with page_size=1) and seq_lens - 1.
    """
    page_table = req_to_token[req_pool_indices.to(torch.int64)].to(torch.int32)
    return page_table, (seq_lens - 1).to(torch.int32)


# ---------------------------------------------------------------- the backend class


@functools.lru_cache(maxsize=None)
def backend_class() -> type:
    """Build the subclass on first use (SGLang's Triton backend is imported only here)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from specsweep_kernels.verify_attention import allocate_workspace, verify_attention

    class SpecsweepVerifyAttnBackend(TritonAttnBackend):
        """TritonAttnBackend whose TARGET_VERIFY and decode attention run `specsweep_kernels.verify_attention`."""

        def __init__(self, model_runner: Any, *args: Any, **kwargs: Any):
            super().__init__(model_runner, *args, **kwargs)
            self._workspaces: dict[tuple[int, int], Any] = {}
            self._max_bs = int(getattr(model_runner.req_to_token_pool, "size", 1))
            spec_tokens = getattr(getattr(model_runner, "server_args", None), "speculative_num_draft_tokens", None)
            self._max_tokens = max(1, min(MAX_VERIFY_TOKENS, int(spec_tokens or 1)))

        # -- CUDA graphs: allocate the workspace before capture
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args: Any, **kwargs: Any):
            super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
            self._max_bs = max(self._max_bs, max_bs)

        def _workspace(self, num_q_heads: int, v_head_dim: int, device: torch.device) -> Any:
            key = (num_q_heads, v_head_dim)
            ws = self._workspaces.get(key)
            if ws is None:
                ws = allocate_workspace(max_batch=self._max_bs, max_tokens=self._max_tokens,
                                        num_q_heads=num_q_heads, v_head_dim=v_head_dim, device=device)
                self._workspaces[key] = ws
            return ws

        def _kernel_takes(self, layer: Any, num_tokens: int, kwargs: dict) -> bool:
            d = layer.qk_head_dim
            return (not self.use_mla and d == layer.v_head_dim and d & (d - 1) == 0 and 16 <= d <= 256
                    and 1 <= num_tokens <= self._max_tokens
                    and not any(kwargs.get(k) is not None for k in ("sinks", "score_mod", "aux_tensors"))
                    and not getattr(layer, "logit_cap", 0) and getattr(layer, "sliding_window_size", -1) in (-1, None)
                    and getattr(layer, "k_scale", None) is None and getattr(self, "dcp_size", 1) == 1
                    and not getattr(layer, "is_cross_attention", False))

        def _save_kv(self, forward_batch: Any, layer: Any, k: torch.Tensor, v: torch.Tensor) -> None:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)

        def _run(self, q, k, v, layer, forward_batch, num_tokens, tree_mask, prefix) -> torch.Tensor:
            bs = forward_batch.batch_size
            hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
            pool = forward_batch.token_to_kv_pool
            out = q.new_empty((bs, num_tokens, hq, d))
            verify_attention(
                q=q.reshape(bs, num_tokens, hq, d), k_buffer=pool.get_key_buffer(layer.layer_id),
                v_buffer=pool.get_value_buffer(layer.layer_id), k_new=k.reshape(bs, num_tokens, hkv, d),
                v_new=v.reshape(bs, num_tokens, hkv, d), tree_mask=tree_mask, sm_scale=layer.scaling, out=out,
                workspace=self._workspace(hq, d, q.device), **prefix)
            return out.view(bs * num_tokens, hq * d)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            mode = forward_batch.forward_mode
            num_tokens = q.shape[0] // max(1, forward_batch.batch_size)
            if not mode.is_target_verify() or k is None or not self._kernel_takes(layer, num_tokens, kwargs):
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            if save_kv_cache:
                self._save_kv(forward_batch, layer, k, v)
            meta = self.forward_metadata
            bs = forward_batch.batch_size
            kv_indptr = meta.kv_indptr[: bs + 1]
            prefix_lens = kv_indptr[1:] - kv_indptr[:-1]
            if meta.custom_mask is None:
                tree_mask = causal_tree_mask(bs, num_tokens, q.device)
            else:
                tree_mask = tree_mask_from_custom_mask(meta.custom_mask, meta.mask_indptr[: bs + 1], prefix_lens,
                                                       num_tokens)
            prefix = {"kv_indptr": kv_indptr.to(torch.int32), "kv_indices": meta.kv_indices.to(torch.int32)}
            return self._run(q, k, v, layer, forward_batch, num_tokens, tree_mask, prefix)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            if k is None or not self._kernel_takes(layer, 1, kwargs):
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            if save_kv_cache:
                self._save_kv(forward_batch, layer, k, v)
            page_table, prefix_lens = decode_page_table(self.req_to_token, forward_batch.req_pool_indices,
                                                        forward_batch.seq_lens)
            bs = forward_batch.batch_size
            prefix = {"page_table": page_table, "prefix_lens": prefix_lens, "page_size": 1}
            return self._run(q, k, v, layer, forward_batch, 1, causal_tree_mask(bs, 1, q.device), prefix)

    SpecsweepVerifyAttnBackend.__module__ = __name__
    return SpecsweepVerifyAttnBackend
