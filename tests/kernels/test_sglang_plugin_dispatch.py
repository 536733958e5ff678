"""The specsweep_verify plugin is sized by the verify width SGLang resolves, and counts where each verify / decode
layer call ran, all the way to a run's metrics.

- Width: for every speculative algorithm, SGLang 0.5.23's own resolution (`prepare_server_args`, `resolve_once`,
  `publish`) of the argv we emit gives the plugin the verify width SGLang verifies with; the raw field the plugin
  used to read is None under DFLASH (a limit of 1: every verify on Triton).
- Counting: the backend's forward methods (SGLang's Triton parent stubbed out: no GPU here) count kernel calls and
  fallbacks by reason, CUDA-graph replays through the hook SGLang calls before them; in a "scheduler" process with
  PROMETHEUS_MULTIPROC_DIR set, read back in another process through SGLang's own /metrics mount
  (`add_prometheus_middleware`), parsed by workers.sglang.plugin_counter_deltas into the run's metrics.

SGLang runs in child processes (importing it patches transformers).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specsweep_kernels.sglang_plugin import DispatchCounts, verify_width
from specsweep_common import plugin_counters as pc
from workers.sglang.plugin_counter_deltas import dispatch_counts

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (ROOT, ROOT / "kernels")))}


def _require_sglang() -> None:
    if importlib.util.find_spec("sglang") is None:
        if os.environ.get("CI"):
            pytest.fail("sglang is not installed (CI must run this: `make setup` installs it)")
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")


def _child(code: str, *args: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env=env or ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- counting (pure)


def test_dispatch_counts_layers_records_steps_and_replays_them():
    sent: list[tuple] = []
    d = DispatchCounts(lambda *key_n: sent.append(key_n))
    d.replay("verify")  # a replay before any recorded step: counted as such, never as a kernel call
    assert sent == [("verify", "fallback", "replay_unrecorded", 1)]
    sent.clear()
    for layer in range(3):  # an eager verify step: 2 layers on the kernel, 1 handed to Triton
        d.layer("verify", layer, None if layer < 2 else "sliding_window")
    d.new_step()
    assert sent == [("verify", "kernel", "", 1)] * 2 + [("verify", "fallback", "sliding_window", 1)]
    sent.clear()
    d.replay("verify")  # a CUDA-graph replay: the step's layer calls, sent by the hook
    assert sorted(sent) == [("verify", "fallback", "sliding_window", 1), ("verify", "kernel", "", 2)]
    sent.clear()
    # 0.5.10 capture: two warm-ups and the captured run after one hook; a repeated layer starts a new step, and
    # the captured run (nothing executes) is recorded but not sent
    for capturing in (False, False, True):
        for layer in range(2):
            d.layer("decode", layer, None, capturing=capturing)
    d.new_step()
    assert sent == [("decode", "kernel", "", 1)] * 4
    assert d.recorded["decode"] == {("decode", "kernel", ""): 2}


def test_verify_width_takes_the_parent_triton_backends_resolved_width():
    class Parent:  # the attributes TritonAttnBackend sets (0.5.23 triton_backend.py:227,233; 0.5.10: :88)
        pass

    p = Parent()
    assert verify_width(p) == 1  # no speculation: decode, T = 1
    p.num_draft_tokens = None  # 0.5.23 without speculation / 0.5.23 raw DFLASH record
    p.target_verify_num_tokens_per_req = 16
    assert verify_width(p) == 16
    p.num_draft_tokens = 8  # 0.5.10: resolved in place
    del p.target_verify_num_tokens_per_req
    assert verify_width(p) == 8


# ---------------------------------------------------------------- width: SGLang's own resolution, every algorithm

WIDTH_CHILD = r"""
import json, sys
from types import SimpleNamespace
from workers.sglang.argcheck import prepare_sglang_imports, _register_plugins
prepare_sglang_imports(None)
_register_plugins()
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.runtime_context import get_spec, publish
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req
from specsweep_kernels.sglang_plugin import MAX_VERIFY_TOKENS, verify_width

