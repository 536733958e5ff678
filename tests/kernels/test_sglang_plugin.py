"""The specsweep_verify SGLang plugin on CPU: it loads, parses, subclasses the real Triton backend, ends a step at
every metadata hook SGLang has, and its metadata helpers match hand-built SGLang metadata; the layers of one forward
step share one plan launch (kernels through Triton's interpreter, tests/conftest.py, against the torch reference).
The backend's forward methods need a GPU and a model runner (not here): the tests drive what they call.

SGLang is imported in a child process (importing it patches transformers); the helpers need torch only.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specsweep_kernels import verify_attention as va
from specsweep_kernels.problems import Layout, make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.verify_config import _device_limits
from specsweep_kernels.sglang_plugin import (STEP_HOOKS, StepCache, causal_tree_mask, decode_page_table,
                                             decode_step_inputs, run_layer_attention, tree_mask_from_custom_mask,
                                             verify_step_inputs)

ROOT = Path(__file__).resolve().parents[2]
SGLANG_0_5_10 = Path(os.environ.get("SPECSWEEP_SGLANG_0_5_10", ROOT / ".venv" / "sglang-0.5.10"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GQA = Layout(4, 2, 32, 32, mla=False)

CHILD = r"""
import inspect, json, sys
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)
from sglang.srt.plugins import load_plugins
load_plugins()                                   # our entry point, as SGLang's launcher would call it
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.server_args import prepare_server_args
import specsweep_kernels.sglang_plugin as plugin

cls = plugin.backend_class()
def raises_not_implemented(fn):
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return "raise NotImplementedError" in src
base = [n for n, f in inspect.getmembers(AttentionBackend, inspect.isfunction) if raises_not_implemented(f)]
unimplemented = [n for n in base if getattr(cls, n) is getattr(AttentionBackend, n)]
by_triton = [n for n in base if getattr(TritonAttnBackend, n) is not getattr(AttentionBackend, n)]
sa = prepare_server_args(["--model-path", sys.argv[1], "--device", "cuda", "--attention-backend", "specsweep_verify",
                          "--page-size", "16"])
sa.resolve_once(); sa.check_server_args()
print(json.dumps({
    "registered": "specsweep_verify" in ATTENTION_BACKENDS,
    "factory_is_ours": ATTENTION_BACKENDS.get("specsweep_verify") is plugin.create_backend,
    "subclass": issubclass(cls, TritonAttnBackend) and issubclass(cls, AttentionBackend),
    "abstract": sorted(getattr(cls, "__abstractmethods__", ())),
    "not_implemented_in_base": base, "unimplemented": unimplemented, "implemented_by_triton": by_triton,
    "overrides": sorted(n for n in ("forward_extend", "forward_decode", "init_cuda_graph_state") if n in cls.__dict__),
    "step_hooks_wrapped": [n for n in plugin.STEP_HOOKS if n in cls.__dict__],
    "step_hooks_of_triton": [n for n in plugin.STEP_HOOKS if hasattr(TritonAttnBackend, n)],
    "parsed_backend": sa.attention_backend,
}))
"""


def test_plugin_loads_parses_and_implements_the_backend_interface(tmp_path):
    if importlib.util.find_spec("sglang") is None:
        if os.environ.get("CI"):
            pytest.fail("sglang is not installed (CI must run this: `make setup` installs it)")
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
        "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (ROOT, ROOT / "kernels")))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["registered"] and out["factory_is_ours"], "load_plugins() did not run our entry point " \
        "(re-run `pip install -e . --no-deps` after changing pyproject's entry points)"
    assert out["subclass"] and out["abstract"] == []
    assert {"forward_extend", "forward_decode"} <= set(out["not_implemented_in_base"])
    assert out["unimplemented"] == [m for m in out["not_implemented_in_base"] if m not in out["implemented_by_triton"]]
    assert "forward_extend" not in out["unimplemented"] and "forward_decode" not in out["unimplemented"]
    assert out["overrides"] == ["forward_decode", "forward_extend", "init_cuda_graph_state"]
    assert out["step_hooks_wrapped"] == out["step_hooks_of_triton"] == [
        "init_forward_metadata", "init_forward_metadata_out_graph", "init_forward_metadata_in_graph"]
    assert out["parsed_backend"] == "specsweep_verify"


def _flat_verify_mask(prefix_lens: list[int], trees: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's layout: per request a row-major [T, prefix + T] block, prefix columns all True."""
    blocks, indptr = [], [0]
    for prefix, tree in zip(prefix_lens, trees):
        t = tree.shape[0]
        block = torch.cat([torch.ones(t, prefix, dtype=torch.bool), tree], dim=1)
        blocks.append(block.flatten())
        indptr.append(indptr[-1] + block.numel())
    return torch.cat(blocks), torch.tensor(indptr, dtype=torch.int32)


