"""The specsweep_verify SGLang plugin on CPU: it loads, parses, subclasses the real Triton backend, and its
metadata helpers match hand-built SGLang metadata. The forward paths need a GPU and a model runner (not here).

SGLang is imported in a child process (importing it patches transformers); the helpers need torch only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specsweep_kernels.sglang_plugin import causal_tree_mask, decode_page_table, tree_mask_from_custom_mask

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import inspect, json, sys
from workers.sglang_argcheck import _prepare_imports
_prepare_imports(None)
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
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["registered"] and out["factory_is_ours"], "load_plugins() did not run our entry point " \
        "(re-run `pip install -e . --no-deps` after changing pyproject's entry points)"
    assert out["subclass"] and out["abstract"] == []
    assert {"forward_extend", "forward_decode"} <= set(out["not_implemented_in_base"])
    assert out["unimplemented"] == [m for m in out["not_implemented_in_base"] if m not in out["implemented_by_triton"]]
    assert "forward_extend" not in out["unimplemented"] and "forward_decode" not in out["unimplemented"]
    assert out["overrides"] == ["forward_decode", "forward_extend", "init_cuda_graph_state"]
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