out = {}
for case in json.loads(sys.argv[1]):
    sa = prepare_server_args(case["argv"])
    sa.resolve_once()
    sa.check_server_args()
    publish(sa, role="scheduler")  # what run_scheduler_process does before building the model runner
    algorithm = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    runner = SimpleNamespace(spec_algorithm=algorithm, is_draft_worker=False, server_args=sa)
    # the parent backend's two attributes, with triton_backend.py:227 and :233's own expressions
    parent = SimpleNamespace(num_draft_tokens=get_spec().speculative_num_draft_tokens,
                             target_verify_num_tokens_per_req=ModelRunner.decode_num_tokens_per_req(runner))
    out[case["id"]] = {
        "verify_width": resolve_num_tokens_per_req(phase="target_verify", spec_algorithm=algorithm),
        "resolved_draft_tokens": sa.resolved_dict()["speculative_num_draft_tokens"],
        "raw_field": sa.speculative_num_draft_tokens,
        "plugin_limit": min(MAX_VERIFY_TOKENS, verify_width(parent)),
    }
print(json.dumps(out))
"""

TREE = ("drafter.topk=4", "drafter.num_draft_tokens=8", "page_size=1")
WIDTH_CASES = {  # id: (overrides, the verify width the conf asks for)
    "NGRAM": (("drafter=ngram",), 5),
    "NGRAM tree": (("drafter=ngram", *TREE), 8),
    "STANDALONE": (("drafter=draft_model",), 5),
    "EAGLE": (("drafter=eagle3", "drafter.algorithm=EAGLE"), 4),
    "EAGLE3": (("drafter=eagle3",), 4),
    "EAGLE3 tree": (("drafter=eagle3", *TREE, "drafter.num_steps=3"), 8),
    "DFLASH": (("drafter=dflash",), 16),
}


def _width_argv(overrides: tuple[str, ...], model_dir: str) -> list[str]:
    from hydra import compose, initialize_config_module

    from orchestrator.config.plan import build_server
    from orchestrator.config.schema import register_configs, to_run_config
    from orchestrator.config.validate import validate_run
    from workers.sglang.argv import build_sglang_argv

    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=["engine=sglang", "model=qwen3-8b", "attention=specsweep_verify",
                                           "drafter.draft_model_path=org/draft", *overrides])
    rc = to_run_config(cfg, (), cwd=str(ROOT))
    assert validate_run(rc) == [], overrides
    rc = dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=model_dir),
                             drafter=dataclasses.replace(rc.drafter, draft_model_path=model_dir))
    return build_sglang_argv(build_server(rc), 30000)[3:]


def test_the_plugin_is_sized_by_the_verify_width_sglang_resolves_for_every_algorithm(tmp_path):
    _require_sglang()
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
        "vocab_size": 1024, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}))
    cases = [{"id": cid, "argv": _width_argv(o, str(tmp_path))} for cid, (o, _) in WIDTH_CASES.items()]
    got = _child(WIDTH_CHILD, json.dumps(cases))
    for cid, (_, width) in WIDTH_CASES.items():
        r = got[cid]
        assert r["verify_width"] == r["resolved_draft_tokens"] == width, (cid, r)
        assert r["plugin_limit"] == width, (cid, r)
    # what the plugin read before: the raw record field, None under DFLASH (its limit was 1)
    assert got["DFLASH"]["raw_field"] is None
    assert all(got[c]["raw_field"] == w for c, (_, w) in WIDTH_CASES.items() if c != "DFLASH")


def test_the_parent_attributes_are_set_as_the_width_test_assumes():
    """The stand-in above assigns the two attributes with the expressions the installed TritonAttnBackend uses."""
    _require_sglang()
    source = Path(importlib.util.find_spec("sglang").submodule_search_locations[0], "srt", "layers", "attention",
                  "triton_backend.py")
    cls = next(n for n in ast.parse(source.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend")
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assigned = {ast.unparse(a.targets[0]): ast.unparse(a.value) for a in ast.walk(init)
                if isinstance(a, ast.Assign) and len(a.targets) == 1}
    assert assigned["self.num_draft_tokens"] == "get_spec().speculative_num_draft_tokens"
    assert assigned["self.target_verify_num_tokens_per_req"] == "model_runner.decode_num_tokens_per_req()"


# ---------------------------------------------------------------- counting: scheduler process -> SGLang's /metrics

SCHEDULER_CHILD = r"""
import functools, json
from types import SimpleNamespace
import torch
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode

