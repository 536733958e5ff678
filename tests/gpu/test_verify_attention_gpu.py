"""verify_attention on a CUDA GPU in bf16: fresh random inputs, NaN-poisoned outputs, fp32 reference; graph replay."""
import functools

import pytest
import torch

from specsweep_kernels.problems import GQA_32_8, MLA_16, Layout, make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.verify_attention import allocate_workspace, plan_verify, verify_attention, verify_launch_params

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16_TOL = 1e-2
MLA_8 = Layout(8, 1, 576, 512, True)  # a Kimi / GLM-class MLA model at TP 8


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def captured(fn) -> torch.cuda.CUDAGraph:
    """fn run once (it compiles outside the capture), then captured into a CUDA graph on a side stream."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def run_and_check(problem, *, indptr=False, seed_offset=0, impl="auto"):
    args = problem.attention_args()
    addressing = problem.indptr_args() if indptr else problem.table_args()
    b, t, hq, _ = args["q"].shape
    ws = allocate_workspace(max_batch=b, max_tokens=t, num_q_heads=hq, v_head_dim=problem.layout.v_head_dim,
                            device="cuda")
    ref = verify_attention_reference(**args, **addressing, v_head_dim=problem.layout.v_head_dim)
    for _ in range(2):  # poisoned before each run
        out = problem.new_out()
        ws.part_out.fill_(float("nan"))  # a partial the merge reads but no program wrote fails too
        verify_attention(**args, **addressing, out=out, workspace=ws, impl=impl)
        torch.cuda.synchronize()
        assert not out.isnan().any(), "unwritten or NaN output"
        err = rel_err(out, ref)
        assert err < BF16_TOL, f"relative error {err:.2e}"


@pytest.mark.parametrize("layout", [GQA_32_8, MLA_16, Layout(8, 2, 64, 64, False), Layout(8, 4, 256, 256, False)],
                         ids=["gqa32-8-d128", "mla16", "gqa8-2-d64", "gqa8-4-d256"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_tokens,tree", [(1, "chain"), (8, "chain"), (13, "random"), (64, "random")])
def test_bf16_matches_fp32_reference(layout, page_size, num_tokens, tree):
    problem = make_problem(layout=layout, prefix_lens=[3001, 17, 1234], num_tokens=num_tokens, page_size=page_size,
                           dtype=torch.bfloat16, device="cuda", tree=tree, seed=1000 + page_size + num_tokens)
    run_and_check(problem)


@pytest.mark.parametrize("layout", [GQA_32_8, MLA_16], ids=["gqa", "mla"])
@pytest.mark.parametrize("indptr", [False, True], ids=["table", "indptr"])
def test_bf16_ragged_batch(layout, indptr):
    """A ragged batch: the prefix work is split by total tiles, so programs cross request boundaries."""
    problem = make_problem(layout=layout, prefix_lens=[1024, 65536, 3, 20011, 0, 777], num_tokens=7, page_size=16,
                           dtype=torch.bfloat16, device="cuda", tree="random", seed=55)
    run_and_check(problem, indptr=indptr)


SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("impl", ["triton", "gluon"])
@pytest.mark.parametrize("prefix_lens,num_tokens,page_size,indptr", [
    ([40_000], 8, 64, False), ([1024, 65536, 3, 20011, 0, 777], 7, 1, False), ([130], 1, 16, True),
    ([5000, 64, 1], 16, 16, True), ([0], 4, 16, False), ([70_001], 3, 1, True)])
def test_mla_each_kernel(impl, prefix_lens, num_tokens, page_size, indptr):
    """Both MLA kernels end to end (impl="auto" picks the Gluon one on sm_90, so the Triton one is forced here)."""
    if impl == "gluon" and not SM90:
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    problem = make_problem(layout=MLA_16, prefix_lens=prefix_lens, num_tokens=num_tokens, page_size=page_size,
                           dtype=torch.bfloat16, device="cuda", tree="random", seed=len(prefix_lens) + num_tokens)
    run_and_check(problem, indptr=indptr, impl=impl)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_mla_gluon_dtypes(dtype):
    """fp16 runs the Gluon kernel; fp32 (IEEE dots) stays on the Triton kernel under impl="auto"."""
    if not SM90:
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    problem = make_problem(layout=MLA_16, prefix_lens=[3001, 17], num_tokens=5, page_size=16, dtype=dtype,
                           device="cuda", tree="random", seed=9)
    run_and_check(problem)
    if dtype == torch.float32:
        with pytest.raises(ValueError, match="impl='gluon'.*allowed: MLA"):
            run_and_check(problem, impl="gluon")


def test_gluon_refused_for_gqa():
    problem = make_problem(layout=GQA_32_8, prefix_lens=[300], num_tokens=2, page_size=16, dtype=torch.bfloat16,
                           device="cuda", seed=3)
    with pytest.raises(ValueError, match="impl='gluon' with GQA Dk=128 Dv=128"):
        run_and_check(problem, impl="gluon")


def test_bf16_sglang_indptr_long_prefix():
    problem = make_problem(layout=MLA_16, prefix_lens=[40_000], num_tokens=8, page_size=1, dtype=torch.bfloat16,
                           device="cuda", tree="random", seed=77)
    run_and_check(problem, indptr=True)


@pytest.mark.parametrize("planned", [False, True], ids=["plan-per-call", "plan-once-two-layers"])
@pytest.mark.parametrize("layout", [GQA_32_8, MLA_16], ids=["gqa", "mla"])
def test_cuda_graph_capture_and_replay(layout, planned):
    """Capture once at one prefix length; replay after the prefix grows and the inputs change in place.
    plan-once-two-layers: the graph holds one plan_verify and two layers' calls reusing it (an engine's step)."""
    max_pages, page_size, num_tokens = 512, 16, 8
    problem = make_problem(layout=layout, prefix_lens=[1000, 4000], num_tokens=num_tokens, page_size=page_size,
                           dtype=torch.bfloat16, device="cuda", tree="random", spare_pages=2 * max_pages, seed=21)
    args = problem.attention_args()
    num_pages = args["k_buffer"].shape[0] // page_size
    table = torch.randperm(num_pages, device="cuda")[:2 * max_pages].view(2, max_pages).int()
    lens = torch.tensor([1000, 4000], dtype=torch.int32, device="cuda")
    ws = allocate_workspace(max_batch=2, max_tokens=num_tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device="cuda")
    addressing = dict(page_table=table, prefix_lens=lens, page_size=page_size)
    layers = [(args, problem.new_out())]
    if planned:
        layers.append(({**args, "q": torch.randn_like(args["q"])}, problem.new_out()))
        config, splits = verify_launch_params(**args, **addressing, out=layers[0][1], workspace=ws)

    def step():
        plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=splits, prefix_lens=lens) if planned else None
        for layer_args, out in layers:
            verify_attention(**layer_args, **addressing, out=out, workspace=ws, plan=plan)

    graph = captured(step)
    for lens_now in ([1000, 4000], [2345, 8191], [1, 7000], [0, 8000], [6000, 0]):
        lens.copy_(torch.tensor(lens_now, dtype=torch.int32))
        for layer_args, out in layers:
            layer_args["q"].copy_(torch.randn_like(layer_args["q"]))
            out.fill_(float("nan"))
        args["tree_mask"].copy_(torch.rand_like(args["tree_mask"], dtype=torch.float32) < 0.5)
        args["tree_mask"].diagonal(dim1=1, dim2=2).fill_(True)
        graph.replay()
        torch.cuda.synchronize()
        for layer_args, out in layers:
            ref = verify_attention_reference(**layer_args, **addressing, v_head_dim=layout.v_head_dim)
            assert not out.isnan().any()
            assert rel_err(out, ref) < BF16_TOL, f"replay at prefix {lens_now}: {rel_err(out, ref):.2e}"


def test_cuda_graph_batch_one_slices():
    """Batch 1 runs without a plan (equal slices computed in the kernel from the prefix length): one capture
    replays correctly as the prefix changes in place, on whichever kernel auto picks (Gluon for MLA on sm_90)."""
    page_size, num_tokens, max_pages = 16, 8, 2048
    problem = make_problem(layout=MLA_16, prefix_lens=[1000], num_tokens=num_tokens, page_size=page_size,
                           dtype=torch.bfloat16, device="cuda", tree="random", spare_pages=max_pages, seed=5)
    args = problem.attention_args()
    num_pages = args["k_buffer"].shape[0] // page_size
    table = torch.randperm(num_pages, device="cuda")[:max_pages].view(1, max_pages).int()
    lens = torch.tensor([1000], dtype=torch.int32, device="cuda")
    addressing = dict(page_table=table, prefix_lens=lens, page_size=page_size)
    ws = allocate_workspace(max_batch=1, max_tokens=num_tokens, num_q_heads=MLA_16.num_q_heads,
                            v_head_dim=MLA_16.v_head_dim, device="cuda")
    out = problem.new_out()
    graph = captured(lambda: verify_attention(**args, **addressing, out=out, workspace=ws))
    for n in (1000, 30_000, 1, 0, 64, 12_345):
        lens.fill_(n)
        args["q"].copy_(torch.randn_like(args["q"]))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = verify_attention_reference(**args, **addressing, v_head_dim=MLA_16.v_head_dim)
        assert not out.isnan().any()
        assert rel_err(out, ref) < BF16_TOL, f"replay at prefix {n}: {rel_err(out, ref):.2e}"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs sm_90 or newer")
@pytest.mark.parametrize("layout,prefix_lens,num_tokens,page_size", [
    (MLA_16, [70_001], 3, 16), (MLA_16, [5000, 64, 0, 1300], 3, 16), (MLA_16, [5000, 64, 0, 1300], 2, 16),
    (MLA_8, [70_001], 9, 1), (GQA_32_8, [5000, 64, 0, 1300], 3, 16)],
    ids=["mla-b1", "mla-b4", "mla-b4-narrow", "mla8-b1-remainder", "gqa-b4"])
def test_merge_as_dependent_launch_equals_normal_launch(layout, prefix_lens, num_tokens, page_size, monkeypatch):
    """On sm_90+ the merge is a programmatic dependent launch (PDL) of the attention kernel, its programs started
    before the attention kernel ends and held in griddepcontrol.wait, (batches, the Gluon kernel) the attention
    kernel one of the plan kernel the call launched (PLAN_PDL), and (batch 1, 8 heads x 9 tokens) the narrow kernel
    over the last 8 rows one of the 64-row kernel (REMAINDER_BESIDE), the merge one of the narrow kernel: replayed from a CUDA graph while the inputs and
    the prefix lengths change, it gives the same output bit for bit as normal launches (a merge reading partials
    before they are written, or an attention kernel reading the plan before it is written, would differ: both are
    poisoned before each replay)."""
    from specsweep_kernels import verify_attention as va
    from specsweep_kernels import verify_mla_sm90

    assert va._pdl_supported(torch.cuda.current_device())
    problem = make_problem(layout=layout, prefix_lens=prefix_lens, num_tokens=num_tokens, page_size=page_size,
                           dtype=torch.bfloat16, device="cuda", tree="random", seed=77)
    args, addressing = problem.attention_args(), problem.table_args()
    b, t, hq, _ = args["q"].shape
    ws = allocate_workspace(max_batch=b, max_tokens=t, num_q_heads=hq, v_head_dim=layout.v_head_dim, device="cuda")
    outs = {}
    assert va.PLAN_PDL
    monkeypatch.setattr(verify_mla_sm90, "REMAINDER_BESIDE", True)
    for pdl in (True, False):
        if not pdl:
            monkeypatch.setattr(va, "_pdl_supported", lambda index: False)
        out = problem.new_out()
        graph = captured(functools.partial(verify_attention, **args, **addressing, out=out, workspace=ws))
        gen = torch.Generator(device="cuda").manual_seed(3)
        results = []
        for step in range(3):
            args["q"].copy_(torch.randn(args["q"].shape, generator=gen, device="cuda"))
            addressing["prefix_lens"].copy_(torch.tensor([max(0, n - 997 * step) for n in prefix_lens]))
            out.fill_(float("nan"))
            ws.part_out.fill_(float("nan"))  # a merge that ran early would read these
            for plan_words in (ws.items, ws.req, ws.order):  # an attention kernel that ran early would read these
                plan_words.zero_()
            graph.replay()
            torch.cuda.synchronize()
            results.append(out.clone())
        outs[pdl] = results
    for with_pdl, without in zip(outs[True], outs[False]):
        assert not with_pdl.isnan().any()
        assert torch.equal(with_pdl, without)
    ref = verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim)
    assert rel_err(outs[True][-1], ref) < BF16_TOL


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Gluon MLA kernels need an sm_90 GPU")
@pytest.mark.parametrize("num_q_heads,num_tokens,prefix_len,page_size", [
    (8, 9, 185_000, 1), (8, 12, 70_001, 1), (16, 5, 9000, 1), (8, 17, 70_001, 1), (8, 9, 0, 1), (8, 9, 100, 1)])
def test_remainder_beside_matches_reference_and_the_padded_m_block(num_q_heads, num_tokens, prefix_len, page_size,
                                                                   monkeypatch):
    """Batch 1, page 1, rows past the full 64-row m-blocks <= 32 (8 heads x a 9 / 12 / 17-node tree, 16 heads x 5): the
    narrow kernel runs them beside the 64-row kernel. Under graph replay with the workspace poisoned, the output
    matches the fp32 reference, and matches the output of the padded 64-row m-block (REMAINDER_BESIDE off) to bf16
    rounding; empty and short prefixes too."""
    from specsweep_kernels import verify_mla_sm90

    monkeypatch.setattr(verify_mla_sm90, "REMAINDER_BESIDE", True)
    assert verify_mla_sm90.remainder_beside(num_tokens, num_q_heads, 1, page_size) > 0
    problem = make_problem(layout=Layout(num_q_heads, 1, 576, 512, True), prefix_lens=[prefix_len],
                           num_tokens=num_tokens, page_size=page_size, dtype=torch.bfloat16, device="cuda",
                           tree="random", seed=prefix_len + num_tokens)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=1, max_tokens=num_tokens, num_q_heads=num_q_heads, v_head_dim=512,
                            device="cuda")
    ref = verify_attention_reference(**args, **addressing, v_head_dim=512)
    outs = {}
    for beside in (True, False):
        monkeypatch.setattr(verify_mla_sm90, "REMAINDER_BESIDE", beside)
        out = problem.new_out()
        graph = captured(functools.partial(verify_attention, **args, **addressing, out=out, workspace=ws))
        out.fill_(float("nan"))
        ws.part_out.fill_(float("nan"))
        ws.part_lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any(), f"beside={beside}: rows left unwritten"
        assert rel_err(out, ref) < BF16_TOL, f"beside={beside}: {rel_err(out, ref):.2e}"
        outs[beside] = out.float()
    rows = num_tokens * num_q_heads
    rest = rows % 64
    last = outs[True].reshape(rows, 512)[rows - rest:]
    assert rel_err(last, outs[False].reshape(rows, 512)[rows - rest:]) < BF16_TOL
    assert torch.equal(outs[True].reshape(rows, 512)[:rows - rest], outs[False].reshape(rows, 512)[:rows - rest])
