"""The rules of workers/sglang/startup_rules.py against SGLang 0.5.23's own code, on CPU.

SGLang's parser and resolver accept every one of these points (`prepare_server_args` + `resolve_once()` +
`check_server_args()`: the OURS_ONLY rules of tests/workers/sglang/test_argv.py); they fail later, at start-up.
Here the code that fails is run itself, in a child process (importing SGLang patches transformers):
- fa3: the registry's factory, with the device capability it reads set to each architecture;
- hpc_ops: the registry's factory, with and without speculation published;
- torch_native: its `forward_extend` on a TARGET_VERIFY-shaped batch (no extend_prefix_lens, as
  `ForwardBatch.init_new` leaves them for verify) and, as a control, on a prefill-shaped one.
Our verdict for each case comes from the rule functions themselves.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.run_config import RunConfig
from orchestrator.config.schema import register_configs, to_run_config
from orchestrator.config.settings import ClusterSettings
from workers.sglang.startup_rules import fa3_problems, speculation_problems

ROOT = Path(__file__).resolve().parents[3]

CHILD = r"""
import json, sys
from types import SimpleNamespace
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)
import torch
import sglang.srt.layers.attention.attention_registry as registry
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import prepare_server_args

def outcome(call, refused_type, words):
    try:
        call()
    except refused_type as e:
        if words in str(e):
            return "refused"
    except Exception:
        pass  # past the check: building the backend on a CPU fails for other reasons
    return "passes"

out = {"fa3": {}, "hpc_ops": {}}
for major in (8, 9, 10, 12):
    for mla in (False, True):
        registry.get_device_capability = lambda *a, _m=major, **k: (_m, 0)
        out["fa3"][f"{major}/{mla}"] = outcome(lambda: registry.ATTENTION_BACKENDS["fa3"](
            SimpleNamespace(use_mla_backend=mla)), AssertionError, "FlashAttention v3 Backend requires")

model = sys.argv[1]
for name, spec in (("none", []), ("NGRAM", ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5",
                                        "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"])):
    sa = prepare_server_args(["--model-path", model, "--device", "cuda", "--page-size", "64",
                              "--attention-backend", "hpc_ops", *spec])
    sa.resolve_once()
    publish(sa, role="scheduler")
    runner = SimpleNamespace(use_mla_backend=False, model_config=SimpleNamespace(is_encoder_decoder=False))
    out["hpc_ops"][name] = outcome(lambda: registry.ATTENTION_BACKENDS["hpc_ops"](runner), ValueError,
                                   "does not support speculative decoding")

b = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
k_buf, v_buf = torch.randn(64, 2, 32), torch.randn(64, 2, 32)
b.token_to_kv_pool = SimpleNamespace(set_kv_buffer=lambda *a, **k: None, get_key_buffer=lambda i: k_buf,
                                     get_value_buffer=lambda i: v_buf)
b.swa_out_cache_loc = None
b.req_to_token_pool = SimpleNamespace(req_to_token=torch.arange(64).view(2, 32))
layer = SimpleNamespace(qk_head_dim=32, v_head_dim=32, tp_q_head_num=4, tp_k_head_num=2, is_cross_attention=False,
                        attn_type=AttentionType.DECODER, layer_id=0, scaling=32 ** -0.5, sliding_window_size=-1)
q, kv = torch.randn(8, 4 * 32), torch.randn(8, 2 * 32)
def batch(mode, prefix, extend):
    return SimpleNamespace(forward_mode=mode, out_cache_loc=torch.arange(8), req_pool_indices=torch.tensor([0, 1]),
                           seq_lens=torch.tensor([10, 12]), extend_prefix_lens=prefix, extend_seq_lens=extend,
                           encoder_lens=None, encoder_out_cache_loc=None)
def torch_native(fb):
    try:
        b.forward_extend(q, kv, kv, layer, fb)
        return "ran"
    except Exception as e:
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        return f"{type(e).__name__}: {e} at line {tb.tb_lineno}"
out["torch_native"] = {
    "verify": torch_native(batch(ForwardMode.TARGET_VERIFY, None, None)),
    "prefill": torch_native(batch(ForwardMode.EXTEND, torch.tensor([6, 8]), torch.tensor([4, 4]))),
}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sglang_says(tmp_path_factory) -> dict:
    if importlib.util.find_spec("sglang") is None:
        if os.environ.get("CI"):
            pytest.fail("sglang is not installed (CI must run this: `make setup` installs it)")
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
        "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_config(*overrides: str) -> RunConfig:
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return to_run_config(cfg, overrides, cwd="/tmp")


def _config(**changes) -> RunConfig:
    rc = run_config("engine=sglang", "model=qwen3-8b", "attention=triton", "drafter=none")
    attention = {k: changes.pop(k) for k in list(changes) if k in ("backend", "speculative_attention_mode")}
    return dataclasses.replace(rc, attention=dataclasses.replace(rc.attention, **attention), **changes)


def _ours(rule, rc: RunConfig) -> str:
    found: list = []
    rule(rc, lambda *problem: found.append(problem))
    return "refused" if found else "passes"


def test_fa3_verdicts_equal_the_factorys_assertion(sglang_says):
    mla_model = run_config("model=deepseek-v3").model
    for arch, major in (("sm_86", 8), ("sm_90", 9), ("sm_100", 10), ("sm_120", 12)):
        for mla in (False, True):
            rc = _config(backend="fa3", cluster=ClusterSettings(accelerator=arch))
            if mla:
                rc = dataclasses.replace(rc, model=mla_model)
            assert _ours(fa3_problems, rc) == sglang_says["fa3"][f"{major}/{mla}"], (arch, mla)
    assert sglang_says["fa3"]["12/False"] == "refused" and sglang_says["fa3"]["9/True"] == "passes"


