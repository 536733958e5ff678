"""verify_attention against the torch reference, through Triton's interpreter on CPU (compiled on a GPU).

fp16 / fp32 only: the interpreter's bf16 loads are broken. Small shapes so the suite stays quick; MLA is shrunk to
Dk = 32 + 16 / Dv = 32 except for one case at the real 576 / 512.
"""
import math

import pytest
import torch

from specsweep_kernels.problems import Layout, make_problem
from tests.kernels.kernel_grid import grid, latin_square
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels import verify_attention as va
from specsweep_kernels.verify_config import _gluon_num_splits
from specsweep_kernels.verify_merge import merge_tiles
from specsweep_kernels.verify_attention import (VerifyConfig, allocate_workspace, kernel_is_interpreted, plan_verify,
                                                verify_attention, verify_launch_params)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GQA = Layout(4, 2, 32, 32, mla=False)
MHA = Layout(2, 2, 16, 16, mla=False)
MLA_SMALL = Layout(16, 1, 48, 32, mla=True)
TOL = {torch.float16: 3e-3, torch.float32: 1e-3}  # fp32 dots may run as tf32 on a GPU


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def check(problem, *, dtype=torch.float16, indptr=False, max_splits=4, **kw):
    args = problem.attention_args()
    addressing = problem.indptr_args() if indptr else problem.table_args()
    b, t, hq, _ = args["q"].shape
    out = problem.new_out()
    ws = allocate_workspace(max_batch=b, max_tokens=t, num_q_heads=hq, v_head_dim=problem.layout.v_head_dim,
                            device=DEVICE, max_splits=max_splits)
    ws.part_out.fill_(float("nan"))  # a partial the merge reads but no program wrote fails the check
    verify_attention(**args, **addressing, out=out, workspace=ws, **kw)
    ref = verify_attention_reference(**args, **addressing, v_head_dim=problem.layout.v_head_dim)
    assert not out.isnan().any(), "unwritten or NaN output"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"relative error {err:.2e}"
    return out


def test_runs_through_interpreter_on_cpu():
    assert DEVICE == "cuda" or kernel_is_interpreted(), "on CPU the kernel must run in Triton's interpreter"


@pytest.mark.parametrize("m_blocks,batch,max_splits,expected", [
    (1, 1, 528, 131),  # 16 heads T <= 2: the new-token program joins the first wave
    (2, 1, 528, 65),  # 128 heads T = 1: 2 x (65 + 1) = 132
    (4, 1, 528, 33),  # 16 heads T = 16: P - 1 would cost 1/33 of the prefix share; the second wave stays
    (32, 1, 528, 4),  # 128 heads T = 16
    (1, 4, 528, 132),  # batches run from a plan: one wave of items, unchanged
    (1, 1, 100, 100),  # a small workspace caps P; then everything fits in one wave anyway
    (1, 1, 1, 1),
])
def test_gluon_split_count(m_blocks, batch, max_splits, expected):
    """The Gluon MLA kernels' prefix programs per m-block on a 132-SM GPU (one 164-220 KB program per SM)."""
    assert _gluon_num_splits(m_blocks=m_blocks, batch=batch, slots=132, max_splits=max_splits) == expected


def test_dependent_launch_only_where_compiled_for_sm90():
    """The merge is a programmatic dependent launch only for compiled kernels on sm_90+ (griddepcontrol is PTX of
    sm_90; the interpreter has no inline PTX): never under the interpreter, and the kernels then take PDL=False."""
    if kernel_is_interpreted():
        assert not va._pdl_supported(0)
    else:
        assert va._pdl_supported(0) == (torch.cuda.get_device_capability(0)[0] >= 9)


# 27 points on a GPU; on CPU a Latin square's 9, which run every pair of layout x page size x (T, tree) once: MLA and
# GQA/MHA programs, token-paged and page-table addressing, T = 1 decode rows, tree masks and chains
_MATCH = [((a, p, s), (lay, page, *st), f"{st[0]}-{st[1]}-{page}-{name}") for a, (name, lay) in enumerate(
    {"gqa4-2": GQA, "mha": MHA, "mla-small": MLA_SMALL}.items()) for p, page in enumerate((1, 16, 64))
    for s, st in enumerate(((1, "chain"), (5, "random"), (8, "chain")))]


