"""Paged KV cache: a flat token pool cut into pages, a page allocator and per-request page tables.

Slot of the token at position p of a request: page_table[p // page_size] * page_size + p % page_size.
Every read goes through that indirection, at every page size (1 included).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class OutOfPagesError(RuntimeError):
    """The pool has fewer free pages than a request needs."""


class PageAllocator:
    """Free list of page ids over a pool of `num_pages` pages."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pops give 0, 1, 2, ...

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"need {n} KV pages, {len(self._free)} of {self.num_pages} free")
        pages = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        return pages

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))

    def reset(self) -> None:
        self._free = list(range(self.num_pages - 1, -1, -1))


class KVPool:
    """Per-layer K and V pools, [num_slots, Hkv, D] each, preallocated once."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        shape = (num_layers, self.num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, S, Hkv, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.allocator = PageAllocator(num_pages)

    def store(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        # slots: [T]; k, v: [T, Hkv, D]
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def copy_slots(self, src: Tensor, dst: Tensor) -> None:
        """Move K/V rows of every layer from slots `src` to slots `dst` (both [n])."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def copy_from(self, other: KVPool, src: Tensor, dst: Tensor) -> None:
        """K/V rows of every layer from `other`'s slots `src` into this pool's slots `dst` (both [n])."""
        self.k[:, dst] = other.k[:, src]
        self.v[:, dst] = other.v[:, src]

    def flush(self) -> None:
        self.allocator.reset()


class PagedSequence:
    """One request's view of the pool: its page table and how many positions hold valid K/V."""

    def __init__(self, pool: KVPool, max_tokens: int):
        self.pool = pool
        self.page_size = pool.page_size
        max_pages = -(-max_tokens // self.page_size)
        self.page_table = torch.zeros(max_pages, dtype=torch.int64, device=pool.k.device)  # [max_pages]
        # host mirror of page_table: slot arithmetic and page freeing without device round trips
        self.pages_host = torch.zeros(max_pages, dtype=torch.int64)
        self.pages_np = self.pages_host.numpy()  # the same memory, for cheap host arithmetic
        self.num_pages = 0
        self.length = 0  # positions [0, length) hold K/V

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    def reserve(self, num_tokens: int) -> None:
        """Make sure positions [0, num_tokens) have pages."""
        need = -(-num_tokens // self.page_size)
        if need > self.page_table.numel():
            raise OutOfPagesError(f"{num_tokens} tokens exceed this request's page table "
                                  f"({self.page_table.numel()} pages of {self.page_size})")
        if need > self.num_pages:
            pages = torch.tensor(self.pool.allocator.alloc(need - self.num_pages), dtype=torch.int64)
            self.pages_host[self.num_pages:need] = pages
            self.page_table[self.num_pages:need].copy_(pages, non_blocking=True)
            self.num_pages = need

    def slots(self, start: int, end: int) -> Tensor:
        """Pool slots of positions [start, end), [end - start] int64, vectorised through the page table."""
        pos = torch.arange(start, end, device=self.page_table.device)
        return self.page_table[pos // self.page_size] * self.page_size + pos % self.page_size

    def slots_host(self, start: int, end: int) -> np.ndarray:
        """`slots` computed on the host from the mirror (int64 numpy array)."""
        pos = np.arange(start, end)
        return self.pages_np[pos // self.page_size] * self.page_size + pos % self.page_size

    def truncate(self, num_tokens: int) -> None:
        """Keep positions [0, num_tokens); pages past them go back to the pool."""
        keep = -(-num_tokens // self.page_size)
        if keep < self.num_pages:
            self.pool.allocator.free(self.pages_host[keep:self.num_pages].tolist())
            self.num_pages = keep
        self.length = min(self.length, num_tokens)

    def commit_path(self, base: int, path: list[int]) -> None:
        """After a tree verify written at positions base + node_index: keep the accepted `path` (node
        indices, root first) at positions base, base+1, ... and roll back every other node."""
        moved = [(base + node, base + depth) for depth, node in enumerate(path) if node != depth]
        if moved:
            src = torch.tensor([s for s, _ in moved], device=self.page_table.device)
            dst = torch.tensor([d for _, d in moved], device=self.page_table.device)
            self.pool.copy_slots(self._slots_at(src), self._slots_at(dst))
        self.length = base + len(path)
        self.truncate(self.length)

    def _slots_at(self, pos: Tensor) -> Tensor:
        return self.page_table[pos // self.page_size] * self.page_size + pos % self.page_size

    def release(self) -> None:
        self.truncate(0)
