"""Paged KV cache and the torch attention backend."""
from __future__ import annotations

import pytest
import torch

from workers.reference.attention import AttentionMetadata, create_attention_backend
from workers.reference.kv_cache import KVPool, OutOfPagesError, PageAllocator, PagedSequence


def make_pool(num_pages=8, page_size=4):
    return KVPool(num_layers=2, num_pages=num_pages, page_size=page_size, num_kv_heads=2, head_dim=4,
                  dtype=torch.float32)


def test_allocator_alloc_free_and_out_of_pages():
    alloc = PageAllocator(4)
    a = alloc.alloc(3)
    assert sorted(a) == [0, 1, 2] and alloc.num_free == 1
    with pytest.raises(OutOfPagesError, match="need 2 KV pages, 1 of 4 free"):
        alloc.alloc(2)
    alloc.free(a[:2])
    assert alloc.num_free == 3
    assert len(set(alloc.alloc(3)) | {a[2]}) == 4
    alloc.reset()
    assert alloc.num_free == 4


def test_slots_follow_scattered_page_tables():
    pool = make_pool(num_pages=8, page_size=4)
    a, b = PagedSequence(pool, 32), PagedSequence(pool, 32)
    for n in (4, 8, 12):  # interleave so each request's pages are not contiguous
        a.reserve(n)
        b.reserve(n)
    pages_a = a.page_table[:a.num_pages].tolist()
    assert pages_a == [0, 2, 4]
    expected = [pages_a[p // 4] * 4 + p % 4 for p in range(3, 11)]
    assert a.slots(3, 11).tolist() == expected
    assert set(a.slots(0, 12).tolist()).isdisjoint(b.slots(0, 12).tolist())
    # the host mirror (used by the CUDA-graph runner and for freeing pages) agrees with the device table
    assert a.slots_host(3, 11).tolist() == expected
    assert a.pages_host[:a.num_pages].tolist() == pages_a
    a.truncate(5)  # pages 2 and 4 go back, from the mirror
    b.truncate(0)
    a.reserve(16)  # and come back (in some order) to both copies
    assert a.pages_host[:a.num_pages].tolist() == a.page_table[:a.num_pages].tolist()
    assert a.slots_host(0, 16).tolist() == a.slots(0, 16).tolist()


def test_truncate_and_release_return_pages():
    pool = make_pool(num_pages=8, page_size=4)
    seq = PagedSequence(pool, 32)
    seq.reserve(13)
    seq.length = 13
    assert seq.num_pages == 4 and pool.allocator.num_free == 4
    seq.truncate(5)
    assert seq.num_pages == 2 and seq.length == 5 and pool.allocator.num_free == 6
    seq.release()
    assert pool.allocator.num_free == 8


def test_out_of_pages_and_page_table_limit():
    pool = make_pool(num_pages=2, page_size=4)
    seq = PagedSequence(pool, 64)
    with pytest.raises(OutOfPagesError):
        seq.reserve(9)
    small = PagedSequence(make_pool(), 8)
    with pytest.raises(OutOfPagesError, match="exceed this request's page table"):
        small.reserve(9)


@pytest.mark.parametrize("page_size", [1, 3])
def test_commit_path_keeps_accepted_branch_and_rolls_back(page_size):
    pool = make_pool(num_pages=32, page_size=page_size)
    seq = PagedSequence(pool, 32)
    base, nodes = 5, 6
    seq.reserve(base + nodes)
    seq.length = base + nodes
    slots = seq.slots(0, base + nodes)
    marks = torch.arange(base + nodes, dtype=torch.float32)
    pool.k[:, slots] = marks[None, :, None, None]  # K row of position p holds p everywhere
    pool.v[:, slots] = -marks[None, :, None, None]
    free_before = pool.allocator.num_free
    seq.commit_path(base, [0, 2, 5])  # root, then nodes 2 and 5 (stored at positions base+2, base+5)
    assert seq.length == base + 3
    kept = pool.k[0, seq.slots(0, seq.length), 0, 0].tolist()
    assert kept == [0, 1, 2, 3, 4, base + 0, base + 2, base + 5]
    assert pool.v[1, seq.slots(0, seq.length), 1, 3].tolist() == [-x for x in kept]
    assert seq.num_pages == -(-(base + 3) // page_size)
    assert pool.allocator.num_free == free_before + (-(-(base + nodes) // page_size) - seq.num_pages)


def naive_attention(q, keys, vals, visible, scale):
    # q [T, Hq, D], keys/vals [L, Hkv, D], visible [T, L]
    group = q.shape[1] // keys.shape[1]
    keys, vals = keys.repeat_interleave(group, 1), vals.repeat_interleave(group, 1)
    scores = torch.einsum("thd,lhd->htl", q, keys) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("htl,lhd->thd", scores.softmax(-1), vals)


def tree_case(T):
    if T == 4:  # a branching draft tree: grouped-matmul path
        return (torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool),
                torch.tensor([0, 1, 1, 2]))
    return torch.ones(T, T, dtype=torch.bool).tril(), torch.arange(T)  # a prefill chunk: SDPA path


@pytest.mark.parametrize("T", [4, 70])
@pytest.mark.parametrize("window", [None, 5])
def test_torch_backend_matches_naive_attention_through_pages(window, T):
    torch.manual_seed(0)
    pool = KVPool(num_layers=1, num_pages=64, page_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32)
    other, seq = PagedSequence(pool, 128), PagedSequence(pool, 128)
    P = 13
    for n in range(4, P + T + 4, 4):  # interleaved: scattered pages
        other.reserve(n)
        seq.reserve(n)
    prefix = seq.slots(0, P)
    pool.k[0, prefix] = torch.randn(P, 2, 8)
    pool.v[0, prefix] = torch.randn(P, 2, 8)
    tree, depths = tree_case(T)
    meta = AttentionMetadata(positions=P + depths, new_slots=seq.slots(P, P + T), prefix_slots=prefix,
                             prefix_len=P, tree_mask=tree, page_table=seq.page_table[:seq.num_pages], page_size=4)
    q, k_new, v_new = torch.randn(T, 4, 8), torch.randn(T, 2, 8), torch.randn(T, 2, 8)
    pool.store(0, meta.new_slots, k_new, v_new)  # as the model does before calling the backend
    out = create_attention_backend("torch").forward(q, k_new, v_new, pool.k[0], pool.v[0], meta,
                                                    scale=0.3, window=window)
    visible = torch.cat([torch.ones(T, P, dtype=torch.bool), tree], 1)
    if window is not None:
        kpos = torch.cat([torch.arange(P), P + depths])
        visible &= (P + depths)[:, None] - kpos[None] < window
    expected = naive_attention(q, torch.cat([pool.k[0, prefix], k_new]), torch.cat([pool.v[0, prefix], v_new]),
                               visible, 0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_specsweep_verify_needs_cuda_on_cpu():
    with pytest.raises(RuntimeError, match="needs CUDA \\+ specsweep_kernels.verify_attention"):
        create_attention_backend("specsweep_verify", "cpu")


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        create_attention_backend("nope")