@pytest.mark.parametrize("layout,page_size,num_tokens,tree", grid(
    [m[1] for m in _MATCH], [m[2] for m in _MATCH], lambda n: latin_square((3, 3, 3))(_MATCH[n][0])))
def test_matches_reference(layout, page_size, num_tokens, tree):
    problem = make_problem(layout=layout, prefix_lens=[37, 130, 1], num_tokens=num_tokens, page_size=page_size,
                           dtype=torch.float16, device=DEVICE, tree=tree, seed=page_size * 100 + num_tokens)
    check(problem)


@pytest.mark.parametrize("page_size", [1, 16])
def test_sglang_indptr_addressing(page_size):
    problem = make_problem(layout=GQA, prefix_lens=[77, 3], num_tokens=4, page_size=page_size,
                           dtype=torch.float16, device=DEVICE, tree="random", seed=7)
    out_indptr = check(problem, indptr=True)
    out_table = check(problem)
    torch.testing.assert_close(out_indptr, out_table, rtol=0, atol=0)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gqa_head_dims(head_dim):
    problem = make_problem(layout=Layout(4, 1, head_dim, head_dim, mla=False), prefix_lens=[45], num_tokens=3,
                           page_size=16, dtype=torch.float16, device=DEVICE, tree="random", seed=head_dim)
    check(problem)


def test_mla_full_dims():
    problem = make_problem(layout=Layout(16, 1, 576, 512, mla=True), prefix_lens=[19, 40], num_tokens=2,
                           page_size=1, dtype=torch.float16, device=DEVICE, seed=3)
    check(problem)


def test_larger_tree_spans_several_row_blocks():
    problem = make_problem(layout=MLA_SMALL, prefix_lens=[50], num_tokens=20, page_size=1,
                           dtype=torch.float16, device=DEVICE, tree="random", seed=11)
    check(problem, config=VerifyConfig(block_m=64, block_n=16, num_warps=4, num_stages=1))


def test_empty_prefix_and_more_splits_than_tiles():
    problem = make_problem(layout=GQA, prefix_lens=[0, 5, 300], num_tokens=3, page_size=1,
                           dtype=torch.float16, device=DEVICE, tree="random", seed=5)
    check(problem, max_splits=16, num_splits=16)
    check(problem, num_splits=1)


# 8 points on a GPU; on CPU 4: each split count once (1: whole requests; 2, 5, 13: segments crossing request
# boundaries), alternating table and indptr addressing
_SPLITS = [(n, indptr) for indptr in (False, True) for n in (1, 2, 5, 13)]


@pytest.mark.parametrize("num_splits,indptr", grid(_SPLITS, [f"{'indptr' if i else 'table'}-{n}" for n, i in _SPLITS],
                                                   lambda k: _SPLITS[k][1] == (_SPLITS[k][0] in (2, 13))))
def test_ragged_batch_work_split(num_splits, indptr):
    """Prefix programs share the batch's tiles evenly: segments cross request boundaries, empty and one-token
    prefixes sit between long ones, and a program may cover several short requests."""
    problem = make_problem(layout=GQA, prefix_lens=[0, 300, 1, 17, 0, 129, 40], num_tokens=5, page_size=16,
                           dtype=torch.float16, device=DEVICE, tree="random", seed=31 + num_splits)
    check(problem, indptr=indptr, max_splits=16, num_splits=num_splits)



@pytest.mark.parametrize("prefix_lens,num_splits", [([4000, 3, 1, 2], 64), ([4800], 300)],
                         ids=["batch-long-request", "batch1-over-256-slices"])
def test_merge_folds_parts_over_several_chunks(prefix_lens, num_splits):
    """The merge's running (max, sum, acc) across chunks: a request with more parts than one BLOCK_SC load (the
    long request of a batch; batch 1 with more than 256 slices) merges to the reference."""
    problem = make_problem(layout=GQA, prefix_lens=prefix_lens, num_tokens=2, page_size=16, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=num_splits)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=len(prefix_lens), max_tokens=2, num_q_heads=GQA.num_q_heads,
                            v_head_dim=GQA.v_head_dim, device=DEVICE, max_splits=num_splits)
    tile = VerifyConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)  # small tiles: many parts, quick
    config, splits = verify_launch_params(**args, **addressing, out=problem.new_out(), workspace=ws,
                                          num_splits=num_splits, config=tile)
    block_sc, _ = merge_tiles(dv=GQA.v_head_dim, num_splits=splits, batch=len(prefix_lens))
    if len(prefix_lens) > 1:
        plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=splits, prefix_lens=problem.lens)
        parts = int(plan.req[0, 1])
    else:
        per_split = math.ceil(math.ceil(prefix_lens[0] / splits) / config.block_n) * config.block_n
        parts = math.ceil(prefix_lens[0] / per_split)
    assert parts > block_sc, f"request 0 has {parts} parts, one chunk takes {block_sc}: the loop is not exercised"
    check(problem, max_splits=num_splits, num_splits=num_splits, config=tile)


