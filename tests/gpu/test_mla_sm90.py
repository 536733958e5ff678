"""The Gluon sm_90 MLA kernel on its own: every work item's and every request's new-token partial against an fp32
torch truth (H100 / H200 only; verify_attention's end-to-end GPU tests run it through the plan and the merge)."""
import math

import pytest
import torch

from specsweep_kernels.problems import Layout, make_problem
from specsweep_kernels.reference import prefix_slots

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs an sm_90 GPU")]

LOG2E = math.log2(math.e)


def items_for(prefix_lens: list[int], per_item: int) -> torch.Tensor:
    """(b, lo, hi, 0) rows: each request's prefix cut into ranges of per_item positions (a multiple of 64), and
    one empty item, which must write nothing."""
    rows = [(b, lo, min(lo + per_item, n), 0) for b, n in enumerate(prefix_lens) for lo in range(0, n, per_item)]
    rows.insert(1, (0, 0, 0, 0))
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def softmax_truth(q, keys, sm_scale, visible=None):
    """fp32 softmax(q keys^T) V and log2-sum-exp; q [T, Hq, 576], keys [n, 576], visible [T, n] or None."""
    s = torch.einsum("thd,nd->thn", q.float(), keys.float()) * sm_scale
    if visible is not None:
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.softmax(s, -1) @ keys[:, :512].float(), torch.logsumexp(s, -1) * LOG2E


# rows = tokens x heads: <= 16 and <= 32 (20 padded to 32) run the swapped-product kernel, the rest the 64-row one
# (64 rows: 16 heads T = 4, 64 heads T = 1)
@pytest.mark.parametrize("num_q_heads,num_tokens", [(16, 1), (16, 2), (4, 5), (16, 4), (64, 1), (16, 8), (16, 13), (64, 4),
                                                     (128, 1)])
@pytest.mark.parametrize("page_size", [1, 64, 16])
@pytest.mark.parametrize("indptr", [False, True], ids=["table", "indptr"])
def test_partials_match_fp32_truth(num_q_heads, num_tokens, page_size, indptr):
    if indptr and page_size != 16:
        pytest.skip("indptr form is per-token slots: one page size is enough")
    check_item_partials(num_q_heads, num_tokens, page_size, indptr)


@pytest.mark.parametrize("num_q_heads,num_tokens", [(64, 1), (128, 1), (16, 4), (16, 8), (16, 13), (64, 4)])
def test_both_loop_orders_match_fp32_truth(num_q_heads, num_tokens, monkeypatch):
    """The 64-row kernel with the other order of its loop than under_s picks for this T (the first tile's
    rescale and P exchange before or after S of the second tile is issued): both orders at T = 1 and T > 1."""
    from specsweep_kernels import verify_mla_sm90

    picked = verify_mla_sm90.under_s(num_tokens)
    monkeypatch.setattr(verify_mla_sm90, "under_s", lambda num_tokens: not picked)
    check_item_partials(num_q_heads, num_tokens, 16, False)


def check_item_partials(num_q_heads: int, num_tokens: int, page_size: int, indptr: bool) -> None:
    """A plan-mode launch over six requests cut into items (one of them empty) and their new tokens: every item's
    and every request's new-token partial against the fp32 truth, and the empty item's slot untouched."""
    from specsweep_kernels.verify_mla_sm90 import launch_mla_sm90

    lens = [5000, 1, 64, 0, 700, 129]  # 1 / 2 / 3 tiles, an empty prefix, a partial last tile
    problem = make_problem(layout=Layout(num_q_heads, 1, 576, 512, True), prefix_lens=lens, num_tokens=num_tokens,
                           page_size=page_size, dtype=torch.bfloat16, device="cuda", tree="random",
                           seed=num_q_heads + page_size + num_tokens)
    t = problem.tensors
    addressing = problem.indptr_args() if indptr else problem.table_args()
    items = items_for(lens, per_item=1024)
    num_items, batch = items.shape[0], len(lens)
    part_out = torch.full((num_items + batch, num_tokens, num_q_heads, 512), float("nan"), device="cuda")
    part_lse = torch.full((num_items + batch, num_tokens, num_q_heads), float("nan"), device="cuda")
    if indptr:
        indices, lens_or_indptr, table_stride, ps = addressing["kv_indices"], addressing["kv_indptr"], 0, 1
    else:
        indices, lens_or_indptr, table_stride, ps = (addressing["page_table"], addressing["prefix_lens"],
                                                     addressing["page_table"].stride(0), page_size)
    order = torch.randperm(num_items, device="cuda").int()  # programs may run items in any order
    launch_mla_sm90(q=t["q"], kv_buffer=t["k_buffer"], k_new=t["k_new"], tree_mask=t["tree_mask"].view(torch.uint8),
                    indices=indices, kv_indptr=lens_or_indptr, prefix_lens=lens_or_indptr,
                    page_table_stride=table_stride, items=items, order=order, part_out=part_out,
                    part_lse=part_lse, num_items=num_items, sm_scale=problem.sm_scale, page_size=ps,
                    use_indptr=indptr)
    torch.cuda.synchronize()
    slots = prefix_slots(batch=batch, **addressing)
    for i, (b, lo, hi, _) in enumerate(items.tolist()):
        if hi == lo:
            assert part_out[i].isnan().all() and part_lse[i].isnan().all(), f"empty item {i} was written"
            continue
        out, lse = softmax_truth(t["q"][b], t["k_buffer"][slots[b][lo:hi], 0], problem.sm_scale)
        err = ((part_out[i] - out).norm() / out.norm()).item()
        assert err < 1e-2, f"item {i} {items[i].tolist()}: rel err {err:.2e}"
        assert (part_lse[i] - lse).abs().max().item() < 2e-2, f"item {i}: log-sum-exp"
    for b in range(batch):  # the new tokens under the tree mask
        out, lse = softmax_truth(t["q"][b], t["k_new"][b, :, 0], problem.sm_scale, visible=t["tree_mask"][b])
        err = ((part_out[num_items + b] - out).norm() / out.norm()).item()
        assert err < 1e-2, f"request {b}'s new tokens: rel err {err:.2e}"
        assert (part_lse[num_items + b] - lse).abs().max().item() < 2e-2, f"request {b}'s new tokens: log-sum-exp"


