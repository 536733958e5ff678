"""CUDA graphs for the reference engine's decode / verify / draft forwards with the `specsweep_verify` backend.

One graph per T bucket (1, 2, 4, ..., 64): a forward of T new tokens is padded to the smallest bucket >= T and
replayed from static device buffers (tokens, RoPE positions, KV slots, tree mask, the kernel's int32 page table
and prefix length). Padded rows are harmless: their K/V go to the sequence's own positions P+T .. P+bucket-1
(past `seq.length`, rewritten before anything reads them), the real rows never see them (tree mask), and each
padded row sees only itself. The verify kernel reads the prefix length and page table on the device, so one
graph serves every prefix length; its workspace is allocated once, by the backend, during the eager warm-up.

A bucket is captured the first time it is used: that call runs eagerly from the static buffers (compiling the
Triton kernels, whose result is returned), then the same forward is captured; later calls replay it. Forwards
with T > 64 (prefill chunks), models with sliding-window layers, and steps whose padding doesn't fit the
request's page table run eagerly (`ModelRunner.forward`). `--disable-cuda-graph` turns all of this off.

Graphs serve one request per forward: a batched forward (`forward_batch` with two or more requests, i.e. several
requests running at once, `--max-running-requests` > 1) runs eagerly, the verify kernel once per request.

`capture=False` runs the same static-buffer path without graphs (CPU tests of the padding and masking).
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .attention import AttentionMetadata
from .kv_cache import OutOfPagesError, PagedSequence
from .runner import ModelRunner

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket_for(num_tokens: int) -> int | None:
    return next((b for b in BUCKETS if b >= num_tokens), None)


def use_cuda_graph(args, device: torch.device, model) -> bool:
    """Graphs for `--attention-backend specsweep_verify` on CUDA, unless --disable-cuda-graph or the model
    has sliding-window layers (those fall back to the torch backend, which is not graph-safe)."""
    if args.attention_backend != "specsweep_verify" or device.type != "cuda" or getattr(args, "disable_cuda_graph", False):
        return False
    cfg = model.config
    if any(cfg.window_of(i) is not None for i in range(cfg.num_hidden_layers)):
        logger.warning("sliding-window layers: CUDA graphs off (those layers use the eager torch backend)")
        return False
    return True


@dataclass
class _Buffers:
    """A bucket's static inputs: typed views into one device byte buffer, filled from a (pinned) host twin
    with a single copy per forward (tokens, positions, slots, prefix length, tree mask)."""

    tokens: Tensor     # [b] int64
    positions: Tensor  # [b] int64
    slots: Tensor      # [b] int64
    prefix: Tensor     # [1] int32, the kernel's prefix length
    tree_mask: Tensor  # [b, b] bool
    device_bytes: Tensor
    host_bytes: Tensor
    host_i64: np.ndarray   # [3, b] view of host_bytes: tokens, positions, slots
    host_prefix: np.ndarray
    host_mask: np.ndarray
    copied: "torch.cuda.Event | None" = None  # recorded after the last host -> device copy

    @classmethod
    def allocate(cls, b: int, device: torch.device) -> "_Buffers":
        n64, mask_at = 3 * b * 8, 3 * b * 8 + 8
        nbytes = mask_at + b * b

        def views(raw: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return (raw[:n64].view(torch.int64).view(3, b), raw[n64:n64 + 4].view(torch.int32),
                    raw[mask_at:].view(torch.bool).view(b, b))

        dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        d64, dprefix, dmask = views(dev)
        h64, hprefix, hmask = (v.numpy() for v in views(host))  # numpy views of the pinned bytes
        return cls(d64[0], d64[1], d64[2], dprefix, dmask, dev, host, h64, hprefix, hmask)


class GraphModelRunner(ModelRunner):
    """A ModelRunner whose small forwards (T <= 64) replay CUDA graphs."""

    def __init__(self, *args, capture: bool = True, **kw):
        super().__init__(*args, **kw)
        self.capture = capture
        max_pages = -(-self.max_seq_tokens // self.page_size)
        self._table = torch.zeros(1, max_pages, dtype=torch.int32, device=self.device)  # kernel page table
        self._empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        self._bufs: dict[int, _Buffers] = {}
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._mempool = torch.cuda.graph_pool_handle() if capture else None
        self.replays = 0
        self.eager_fallbacks = 0
        self.eager_batches = 0  # forwards of several requests (eager)
        # time_replays: per replay (bucket, host s before it, host s inside replay(), CUDA events around it)
        self.time_replays = False
        self.replay_times: list[tuple[int, float, float, torch.cuda.Event, torch.cuda.Event]] = []

    def _buffers(self, b: int) -> _Buffers:
        if b not in self._bufs:
            self._bufs[b] = _Buffers.allocate(b, self.device)
        return self._bufs[b]

    def forward(self, seq: PagedSequence, tokens: Tensor, depths: Tensor | None = None,
                tree_mask: Tensor | None = None) -> Tensor:
        t_enter = time.perf_counter()
        P, T = seq.length, tokens.numel()
        b = bucket_for(T)
        if b is None or seq.page_table.numel() != self._table.shape[1]:
            return super().forward(seq, tokens, depths, tree_mask)
        try:
            seq.reserve(P + b)
        except OutOfPagesError:  # the padding doesn't fit this request's pages: this step runs eagerly
            self.eager_fallbacks += 1
            return super().forward(seq, tokens, depths, tree_mask)
        buf = self._buffers(b)
        self._fill(buf, seq, tokens, depths, tree_mask, P, T, b)
        if self.capture and b in self._graphs:
            graph, out = self._graphs[b]
            if self.time_replays:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                graph.replay()
                host_s = time.perf_counter() - t0
                end.record()
                self.replay_times.append((b, t0 - t_enter, host_s, start, end))
            else:
                graph.replay()
            self.replays += 1
            hidden = out[:T].clone()
        else:
            hidden = self._first_call(b, buf, seq, P)[:T]
        seq.length = P + T
        return hidden

    def forward_batch(self, seqs, tokens, depths=None, tree_masks=None) -> list[Tensor]:
        if len(seqs) == 1:  # graphs are captured for one request
            return [self.forward(seqs[0], tokens[0], depths[0] if depths else None,
                                 tree_masks[0] if tree_masks else None)]
        self.eager_batches += 1
        return super().forward_batch(seqs, tokens, depths, tree_masks)

    def _fill(self, buf: _Buffers, seq: PagedSequence, tokens: Tensor, depths: Tensor | None,
              tree_mask: Tensor | None, P: int, T: int, b: int) -> None:
        """Everything is written on the host, then one copy to the device (and one for the page table): on a
        slow host each extra small launch before the replay is GPU idle time."""
        if buf.copied is not None:
            buf.copied.synchronize()  # the pinned twin may still feed this bucket's previous copy
        tok, pos, slots = buf.host_i64  # numpy views: host arithmetic at numpy's per-op cost, not torch's
        tok[T:] = 0
        tok[:T] = tokens.cpu().numpy()
        pos[:] = np.arange(P, P + b)  # padded rows: positions past the real ones
        if depths is not None:
            pos[:T] = P + depths.cpu().numpy()
        slots[:] = seq.slots_host(P, P + b)
        buf.host_prefix[0] = P
        mask = buf.host_mask
        mask[:] = np.eye(b, dtype=np.bool_)  # padded rows see only themselves
        mask[:T, :T] = np.tri(T, dtype=np.bool_) if tree_mask is None else tree_mask.cpu().numpy()
        buf.device_bytes.copy_(buf.host_bytes, non_blocking=True)
        if self.device.type == "cuda":
            buf.copied = torch.cuda.Event()
            buf.copied.record()
        n = seq.num_pages
        self._table[0, :n].copy_(seq.page_table[:n])

    def _meta(self, buf: _Buffers, prefix_slots: Tensor, prefix_len: int) -> AttentionMetadata:
        return AttentionMetadata(positions=buf.positions, new_slots=buf.slots, prefix_slots=prefix_slots,
                                 prefix_len=prefix_len, tree_mask=buf.tree_mask, page_table=self._table[0],
                                 page_size=self.page_size, kernel_page_table=self._table,
                                 kernel_prefix_lens=buf.prefix)

    def _first_call(self, b: int, buf: _Buffers, seq: PagedSequence, P: int) -> Tensor:
        """Eager from the static buffers (compiles the kernels; its result is this call's), then capture."""
        if not self.capture:  # no graph: the torch backend may run too, it reads the prefix slots
            return self.model(buf.tokens, self._meta(buf, seq.slots(0, P), P), self.pool, self.backend).clone()
        meta = self._meta(buf, self._empty, P)  # the verify kernel reads the page table, never prefix slots
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            hidden = self.model(buf.tokens, meta, self.pool, self.backend).clone()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            out = self.model(buf.tokens, meta, self.pool, self.backend)
        self._graphs[b] = (graph, out)
        logger.info("captured a CUDA graph for T bucket %d", b)
        return hidden


def replay_summary(runner, bucket: int | None) -> dict | None:
    """Medians over the timed replays of one bucket: host ms from `forward` entry to the replay (filling the
    static inputs), host ms inside replay() and GPU ms between the events around it (graph execution plus any
    wait for the launch); clears the record."""
    rows = [(p, h, s.elapsed_time(e)) for b, p, h, s, e in getattr(runner, "replay_times", []) if b == bucket]
    if hasattr(runner, "replay_times"):
        runner.replay_times.clear()
    if not rows:
        return None
    return {"replays": len(rows), "prep_host_ms": 1e3 * statistics.median(p for p, _, _ in rows),
            "launch_host_ms": 1e3 * statistics.median(h for _, h, _ in rows),
            "graph_gpu_ms": statistics.median(g for _, _, g in rows)}


def make_runner(args, model, backend, device: torch.device, **kw) -> ModelRunner:
    """The engine's runner factory: a GraphModelRunner where `use_cuda_graph`, else a plain ModelRunner."""
    if use_cuda_graph(args, device, model):
        return GraphModelRunner(model, backend, device=device, **kw)
    return ModelRunner(model, backend, device=device, **kw)