def test_tree_mask_from_sglang_custom_mask():
    g = torch.Generator().manual_seed(0)
    t = 5
    trees = []
    for _ in range(3):  # random ancestor trees: parent of node i is some j < i
        m = torch.eye(t, dtype=torch.bool)
        for i in range(1, t):
            parent = int(torch.randint(0, i, (1,), generator=g))
            m[i] |= m[parent]
        trees.append(m)
    prefix_lens = [7, 0, 130]
    flat, indptr = _flat_verify_mask(prefix_lens, trees)
    got = tree_mask_from_custom_mask(flat, indptr, torch.tensor(prefix_lens, dtype=torch.int32), t)
    assert got.shape == (3, t, t) and got.dtype == torch.bool and got.is_contiguous()
    assert torch.equal(got, torch.stack(trees))


def test_causal_mask_and_decode_page_table():
    assert torch.equal(causal_tree_mask(2, 3, torch.device("cpu"))[1],
                       torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    req_to_token = torch.arange(40, dtype=torch.int32).view(4, 10) + 100  # 4 request slots x 10 positions
    table, prefix = decode_page_table(req_to_token, torch.tensor([2, 0]), torch.tensor([5, 9]))
    assert table.dtype == torch.int32 and torch.equal(table[0], req_to_token[2]) and torch.equal(table[1], req_to_token[0])
    assert prefix.tolist() == [4, 8]  # the token being decoded is k_new, not prefix


# ---------------------------------------------------------------- one plan per forward step


def _metadata_hooks(triton_backend_py: Path) -> set[str]:
    """The init_forward_metadata* methods that class TritonAttnBackend defines in that SGLang's source."""
    tree = ast.parse(triton_backend_py.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend")
    return {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith("init_forward_metadata")}


def test_every_metadata_hook_of_both_sglang_versions_ends_a_step():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not SGLANG_0_5_10.is_dir():
        if os.environ.get("CI"):
            pytest.fail("sglang 0.5.23 / 0.5.10 are not installed (CI must run this: `make setup` installs them)")
        pytest.skip("sglang 0.5.23 and 0.5.10 (unpacked) are needed, see docs/sglang.md")
    relative = Path("srt", "layers", "attention", "triton_backend.py")
    new = _metadata_hooks(Path(spec.submodule_search_locations[0]) / relative)
    old = _metadata_hooks(SGLANG_0_5_10 / "sglang" / relative)
    assert old == {"init_forward_metadata", "init_forward_metadata_capture_cuda_graph",
                   "init_forward_metadata_replay_cuda_graph"}
    assert {"init_forward_metadata", "init_forward_metadata_out_graph"} <= new
    assert old | new <= set(STEP_HOOKS)  # the 0.5.23 class check (in_graph, from the base) is in the child above


class ForwardBatch:
    """The object SGLang passes to every layer of a step: only its identity matters to StepCache."""


@pytest.fixture
def plan_launches(monkeypatch):
    """Every plan-kernel launch, from plan_verify or from a verify_attention call without plan= (the real
    launcher runs; this only counts)."""
    launches = []
    launch = va._launch_plan

    def counted(*args, **kwargs):
        launches.append(args[3])  # the batch
        return launch(*args, **kwargs)

    monkeypatch.setattr(va, "_launch_plan", counted)
    return launches


def _layer(problem, seed: int) -> dict:
    """One layer's tensors as SGLang passes them (flat q, k, v; the layer's pool) on the problem's pages."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    t = {name: torch.randn(x.shape, generator=g, device=DEVICE).to(x.dtype)
         for name, x in problem.tensors.items() if name != "tree_mask"}
    b, n, hq, d = t["q"].shape
    return dict(q=t["q"].reshape(b * n, hq * d), k=t["k_new"].reshape(b * n, -1, d), v=t["v_new"].reshape(b * n, -1, d),
                k_buffer=t["k_buffer"], v_buffer=t["v_buffer"], tensors=t)


def _reference(problem, layer: dict) -> torch.Tensor:
    b, n, hq, d = layer["tensors"]["q"].shape
    ref = verify_attention_reference(**layer["tensors"], tree_mask=problem.tensors["tree_mask"],
                                     sm_scale=problem.sm_scale, **problem.indptr_args())
    return ref.reshape(b * n, hq * d)


def _attend(step: StepCache, problem, layer: dict, workspace, inputs: dict) -> torch.Tensor:
    b, n, hq, d = layer["tensors"]["q"].shape
    return run_layer_attention(step, q=layer["q"], k=layer["k"], v=layer["v"], k_buffer=layer["k_buffer"],
                               v_buffer=layer["v_buffer"], num_q_heads=hq, num_kv_heads=layer["k_buffer"].shape[1],
                               head_dim=d, sm_scale=problem.sm_scale, batch=b, num_tokens=n, workspace=workspace,
                               inputs=inputs)


def _verify_inputs(step: StepCache, problem, made: list | None = None) -> dict:
    """What forward_extend does before the kernel: SGLang's verify metadata -> the step's shared inputs."""
    trees = list(problem.tensors["tree_mask"].cpu())
    flat, mask_indptr = _flat_verify_mask(problem.prefix_lens, trees)
    addressing = problem.indptr_args()
    b, n = problem.tensors["tree_mask"].shape[:2]

    def make():
        if made is not None:
            made.append(1)
        return verify_step_inputs(kv_indptr=addressing["kv_indptr"], kv_indices=addressing["kv_indices"].long(),
                                  custom_mask=flat.to(DEVICE), mask_indptr=mask_indptr.to(DEVICE), batch=b,
                                  num_tokens=n, device=torch.device(DEVICE))
    return step.inputs(("verify", n), make)


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 3e-3, f"relative error {err:.2e}"


def _workspace(layout: Layout, batch: int = 4):
    return va.allocate_workspace(max_batch=batch, max_tokens=4, num_q_heads=layout.num_q_heads,
                                 v_head_dim=layout.v_head_dim, device=DEVICE, max_splits=4)


def test_kernels_run_through_the_interpreter_on_cpu():
    assert DEVICE == "cuda" or va.kernel_is_interpreted(), "tests/conftest.py sets TRITON_INTERPRET=1 on CPU"


def test_layers_of_one_verify_step_share_one_plan_launch(plan_launches):
    prefix_lens = [37, 5, 130]
    problem = make_problem(layout=GQA, prefix_lens=prefix_lens, num_tokens=3, page_size=16, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=1)
    layers = [_layer(problem, seed) for seed in (10, 11, 12)]
    ws = _workspace(GQA)
    step, fb, made = StepCache(), ForwardBatch(), []
    outs, plans = [], []
    for layer in layers:
        step.enter(fb, capturing=False)
        inputs = _verify_inputs(step, problem, made)
        outs.append(_attend(step, problem, layer, ws, inputs))
        plans.append(step.plan_of(ws))
    assert made == [1] and plan_launches == [3], "one set of inputs and one plan launch for the step"
    assert plans[0] is plans[1] is plans[2] and plans[0].batch == 3
    items = plans[0].items.cpu()  # (b, lo, hi, 0): the plan covers each request's prefix exactly
    assert [int((items[items[:, 0] == b, 2] - items[items[:, 0] == b, 1]).sum()) for b in range(3)] == prefix_lens
    own_ws = _workspace(GQA)
    for layer, out in zip(layers, outs):
        _close(out, _reference(problem, layer))
        alone = problem.new_out()  # verify_attention planning for itself: the same result, bit for bit
        va.verify_attention(**layer["tensors"], tree_mask=problem.tensors["tree_mask"], sm_scale=problem.sm_scale,
                            out=alone, workspace=own_ws, **problem.indptr_args())
        assert torch.equal(out, alone.reshape(out.shape))
    assert plan_launches == [3] * 4  # the three calls without plan= launched one each


def test_a_new_step_plans_again(plan_launches):
    ws, step = _workspace(GQA), StepCache()
    first = make_problem(layout=GQA, prefix_lens=[37, 5, 130], num_tokens=3, page_size=1, dtype=torch.float16,
                         device=DEVICE, tree="random", seed=2)
    second = make_problem(layout=GQA, prefix_lens=[300, 1, 64], num_tokens=3, page_size=1, dtype=torch.float16,
                          device=DEVICE, tree="random", seed=3)

    def run_step(problem, fb, capturing=False):
        step.enter(fb, capturing=capturing)
        inputs = _verify_inputs(step, problem)
        for seed in (20, 21):  # two layers
            layer = _layer(problem, seed)
            _close(_attend(step, problem, layer, ws, inputs), _reference(problem, layer))
        return step.plan_of(ws), inputs["kv_indptr"]

    fb = ForwardBatch()
    steps = [run_step(first, ForwardBatch()), run_step(second, fb)]  # eager: a new ForwardBatch per step
    step.new_step()  # a metadata hook with the same batch object (0.5.23: in_graph before each warm-up)
    steps.append(run_step(first, fb))
    steps.append(run_step(second, fb, capturing=True))  # 0.5.10: the captured run follows the warm-ups, no hook
    assert plan_launches == [3] * 4, "one plan per step, none kept across steps"
    assert len({id(plan) for plan, _ in steps}) == len({id(indptr) for _, indptr in steps}) == 4


def test_batch_one_launches_no_plan(plan_launches):
    problem = make_problem(layout=GQA, prefix_lens=[77], num_tokens=4, page_size=16, dtype=torch.float16,
                           device=DEVICE, tree="random", seed=4)
    ws, step = _workspace(GQA), StepCache()
    step.enter(ForwardBatch(), capturing=False)
    inputs = _verify_inputs(step, problem)
    for seed in (30, 31):
        layer = _layer(problem, seed)
        _close(_attend(step, problem, layer, ws, inputs), _reference(problem, layer))
    assert plan_launches == [] and step.plan_of(ws) is None


def test_decode_step_plans_once_on_the_req_to_token_lengths(plan_launches):
    """Decode (T = 1): the prefix is the request's req_to_token row minus the token being decoded."""
    prefix_lens = [37, 0, 130]
    problem = make_problem(layout=GQA, prefix_lens=prefix_lens, num_tokens=1, page_size=1, dtype=torch.float16,
                           device=DEVICE, seed=5)
    pool_rows = torch.tensor([3, 0, 4], device=DEVICE)
    req_to_token = torch.full((5, 200), 10**6, dtype=torch.int32, device=DEVICE)  # never read past the prefix
    req_to_token[pool_rows] = torch.cat([problem.page_table, problem.page_table.new_zeros(3, 200 - 130)], 1)
    seq_lens = torch.tensor(prefix_lens, device=DEVICE) + 1
    ws, step, fb, made = _workspace(GQA), StepCache(), ForwardBatch(), []

    def make():
        made.append(1)
        return decode_step_inputs(req_to_token=req_to_token, req_pool_indices=pool_rows, seq_lens=seq_lens, batch=3,
                                  device=torch.device(DEVICE))
    for seed in (40, 41):
        step.enter(fb, capturing=False)
        inputs = step.inputs(("decode",), make)
        layer = _layer(problem, seed)
        _close(_attend(step, problem, layer, ws, inputs), _reference(problem, layer))
    assert inputs["prefix_lens"].tolist() == prefix_lens and made == [1] and plan_launches == [3]


def test_head_configs_plan_on_their_own_workspaces(plan_launches):
    mha = Layout(2, 2, 16, 16, mla=False)
    problems = {GQA: make_problem(layout=GQA, prefix_lens=[37, 5, 130], num_tokens=3, page_size=1,
                                  dtype=torch.float16, device=DEVICE, seed=6)}
    problems[mha] = make_problem(layout=mha, prefix_lens=[37, 5, 130], num_tokens=3, page_size=1,
                                 dtype=torch.float16, device=DEVICE, seed=6)
    workspaces = {lay: _workspace(lay) for lay in problems}  # the backend's (num_q_heads, v_head_dim) keys
    step, fb = StepCache(), ForwardBatch()
    step.enter(fb, capturing=False)
    inputs = _verify_inputs(step, problems[GQA])  # one step's metadata, both head configs read it
    kept = {}
    for i, lay in enumerate([GQA, mha, GQA, mha]):  # alternating layers
        layer = _layer(problems[lay], 50 + i)
        _close(_attend(step, problems[lay], layer, workspaces[lay], inputs), _reference(problems[lay], layer))
        kept.setdefault(lay, []).append(step.plan_of(workspaces[lay]))
    assert plan_launches == [3, 3]
    assert kept[GQA][0] is kept[GQA][1] and kept[mha][0] is kept[mha][1] and kept[GQA][0] is not kept[mha][0]


def test_one_workspace_keeps_one_plan_and_replans_for_another_split(plan_launches):
    """Layers with another KV-head count on the same (Hq, Dv) workspace get another num_splits: each switch plans
    again (a kept plan of the other split would be overwritten), and every layer stays right.

    The split is min(max_splits, SM slots // (KV heads x m-blocks)) (verify_config._num_splits), so 2 and 4 KV heads
    take different splits on any SM count once the workspace's cap is out of the way: with the CPU interpreter's 8
    SMs 4 and 2; on an H100's 132 SMs twice as many for GQA as for MHA, where max_splits=4 capped both at 4. The
    workspace here allows 16 x SMs splits (the plugin's default is 4 x SMs), and the test checks neither hit it."""
    mha4 = Layout(4, 4, 32, 32, mla=False)
    problems = {lay: make_problem(layout=lay, prefix_lens=[37, 5, 130], num_tokens=3, page_size=1,
                                  dtype=torch.float16, device=DEVICE, seed=7) for lay in (GQA, mha4)}
    sms = _device_limits(torch.device(DEVICE).index or 0)[1]
    ws = va.allocate_workspace(max_batch=4, max_tokens=4, num_q_heads=GQA.num_q_heads, v_head_dim=GQA.v_head_dim,
                               device=DEVICE, max_splits=16 * sms)
    step, fb = StepCache(), ForwardBatch()
    step.enter(fb, capturing=False)
    inputs = _verify_inputs(step, problems[GQA])
    splits = []
    for i, lay in enumerate([GQA, GQA, mha4, GQA]):
        layer = _layer(problems[lay], 60 + i)
        _close(_attend(step, problems[lay], layer, ws, inputs), _reference(problems[lay], layer))
        splits.append(step.plan_of(ws).num_splits)
    assert max(splits) < ws.max_splits, f"a layout hit the workspace's cap ({splits}, {sms} SMs): raise it"
    assert splits[0] == splits[1] == splits[3] != splits[2]
    assert plan_launches == [3, 3, 3]
