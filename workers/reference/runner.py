"""ModelRunner: one model, its KV pool and attention backend; runs extends, decodes and tree verifies, for one
request or a batch of requests (ragged: each its own sequence and number of new tokens)."""
from __future__ import annotations

import torch
from torch import Tensor

from .attention import AttentionBackend, AttentionMetadata, BatchMetadata
from .kv_cache import KVPool, PagedSequence
from .model import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, *, page_size: int, max_total_tokens: int,
                 max_seq_tokens: int, chunked_prefill_size: int, device: torch.device | str = "cpu",
                 pool: KVPool | None = None):
        """pool: another runner's pool to share (a self-draft reads and writes the target's layers it runs)."""
        cfg = model.config
        self.model, self.backend, self.device = model, backend, torch.device(device)
        self.page_size = page_size
        self.chunk = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 30
        self.max_seq_tokens = max_seq_tokens
        num_pages = -(-max_total_tokens // page_size)
        dtype = next(model.parameters()).dtype
        self.pool = pool if pool is not None else KVPool(
            cfg.num_hidden_layers, num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim, dtype, self.device)

    def new_sequence(self) -> PagedSequence:
        return PagedSequence(self.pool, self.max_seq_tokens)

    def forward(self, seq: PagedSequence, tokens: Tensor, depths: Tensor | None = None,
                tree_mask: Tensor | None = None) -> Tensor:
        """Append T tokens after seq.length (tree node i at position P + i, RoPE position P + depth_i).

        tokens, depths: [T]; tree_mask: [T, T] bool (None = causal). Returns hidden states [T, hidden].
        """
        return self._forward([seq], [tokens], [depths], [tree_mask])[0]

    def forward_batch(self, seqs: list[PagedSequence], tokens: list[Tensor], depths: list[Tensor | None] | None = None,
                      tree_masks: list[Tensor | None] | None = None) -> list[Tensor]:
        """`forward` for several requests in one model call: request i appends tokens[i] ([T_i]) to seqs[i].
        The projections and the MLP run over all sum T_i rows; attention per request. Returns [T_i, hidden] each."""
        n = len(seqs)
        return self._forward(seqs, tokens, depths or [None] * n, tree_masks or [None] * n)

    def _forward(self, seqs, tokens, depths, tree_masks) -> list[Tensor]:
        metas = [self._metadata(*args) for args in zip(seqs, tokens, depths, tree_masks)]
        meta = metas[0] if len(metas) == 1 else BatchMetadata.of(metas)
        hidden = self.model(torch.cat(tokens).to(self.device), meta, self.pool, self.backend)  # [sum T_i, hidden]
        for seq, m in zip(seqs, metas):
            seq.length = m.prefix_len + m.num_new
        return list(hidden.split([m.num_new for m in metas]))

    def _metadata(self, seq: PagedSequence, tokens: Tensor, depths: Tensor | None,
                  tree_mask: Tensor | None) -> AttentionMetadata:
        P, T = seq.length, tokens.numel()
        seq.reserve(P + T)
        if depths is None:
            depths = torch.arange(T, device=self.device)
        if tree_mask is None:
            tree_mask = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        return AttentionMetadata(
            positions=P + depths.to(self.device), new_slots=seq.slots(P, P + T), prefix_slots=seq.slots(0, P),
            prefix_len=P, tree_mask=tree_mask.to(self.device), page_table=seq.page_table[:seq.num_pages],
            page_size=self.page_size,
        )

    def extend(self, seq: PagedSequence, tokens: list[int], all_logits: bool = False) -> Tensor:
        """Chunked prefill of `tokens` after seq.length. Returns logits [T, V] (all) or [1, V] (last)."""
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        outs = []
        for start in range(0, len(tokens), self.chunk):
            hidden = self.forward(seq, ids[start:start + self.chunk])
            outs.append(hidden if all_logits else hidden[-1:])
        return self.model.logits(torch.cat(outs) if all_logits else outs[-1])