@pytest.mark.parametrize("prefix_len,num_splits", [(5000, 7), (64, 3), (1, 1), (0, 4), (131072, 132)])
@pytest.mark.parametrize("indptr", [False, True], ids=["table", "indptr"])
@pytest.mark.parametrize("num_q_heads,num_tokens", [(64, 5), (16, 1), (8, 9), (16, 5), (8, 12), (8, 17)])
@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "serial"])
def test_batch_one_slices_match_fp32_truth(prefix_len, num_splits, indptr, num_q_heads, num_tokens, pdl,
                                          monkeypatch):
    """single=True (batch 1, no plan): slice s = positions [s * per, (s + 1) * per) with per = the prefix / P
    rounded up to whole tiles, in slot s; slices past the prefix write nothing; the new tokens in slot P.
    8 heads x 9 / 12 / 17 tokens and 16 heads x 5: in the indptr form (page 1) the rows past the full 64-row
    m-blocks run on the narrow kernel beside the 64-row one (remainder_beside), launched as its programmatic
    dependent (pdl) or after it; in the page-table form (page 16) on a padded 64-row m-block."""
    from specsweep_kernels import verify_mla_sm90
    from specsweep_kernels.verify_mla_sm90 import BLOCK_N, launch_mla_sm90, remainder_beside

    monkeypatch.setattr(verify_mla_sm90, "REMAINDER_BESIDE", True)
    page_size = 16
    if not pdl and not remainder_beside(num_tokens, num_q_heads, 1, 1 if indptr else page_size):
        pytest.skip("pdl changes only how a remainder is launched")
    problem = make_problem(layout=Layout(num_q_heads, 1, 576, 512, True), prefix_lens=[prefix_len],
                           num_tokens=num_tokens, page_size=page_size, dtype=torch.bfloat16, device="cuda",
                           tree="random", seed=prefix_len + num_splits)
    t = problem.tensors
    addressing = problem.indptr_args() if indptr else problem.table_args()
    part_out = torch.full((num_splits + 1, num_tokens, num_q_heads, 512), float("nan"), device="cuda")
    part_lse = torch.full((num_splits + 1, num_tokens, num_q_heads), float("nan"), device="cuda")
    if indptr:
        indices, lens, table_stride, ps = addressing["kv_indices"], addressing["kv_indptr"], 0, 1
    else:
        indices, lens, table_stride, ps = (addressing["page_table"], addressing["prefix_lens"],
                                           addressing["page_table"].stride(0), page_size)
    unused = torch.zeros(num_splits + 1, 4, dtype=torch.int32, device="cuda")  # items / order: not read
    launch_mla_sm90(q=t["q"], kv_buffer=t["k_buffer"], k_new=t["k_new"], tree_mask=t["tree_mask"].view(torch.uint8),
                    indices=indices, kv_indptr=lens, prefix_lens=lens, page_table_stride=table_stride,
                    items=unused, order=unused[:, 0], part_out=part_out, part_lse=part_lse, num_items=num_splits,
                    sm_scale=problem.sm_scale, page_size=ps, use_indptr=indptr, single=True, pdl=pdl)
    torch.cuda.synchronize()
    slots = prefix_slots(batch=1, **addressing)[0]
    per = math.ceil(math.ceil(prefix_len / num_splits) / BLOCK_N) * BLOCK_N
    for s in range(num_splits):
        lo, hi = min(s * per, prefix_len), min((s + 1) * per, prefix_len)
        if hi == lo:
            assert part_out[s].isnan().all() and part_lse[s].isnan().all(), f"empty slice {s} was written"
            continue
        out, lse = softmax_truth(t["q"][0], t["k_buffer"][slots[lo:hi], 0], problem.sm_scale)
        err = ((part_out[s] - out).norm() / out.norm()).item()
        assert err < 1e-2, f"slice {s} [{lo}, {hi}): rel err {err:.2e}"
        assert (part_lse[s] - lse).abs().max().item() < 2e-2, f"slice {s}: log-sum-exp"
    out, lse = softmax_truth(t["q"][0], t["k_new"][0, :, 0], problem.sm_scale, visible=t["tree_mask"][0])
    err = ((part_out[num_splits] - out).norm() / out.norm()).item()
    assert err < 1e-2, f"new tokens: rel err {err:.2e}"
    assert (part_lse[num_splits] - lse).abs().max().item() < 2e-2, "new tokens: log-sum-exp"


