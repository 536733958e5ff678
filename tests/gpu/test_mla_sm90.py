"""The Gluon sm_90 MLA prefix kernel against an fp32 torch truth, item by item (H100 / H200 only)."""
import math

import pytest
import torch

from specsweep_kernels.problems import Layout, make_problem
from specsweep_kernels.reference import prefix_slots

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                 reason="needs an sm_90 GPU")]


def items_for(prefix_lens: list[int], per_item: int) -> torch.Tensor:
    """(b, lo, hi, 0) rows: each request's prefix cut into ranges of per_item positions (a multiple of 64)."""
    rows = [(b, lo, min(lo + per_item, n), 0) for b, n in enumerate(prefix_lens) for lo in range(0, n, per_item)]
    rows.append((0, 0, 0, 0))  # an empty item writes nothing
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def truth(problem, addressing, items, sm_scale):
    """Per item: fp32 softmax(q K^T) V over its positions and the log2-sum-exp, [items, T, Hq, 512] / [items, T, Hq]."""
    q, kv = problem.tensors["q"], problem.tensors["k_buffer"]
    slots = prefix_slots(batch=q.shape[0], **addressing)
    outs, lses = [], []
    for b, lo, hi, _ in items.tolist():
        k = kv[slots[b][lo:hi], 0].float()  # [n, 576]
        s = torch.einsum("thd,nd->thn", q[b].float(), k) * sm_scale
        outs.append(torch.softmax(s, -1) @ k[:, :512] if hi > lo else None)
        lses.append(torch.logsumexp(s, -1) * math.log2(math.e) if hi > lo else None)
    return outs, lses


@pytest.mark.parametrize("num_q_heads,num_tokens", [(16, 1), (16, 8), (16, 13), (64, 4), (128, 1)])
@pytest.mark.parametrize("page_size", [1, 64, 16])
@pytest.mark.parametrize("indptr", [False, True], ids=["table", "indptr"])
@pytest.mark.parametrize("variant", ["ws", "coop"])
def test_partials_match_fp32_truth(num_q_heads, num_tokens, page_size, indptr, variant):
    from specsweep_kernels.verify_mla_sm90 import mla_prefix_sm90

    if indptr and page_size != 16:
        pytest.skip("indptr form is per-token slots: one page size is enough")
    lens = [5000, 1, 64, 0, 700, 129, 192]  # 1 / 2 / 3 tiles: both warpgroups' first and last tiles
    problem = make_problem(layout=Layout(num_q_heads, 1, 576, 512, True), prefix_lens=lens, num_tokens=num_tokens,
                           page_size=page_size, dtype=torch.bfloat16, device="cuda", seed=num_q_heads + page_size)
    addressing = problem.indptr_args() if indptr else problem.table_args()
    items = items_for(lens, per_item=1024)
    n = items.shape[0]
    part_out = torch.full((n, num_tokens, num_q_heads, 512), float("nan"), device="cuda")
    part_lse = torch.full((n, num_tokens, num_q_heads), float("nan"), device="cuda")
    if indptr:
        indices, indptr_t, table_stride, ps = addressing["kv_indices"], addressing["kv_indptr"], 0, 1
    else:
        indices, indptr_t, table_stride, ps = (addressing["page_table"], addressing["prefix_lens"],
                                               addressing["page_table"].stride(0), page_size)
    mla_prefix_sm90(q=problem.tensors["q"], kv_buffer=problem.tensors["k_buffer"], indices=indices, indptr=indptr_t,
                    items=items, part_out=part_out, part_lse=part_lse, sm_scale=problem.sm_scale, page_size=ps,
                    use_indptr=indptr, page_table_stride=table_stride, num_items=n, variant=variant)
    torch.cuda.synchronize()
    outs, lses = truth(problem, addressing, items, problem.sm_scale)
    for i, (o, lse) in enumerate(zip(outs, lses)):
        if o is None:
            assert part_out[i].isnan().all(), f"item {i} is empty but was written"
            continue
        err = ((part_out[i] - o).norm() / o.norm()).item()
        assert err < 1e-2, f"item {i} {items[i].tolist()}: rel err {err:.2e}"
        assert (part_lse[i] - lse).abs().max().item() < 2e-2, f"item {i}: lse"