def test_hpc_ops_verdicts_equal_its_factory(sglang_says):
    ngram = run_config("engine=sglang", "model=qwen3-8b", "drafter=ngram").drafter
    assert sglang_says["hpc_ops"] == {"none": "passes", "NGRAM": "refused"}
    assert _ours(speculation_problems, _config(backend="hpc_ops")) == "passes"
    assert _ours(speculation_problems, dataclasses.replace(_config(backend="hpc_ops"), drafter=ngram)) == "refused"


def test_torch_native_fails_on_a_verify_batch_only(sglang_says):
    verify = sglang_says["torch_native"]["verify"]
    assert verify.startswith("AttributeError: 'NoneType' object has no attribute 'shape'") and verify.endswith(
        "at line 101"), verify  # torch_native_backend.py:101
    assert sglang_says["torch_native"]["prefill"] == "ran"
    ngram = run_config("engine=sglang", "model=qwen3-8b", "drafter=ngram").drafter
    assert _ours(speculation_problems, dataclasses.replace(_config(backend="torch_native"), drafter=ngram)) == "refused"
    assert _ours(speculation_problems, _config(backend="torch_native")) == "passes"


# ---------------------------------------------------------------- mem_fraction_static: SGLang's own resolution

# SGLang resolves mem_fraction_static from the GPU's memory (`handle_gpu_memory_settings`,
# sglang/srt/arg_groups/memory_hook.py:47-350). On this CPU host the child runs that resolution on our argv with the
# memory query answering each GPU size (memory_hook.py:78) and the prefill CUDA-graph backend SGLang picks on CUDA
# (`default_prefill_backend`, sglang/srt/model_executor/cuda_graph_config.py:119-123): what SGLang would run with.
MEMORY_CHILD = r"""
import json, sys
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)
import sglang.srt.arg_groups.memory_hook as memory_hook
import sglang.srt.model_executor.cuda_graph_config as graphs
from sglang.srt.server_args import prepare_server_args
graphs.default_prefill_backend = lambda: graphs.Backend.BREAKABLE
for line in sys.stdin:
    case = json.loads(line)
    memory_hook.get_device_memory_capacity = lambda device=None, _mib=case["mib"]: _mib
    server_args = prepare_server_args(case["argv"])
    server_args.resolve_once()
    print(json.dumps({"id": case["id"], "fraction": server_args.resolved_dict()["mem_fraction_static"]}), flush=True)
"""

MEMORY_POINTS = [  # (overrides, GiB): both attention kinds, every memory bracket, tp across the max-batch switch
    *[((f"model={m}", "drafter=none", f"tp_size={tp}"), gib)
      for m in ("qwen3-8b", "deepseek-v3") for tp in (1, 4, 8) for gib in (16, 24, 40, 80, 141, 192)],
    (("model=qwen3-8b", "drafter=ngram"), 80),
    (("model=qwen3-8b", "drafter=ngram", "engine.sglang.disable_cuda_graph=true"), 24),
    (("model=qwen3-8b", "drafter=none", "engine.sglang.cuda_graph_max_bs=64"), 80),
    (("model=qwen3-8b", "drafter=none", "engine.sglang.max_running_requests=16"), 80),
    (("model=qwen3-8b", "drafter=none", "engine.sglang.max_running_requests=16"), 24),
    (("model=qwen3-8b", "drafter=none", "engine.extra_args=[--chunked-prefill-size,1024]"), 24),
    (("model=deepseek-v3", "drafter=none", "tp_size=8", "engine.sglang.disable_cuda_graph=true"), 80),
]


def test_mem_fraction_static_is_the_one_sglang_resolves(tmp_path):
    """Our `mem_fraction_static` (the weights rule's budget) equals SGLang's own resolution on every point."""
    from orchestrator.config.plan import build_server
    from tests.workers.sglang.test_argv import _write_model
    from tools.composed_config import compose_run
    from workers.sglang.argv import build_sglang_argv
    from workers.sglang.startup_rules import mem_fraction_static

    if importlib.util.find_spec("sglang") is None:
        if os.environ.get("CI"):
            pytest.fail("sglang is not installed (CI must run this: `make setup` installs it)")
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    ours, cases = {}, []
    for i, (overrides, gib) in enumerate(MEMORY_POINTS):
        rc = compose_run("engine=sglang", "attention=triton", *overrides, f"cluster.gpu_memory_gib={gib}")
        local = dataclasses.replace(rc, model=dataclasses.replace(
            rc.model, path=_write_model(tmp_path / rc.model.name, rc.model)))
        ours[str(i)] = mem_fraction_static(rc, gib)[0]
        cases.append({"id": str(i), "mib": gib * 1024, "argv": build_sglang_argv(build_server(local), 30000)[3:]})
    proc = subprocess.run([sys.executable, "-c", MEMORY_CHILD], input="\n".join(map(json.dumps, cases)),
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    sglang = {r["id"]: r["fraction"] for r in map(json.loads, proc.stdout.strip().splitlines())}
    differ = {" ".join(MEMORY_POINTS[int(i)][0]) + f" @ {MEMORY_POINTS[int(i)][1]} GiB": (f, sglang[i])
              for i, f in ours.items() if f != sglang[i]}
    assert not differ, differ  # (ours, SGLang's)
    deepseek_tp8_80 = MEMORY_POINTS.index((("model=deepseek-v3", "drafter=none", "tp_size=8"), 80))
    assert sglang[str(deepseek_tp8_80)] == 0.8  # 64 GiB for 78.1 GiB of weights per GPU: refused
    assert len(set(sglang.values())) > 10  # the points span SGLang's brackets, not one figure
