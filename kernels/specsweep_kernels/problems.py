"""Random verify-attention problems (paged pool, scattered page table, tree masks) for tests and the bench."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specsweep_common.spec import KERNEL_LAYOUTS, kv_bytes_per_token

__all__ = ["Layout", "Problem", "make_problem", "chain_mask", "random_tree_mask", "GQA_32_8", "MLA_16", "LAYOUTS"]


@dataclass(frozen=True)
class Layout:
    num_q_heads: int
    num_kv_heads: int
    k_head_dim: int
    v_head_dim: int
    mla: bool  # one latent head; V = first v_head_dim dims of the K row

    @property
    def name(self) -> str:
        kind = "MLA" if self.mla else "GQA"
        return f"{kind} {self.num_q_heads}/{self.num_kv_heads} d{self.k_head_dim}/{self.v_head_dim}"

    def kv_bytes_per_token(self, elt: int) -> int:
        return kv_bytes_per_token(num_kv_heads=self.num_kv_heads, k_head_dim=self.k_head_dim,
                                  v_head_dim=self.v_head_dim, elt=elt, mla=self.mla)


# The named presets (`kernel.layout` of a sweep, `--layouts` of the bench): specsweep_common.spec.KERNEL_LAYOUTS,
# the same figures planning reads without torch.
LAYOUTS = {name: Layout(*preset) for name, preset in KERNEL_LAYOUTS.items()}
GQA_32_8 = LAYOUTS["gqa"]  # Qwen3-8B-like
MLA_16 = LAYOUTS["mla"]  # DeepSeek-V3 latent (512 + 64 rope), one latent head


def chain_mask(num_tokens: int) -> Tensor:
    """Causal chain: draft token i sees tokens 0..i."""
    return torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool))


def random_tree_mask(num_tokens: int, generator: torch.Generator) -> Tensor:
    """Branching tree: token 0 is the root, parent(i) uniform in 0..i-1; i sees its ancestors and itself."""
    mask = torch.eye(num_tokens, dtype=torch.bool)
    for i in range(1, num_tokens):
        parent = int(torch.randint(0, i, (1,), generator=generator))
        mask[i] = mask[parent]
        mask[i, i] = True
    return mask


@dataclass
class Problem:
    layout: Layout
    prefix_lens: list[int]
    page_size: int
    tensors: dict[str, Tensor] = field(repr=False)  # q, k_buffer, v_buffer, k_new, v_new, tree_mask
    page_table: Tensor = field(repr=False)  # [B, max_pages] int32, scattered pages
    lens: Tensor = field(repr=False)  # [B] int32

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.layout.k_head_dim)

    def table_args(self) -> dict:
        return dict(page_table=self.page_table, prefix_lens=self.lens, page_size=self.page_size)

    def indptr_args(self) -> dict:
        """SGLang's form: per-token slot ids (token-granular at any page size)."""
        from specsweep_kernels.reference import prefix_slots

        slots = prefix_slots(batch=len(self.prefix_lens), **self.table_args())
        indptr = torch.zeros(len(slots) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(torch.tensor([len(s) for s in slots]), 0)
        return dict(kv_indptr=indptr.to(self.lens.device), kv_indices=torch.cat(slots).int())

    def attention_args(self) -> dict:
        return dict(self.tensors, sm_scale=self.sm_scale)

    def new_out(self) -> Tensor:
        """Output buffer poisoned with NaN, so an unwritten element fails the check."""
        q = self.tensors["q"]
        b, t, hq, _ = q.shape
        return torch.full((b, t, hq, self.layout.v_head_dim), float("nan"), dtype=q.dtype, device=q.device)


def make_problem(
    *,
    layout: Layout,
    prefix_lens: list[int],
    num_tokens: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    tree: str = "chain",  # chain | random
    spare_pages: int = 8,
    seed: int = 0,
) -> Problem:
    """A pool with the prefixes on a random permutation of pages (plus unused pages), fresh random data."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    pages_per_req = [math.ceil(n / page_size) for n in prefix_lens]
    max_pages = max(1, max(pages_per_req))
    num_pages = sum(pages_per_req) + spare_pages
    perm = torch.randperm(num_pages, generator=gen)
    page_table = torch.zeros(batch, max_pages, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per_req):
        page_table[b, :n] = perm[used:used + n].int()
        used += n
    slots = num_pages * page_size
    lay, dev = layout, torch.device(device)

    gen_dev = torch.Generator(device=dev).manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen_dev, dtype=torch.float32, device=dev).to(dtype)

    tensors = dict(
        q=rand(batch, num_tokens, lay.num_q_heads, lay.k_head_dim),
        k_buffer=rand(slots, lay.num_kv_heads, lay.k_head_dim),
        v_buffer=None if lay.mla else rand(slots, lay.num_kv_heads, lay.v_head_dim),
        k_new=rand(batch, num_tokens, lay.num_kv_heads, lay.k_head_dim),
        v_new=None if lay.mla else rand(batch, num_tokens, lay.num_kv_heads, lay.v_head_dim),
    )
    masks = [chain_mask(num_tokens) if tree == "chain" else random_tree_mask(num_tokens, gen) for _ in range(batch)]
    tensors["tree_mask"] = torch.stack(masks).to(dev)
    return Problem(layout=lay, prefix_lens=list(prefix_lens), page_size=page_size, tensors=tensors,
                   page_table=page_table.to(dev), lens=torch.tensor(prefix_lens, dtype=torch.int32, device=dev))