calls = []
def triton(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    calls.append(("triton", layer.layer_id))
    return q
TritonAttnBackend.forward_extend = triton  # the parent's attention and hooks need a GPU: stubbed, signatures kept
TritonAttnBackend.forward_decode = triton
for name in ("init_forward_metadata", "init_forward_metadata_out_graph", "init_forward_metadata_in_graph"):
    real = getattr(TritonAttnBackend, name)
    setattr(TritonAttnBackend, name, functools.wraps(real)(lambda self, *a, **k: None))

import specsweep_kernels.sglang_plugin as plugin
cls = plugin.backend_class()
b = cls.__new__(cls)  # what __init__ sets besides the parent's state
b._step_cache, b._dispatch = plugin.StepCache(), plugin.DispatchCounts(plugin.prometheus_sink)
b.use_mla, b.dcp_size, b._max_tokens = False, 1, 4
plugin.prometheus_counter()
b._save_kv = lambda *a: None
b._run = lambda q, k, v, layer, fb, n, inputs: calls.append(("kernel", layer.layer_id)) or q
b.forward_metadata = SimpleNamespace(kv_indptr=torch.tensor([0, 3, 6], dtype=torch.int32), kv_indices=torch.arange(6),
                                     custom_mask=None, mask_indptr=torch.zeros(3, dtype=torch.int64))
b.req_to_token = torch.arange(20, dtype=torch.int32).view(2, 10)
layers = [SimpleNamespace(layer_id=i, qk_head_dim=32, v_head_dim=32, sliding_window_size=(128 if i == 3 else -1))
          for i in range(4)]
class Batch(SimpleNamespace):  # ForwardBatch stand-in (StepCache keeps a weak reference to it)
    pass
def step(mode, tokens):
    fb = Batch(forward_mode=mode, batch_size=2, req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([5, 7]))
    b.init_forward_metadata(fb)
    q = torch.zeros(2 * tokens, 4 * 32)
    for layer in layers:
        (b.forward_extend if mode.is_target_verify() else b.forward_decode)(q, q, q, layer, fb)
    return fb
verify = step(ForwardMode.TARGET_VERIFY, 4)      # eager: 3 kernel, 1 sliding-window fallback
b.init_forward_metadata_out_graph(verify)        # two CUDA-graph replays of it
b.init_forward_metadata_out_graph(verify, in_capture=False)
b.init_forward_metadata_out_graph(verify, in_capture=True)  # a capture: no replay
decode = step(ForwardMode.DECODE, 1)             # eager decode
b.init_forward_metadata_out_graph(decode)        # one replay
step(ForwardMode.TARGET_VERIFY, 5)               # wider than the width it was sized for: every layer falls back
print(json.dumps({"calls": calls}))
"""

METRICS_CHILD = r"""
import json
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)
from fastapi import FastAPI
from starlette.testclient import TestClient
from sglang.srt.utils.common import add_prometheus_middleware
app = FastAPI()
add_prometheus_middleware(app)  # SGLang's /metrics: a MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR
print(json.dumps({"text": TestClient(app).get("/metrics").text}))
"""


def test_dispatch_counts_reach_the_run_through_sglangs_multiprocess_metrics(tmp_path):
    _require_sglang()
    env = {**ENV, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    before = dispatch_counts(_child(METRICS_CHILD, env=env)["text"])
    assert before == {}  # no scheduler has written yet
    calls = _child(SCHEDULER_CHILD, env=env)["calls"]
    assert calls[:4] == [["kernel", 0], ["kernel", 1], ["kernel", 2], ["triton", 3]]  # eager verify
    assert calls[4:8] == [["kernel", 0], ["kernel", 1], ["kernel", 2], ["triton", 3]]  # eager decode
    assert calls[8:] == [["triton", i] for i in range(4)]  # T = 5 > 4
    text = _child(METRICS_CHILD, env=env)["text"]
    assert pc.SAMPLE in text
    after = dispatch_counts(text)
    assert after == {("verify", "kernel", ""): 9.0, ("verify", "fallback", "sliding_window"): 3.0,
                     ("verify", "fallback", "tokens"): 4.0, ("decode", "kernel", ""): 6.0,
                     ("decode", "fallback", "sliding_window"): 2.0}
    m = pc.run_metrics(before, after)
    assert (m["plugin_kernel_calls"], m["plugin_verify_kernel_calls"], m["plugin_decode_kernel_calls"]) == (15, 9, 6)
    assert m["plugin_fallback_calls"] == 9 and m["plugin_fallback_calls.sliding_window"] == 5
    assert m["plugin_fallback_calls.tokens"] == 4  # the sliding-window layer's wide call: once, its first reason
    assert "fell back" in pc.unproven(m)