def test_merge_tiles():
    """Batch 1: every slice in one load up to 256; batches: about P / B + 1, at least 16; chunk <= 8192 floats."""
    assert merge_tiles(dv=512, num_splits=132, batch=1) == (256, 32)
    assert merge_tiles(dv=512, num_splits=4, batch=1) == (4, 512)
    assert merge_tiles(dv=512, num_splits=600, batch=1) == (256, 32)
    assert merge_tiles(dv=128, num_splits=66, batch=16) == (16, 128)
    assert merge_tiles(dv=512, num_splits=132, batch=4) == (64, 128)
    for p in (1, 7, 132, 528):
        for b in (1, 3, 64):
            sc, dv = merge_tiles(dv=512, num_splits=p, batch=b)
            assert sc * dv <= 8192 or dv == 16, (p, b, sc, dv)

def test_ragged_random_mix_mla_small():
    gen = torch.Generator().manual_seed(4)
    lens = torch.randint(0, 200, (9,), generator=gen).tolist() + [0, 1]
    problem = make_problem(layout=MLA_SMALL, prefix_lens=lens, num_tokens=3, page_size=1, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=41)
    check(problem, max_splits=8)
    check(problem, indptr=True, max_splits=8, num_splits=3)


def check_plan(lens, *, block_n, num_splits, indptr=False):
    """The plan's invariants: request b's items are contiguous, cover its tiles exactly once in order, never cross
    a request, each at most one chunk long; at most P + B items (the grid); programs take full items first, then
    the partial ones largest first, then the empty ones."""
    batch = len(lens)
    ws = allocate_workspace(max_batch=batch + 2, max_tokens=1, num_q_heads=1, v_head_dim=16, device=DEVICE,
                            max_splits=num_splits + 3)
    ws.items.fill_(-7)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if indptr:
        indptr_t = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
        indptr_t[1:] = torch.cumsum(lens_t, 0)
        plan = plan_verify(workspace=ws, block_n=block_n, num_splits=num_splits, kv_indptr=indptr_t)
    else:
        plan = plan_verify(workspace=ws, block_n=block_n, num_splits=num_splits, prefix_lens=lens_t)
    items, req, order = plan.items.tolist(), plan.req.tolist(), plan.order.tolist()
    assert len(items) == plan.num_items == num_splits + batch
    tiles = [-(-n // block_n) for n in lens]
    chunk = max(1, -(-sum(tiles) // num_splits))
    nonempty = [i for i, (_, lo, hi, _) in enumerate(items) if hi > lo]
    assert nonempty == list(range(len(nonempty))), "non-empty items first, in request order"
    assert all(it == [0, 0, 0, 0] for it in items[len(nonempty):]), "empty items are (0, 0, 0, 0)"
    for b, n in enumerate(lens):
        first, count = req[b]
        mine = items[first:first + count]
        assert all(it[0] == b and it[3] == 0 for it in mine), f"request {b}: items {mine} cross a request"
        assert [it[1] for it in mine] == [0, *(it[2] for it in mine[:-1])][:count], f"request {b}: gaps {mine}"
        assert (mine[-1][2] if mine else 0) == n, f"request {b}: items {mine} do not end at its prefix {n}"
        assert all(it[1] % block_n == 0 and 0 < it[2] - it[1] <= chunk * block_n for it in mine)
    assert sum(c for _, c in req) == len(nonempty)
    assert sorted(order) == list(range(plan.num_items)), "order is a permutation of the item slots"
    sizes = [-(-(items[i][2] - items[i][1]) // block_n) for i in order]
    ran = sizes[:len(nonempty)]
    assert ran == sorted(ran, reverse=True), f"programs do not take the largest items first: {ran}"
    assert sizes[len(nonempty):] == [0] * (plan.num_items - len(nonempty))
    return plan


@pytest.mark.parametrize("num_splits", [1, 2, 5, 13, 40])
@pytest.mark.parametrize("block_n", [16, 128])
def test_plan_items_cover_every_tile_once(num_splits, block_n):
    check_plan([0, 300, 1, 17, 0, 129, 40], block_n=block_n, num_splits=num_splits)
    check_plan([0, 300, 1, 17, 0, 129, 40], block_n=block_n, num_splits=num_splits, indptr=True)


def test_plan_batch_64_random_and_edge_mixes():
    gen = torch.Generator().manual_seed(64)
    lens = torch.exp(torch.rand(64, generator=gen, dtype=torch.float64) * 11).long().tolist()  # 1 .. 60k
    lens[5] = lens[40] = 0
    for num_splits in (16, 33, 120):
        plan = check_plan(lens, block_n=64, num_splits=num_splits)
        assert plan.req[5, 1].item() == plan.req[40, 1].item() == 0
    check_plan([0] * 9, block_n=16, num_splits=4)  # nothing to do: every item empty
    check_plan([100_000], block_n=64, num_splits=33)  # batch 1 through the plan
    check_plan([1, 1, 1, 1, 1, 1, 1, 1], block_n=128, num_splits=3)  # more requests than programs


def test_plan_reused_across_layers(monkeypatch):
    """An engine plans once per step; every layer's call reuses the plan (no planning launch) and is right."""
    lens = [0, 300, 1, 17, 129]
    layers = [make_problem(layout=GQA, prefix_lens=lens, num_tokens=5, page_size=16, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=90 + i) for i in range(2)]
    ws = allocate_workspace(max_batch=len(lens), max_tokens=5, num_q_heads=4, v_head_dim=32, device=DEVICE,
                            max_splits=6)
    first = {**layers[0].attention_args(), **layers[0].table_args(), "out": layers[0].new_out(), "workspace": ws}
    config, splits = verify_launch_params(**first)
    plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=splits, prefix_lens=first["prefix_lens"])
    launches = []
    real = va._launch_plan
    monkeypatch.setattr(va, "_launch_plan", lambda *a: launches.append(a) or real(*a))
    for problem in layers:
        args, addressing = problem.attention_args(), problem.table_args()
        out = verify_attention(**args, **addressing, out=problem.new_out(), workspace=ws, plan=plan)
        ref = verify_attention_reference(**args, **addressing, v_head_dim=32)
        assert rel_err(out, ref) < TOL[torch.float16]
    assert launches == [], "a call given plan= planned again"
    verify_attention(**first)  # without plan=: plans itself
    assert len(launches) == 1


def test_plan_accepted_at_batch_1():
    """Batch 1 runs its slices (faster than a plan there, a plan measured 1-14% slower on an H200, 2026-12-01); an engine's plan is accepted."""
    problem = make_problem(layout=MLA_SMALL, prefix_lens=[333], num_tokens=4, page_size=1, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=12)
    ws = allocate_workspace(max_batch=1, max_tokens=4, num_q_heads=16, v_head_dim=32, device=DEVICE, max_splits=5)
    args = {**problem.attention_args(), **problem.indptr_args(), "out": problem.new_out(), "workspace": ws}
    config, splits = verify_launch_params(**args)
    plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=splits, kv_indptr=args["kv_indptr"])
    verify_attention(**args, plan=plan)
    ref = verify_attention_reference(**{k: v for k, v in args.items() if k not in ("out", "workspace")},
                                     v_head_dim=32)
    assert rel_err(args["out"], ref) < TOL[torch.float16]


def test_plan_mismatch_is_refused_naming_what_differs():
    problem, args = bad_input_case()
    config, splits = verify_launch_params(**args)
    lens = args["prefix_lens"]
    other = allocate_workspace(max_batch=1, max_tokens=2, num_q_heads=4, v_head_dim=32, device=DEVICE, max_splits=2)
    cases = [
        (plan_verify(workspace=args["workspace"], block_n=config.block_n, num_splits=1 + splits % 2, prefix_lens=lens),
         f"plan: num_splits={1 + splits % 2} \\(this call: {splits}\\)"),
        (plan_verify(workspace=args["workspace"], block_n=2 * config.block_n, num_splits=splits, prefix_lens=lens),
         f"plan: block_n={2 * config.block_n} \\(this call: {config.block_n}\\)"),
        (plan_verify(workspace=other, block_n=config.block_n, num_splits=splits, prefix_lens=lens),
         "plan: made on another workspace"),
    ]
    big = allocate_workspace(max_batch=2, max_tokens=2, num_q_heads=4, v_head_dim=32, device=DEVICE, max_splits=2)
    two = torch.tensor([8, 3], dtype=torch.int32, device=DEVICE)
    cases.append((plan_verify(workspace=big, block_n=config.block_n, num_splits=splits, prefix_lens=two),
                  "plan: batch=2 \\(this call: 1\\), made on another workspace"))
    for plan, message in cases:
        with pytest.raises(ValueError, match=message):
            verify_attention(**args, plan=plan)
    with pytest.raises(ValueError, match="exactly one of them"):
        plan_verify(workspace=other, block_n=16, num_splits=1)
    with pytest.raises(TypeError, match="prefix_lens: dtype torch.int64; allowed: torch.int32"):
        plan_verify(workspace=other, block_n=16, num_splits=1, prefix_lens=lens.long())
    with pytest.raises(ValueError, match="prefix_lens: batch 2; allowed: 1..1"):
        plan_verify(workspace=other, block_n=16, num_splits=1, prefix_lens=two)
    with pytest.raises(ValueError, match="num_splits=3; allowed: 1..2"):
        plan_verify(workspace=other, block_n=16, num_splits=3, prefix_lens=lens)


def test_all_prefixes_empty():
    problem = make_problem(layout=GQA, prefix_lens=[0, 0, 0], num_tokens=7, page_size=4, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=17)
    check(problem)


def test_fp32():
    problem = make_problem(layout=GQA, prefix_lens=[61], num_tokens=6, page_size=16, dtype=torch.float32,
                           device=DEVICE, tree="random", seed=9)
    check(problem, dtype=torch.float32)


def test_reference_matches_dense_attention():
    problem = make_problem(layout=GQA, prefix_lens=[29], num_tokens=5, page_size=4, dtype=torch.float32,
                           device="cpu", tree="random", seed=13)
    args = problem.attention_args()
    ref = verify_attention_reference(**args, **problem.table_args())
    slots = problem.indptr_args()["kv_indices"].long()
    keys = torch.cat([args["k_buffer"][slots], args["k_new"][0]])  # [L+T, Hkv, D]
    vals = torch.cat([args["v_buffer"][slots], args["v_new"][0]])
    group = GQA.num_q_heads // GQA.num_kv_heads
    keys, vals = (x.repeat_interleave(group, 1).transpose(0, 1) for x in (keys, vals))
    mask = torch.cat([torch.ones(5, 29, dtype=torch.bool), args["tree_mask"][0]], dim=1)
    dense = torch.nn.functional.scaled_dot_product_attention(
        args["q"][0].transpose(0, 1), keys, vals, attn_mask=mask, scale=problem.sm_scale)
    torch.testing.assert_close(ref[0], dense.transpose(0, 1), rtol=1e-4, atol=1e-5)


def bad_input_case():
    problem = make_problem(layout=GQA, prefix_lens=[8], num_tokens=2, page_size=1, dtype=torch.float16,
                           device=DEVICE)
    ws = allocate_workspace(max_batch=1, max_tokens=2, num_q_heads=4, v_head_dim=32, device=DEVICE, max_splits=2)
    return problem, dict(**problem.attention_args(), **problem.table_args(), out=problem.new_out(), workspace=ws)


@pytest.mark.parametrize("change,error,message", [
    (lambda a: {"tree_mask": a["tree_mask"].int()}, TypeError, "tree_mask: dtype torch.int32; allowed: torch.bool"),
    (lambda a: {"q": a["q"][0]}, ValueError, r"q: shape \(2, 4, 32\); allowed: \[B, T, Hq, Dk\]"),
    (lambda a: {"k_new": a["k_new"].float()}, TypeError, "k_new: dtype torch.float32; allowed: q's dtype torch.float16"),
    (lambda a: {"v_new": None}, ValueError, r"v_new: None; allowed: \[B, T, Hkv, Dv\] = \[1, 2, 2, 32\]"),
    (lambda a: {"prefix_lens": a["prefix_lens"].long()}, TypeError, "prefix_lens: dtype torch.int64; allowed: torch.int32"),
    (lambda a: {"page_size": 0}, ValueError, "page_size=0; allowed: an integer >= 1"),
    (lambda a: {"page_table": None}, ValueError, "page_table=None, prefix_lens=.*kv_indptr \\+ kv_indices"),
    (lambda a: {"num_splits": 3}, ValueError, r"num_splits=3; allowed: None or 1..2"),
    (lambda a: {"workspace": allocate_workspace(max_batch=1, max_tokens=1, num_q_heads=4, v_head_dim=32, device=DEVICE)},
     ValueError, r"workspace too small: .*max_tokens=1 .*allocate_workspace\(max_batch>=1, max_tokens>=2"),
])
def test_rejects_bad_input_naming_the_argument(change, error, message):
    _, args = bad_input_case()
    with pytest.raises(error, match=message):
        verify_attention(**{**args, **change(args)})


def test_input_checks_survive_python_O(tmp_path):
    # asserts vanish under -O; the checks are explicit raises
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import torch\n"
            "from specsweep_kernels.problems import Layout, make_problem\n"
            "from specsweep_kernels.verify_attention import allocate_workspace, verify_attention\n"
            "assert False, 'asserts run'\n"
            "p = make_problem(layout=Layout(4, 2, 32, 32, mla=False), prefix_lens=[8], num_tokens=2, page_size=1,\n"
            "                 dtype=torch.float16, device='cpu')\n"
            "ws = allocate_workspace(max_batch=1, max_tokens=2, num_q_heads=4, v_head_dim=32, device='cpu', max_splits=2)\n"
            "args = {**p.attention_args(), **p.table_args(), 'out': p.new_out(), 'workspace': ws}\n"
            "try:\n"
            "    verify_attention(**{**args, 'tree_mask': args['tree_mask'].int()})\n"
            "except TypeError as e:\n"
            "    print('raised:', e)\n")
    proc = subprocess.run([sys.executable, "-O", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "kernels")])))
    assert proc.returncode == 0, proc.stderr
    assert "raised: tree_mask: dtype torch.int32; allowed: torch.bool" in proc.stdout