@pytest.mark.parametrize("num_q_heads,num_tokens", [(16, 4), (128, 2), (16, 1)])
def test_partials_exact_where_the_scores_jump_mid_range(num_q_heads, num_tokens):
    """The online softmax where the running max moves mid-range: keys built so that half the heads' scores jump by
    10-15 nats at tiles 3, 6 and 7 (odd and even tiles of the 64-row kernel's two-tile loop) of one 16-tile item, and
    by nothing for the other heads, must give the fp32 truth for both halves (64 / 256 rows run the 64-row kernel,
    16 the swapped one). Written for the conditional rescaling of docs/measurements/2026-12-02-h200/notes.md item 33 (measured, not kept)."""
    from specsweep_kernels.verify_mla_sm90 import launch_mla_sm90

    prefix_len, page_size = 1500, 16
    problem = make_problem(layout=Layout(num_q_heads, 1, 576, 512, True), prefix_lens=[prefix_len],
                           num_tokens=num_tokens, page_size=page_size, dtype=torch.bfloat16, device="cuda",
                           tree="chain", seed=7)
    t = problem.tensors
    gen = torch.Generator(device="cuda").manual_seed(3)
    u = torch.randn(576, device="cuda", generator=gen)
    u = u / u.norm()
    jumping = (torch.arange(num_q_heads, device="cuda") % 2 == 0).float()  # even heads see the jumps
    t["q"] += (jumping[None, None, :, None] * u * 24).to(t["q"].dtype)  # q.u / sqrt(576) = 1 nat per unit step
    slots = prefix_slots(batch=1, **problem.table_args())[0]
    tile = torch.arange(prefix_len, device="cuda") // 64
    step = torch.zeros(prefix_len, device="cuda")
    for first_tile, height in [(3, 10.0), (6, 25.0), (7, 40.0)]:
        step[tile >= first_tile] = height
    t["k_buffer"][slots.long(), 0] += (step[:, None] * u).to(t["k_buffer"].dtype)
    items = items_for([prefix_len], per_item=1024)
    num_items = items.shape[0]
    part_out = torch.full((num_items + 1, num_tokens, num_q_heads, 512), float("nan"), device="cuda")
    part_lse = torch.full((num_items + 1, num_tokens, num_q_heads), float("nan"), device="cuda")
    launch_mla_sm90(q=t["q"], kv_buffer=t["k_buffer"], k_new=t["k_new"], tree_mask=t["tree_mask"].view(torch.uint8),
                    indices=problem.page_table, kv_indptr=problem.lens, prefix_lens=problem.lens,
                    page_table_stride=problem.page_table.stride(0), items=items,
                    order=torch.arange(num_items, device="cuda", dtype=torch.int32), part_out=part_out,
                    part_lse=part_lse, num_items=num_items, sm_scale=problem.sm_scale, page_size=page_size,
                    use_indptr=False)
    torch.cuda.synchronize()
    for i, (_, lo, hi, _) in enumerate(items.tolist()):
        if hi == lo:
            continue
        out, lse = softmax_truth(t["q"][0], t["k_buffer"][slots[lo:hi], 0], problem.sm_scale)
        for heads, name in [(slice(0, None, 2), "jumping"), (slice(1, None, 2), "flat")]:
            err = ((part_out[i][:, heads] - out[:, heads]).norm() / out[:, heads].norm()).item()
            assert err < 1e-2, f"item {i} [{lo}, {hi}), {name} heads: rel err {err:.2e}"
            assert (part_lse[i][:, heads] - lse[:, heads]).abs().max().item() < 2e-2, f"item {i}, {name} heads: lse"