def test_kernel_layout_presets_and_their_kv_bytes():
    # the presets are the planner's (specsweep_common.spec.KERNEL_LAYOUTS), as real models' shapes
    from specsweep_kernels.problems import GQA_32_8, LAYOUTS, MLA_16

    assert set(LAYOUTS) == {"gqa", "mla", "gqa-small"}
    assert GQA_32_8.kv_bytes_per_token(2) == 8 * (128 + 128) * 2  # Qwen3-8B: 8 KV heads, K and V of 128, bf16
    assert MLA_16.kv_bytes_per_token(2) == 576 * 2  # DeepSeek-V3: one latent row of 512 + 64 rope, V read from it
    assert LAYOUTS["gqa-small"].kv_bytes_per_token(4) == 2 * (32 + 32) * 4


def test_impl_is_checked_before_any_work():
    """impl= names the kernel: a value outside auto / triton / gluon, the Gluon kernel where it cannot run (here:
    the CPU) and a Triton tile config with impl='gluon' are refused naming what was asked and what is allowed."""
    problem = make_problem(layout=MLA_SMALL, prefix_lens=[70], num_tokens=3, page_size=16, dtype=torch.float16,
                           device="cpu", seed=4)
    args, out = problem.attention_args(), problem.new_out()
    ws = allocate_workspace(max_batch=1, max_tokens=3, num_q_heads=MLA_SMALL.num_q_heads,
                            v_head_dim=MLA_SMALL.v_head_dim, device="cpu")
    cases = [(dict(impl="cuda"), "impl='cuda'; allowed: 'auto', 'triton', 'gluon'"),
             (dict(impl="gluon"), "impl='gluon' with MLA Dk=48 Dv=32 torch.float16 on cpu.*allowed: MLA"),
             (dict(impl="gluon", config=VerifyConfig(16, 16, 4, 1)), "impl='gluon'")]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            verify_attention(**args, **problem.table_args(), out=out, workspace=ws, **extra)
        assert out.isnan().all(), f"{extra}: output written before the refusal"
    verify_attention(**args, **problem.table_args(), out=out, workspace=ws, impl="triton")
    assert not out.isnan().any()
