"""Every SGLang launch argv our builder emits for the conf/ tree, checked by SGLang's own parser.

The grid: engine=sglang x every conf/model SGLang can load x conf/drafter x conf/attention plus split-backend
variants (ATTENTION_VARIANTS), composed through Hydra and our schema, x a tree variant (topk 4) and a draft-window
variant of each drafter, x page sizes 1/16/64 (x drafters needing a draft path without one, for 0.5.23).
- 0.5.23 (the installed wheel), every point, accepted or not: `prepare_server_args` + `resolve_once()` +
  `check_server_args()`. Our verdict must be SGLang's: a point we accept passes and resolves (`resolved_dict()`,
  what /server_info reports) to `workers.sglang.argv.expected_server_args`; a point we refuse is refused by SGLang,
  or resolved to something else than it asks (a silent rewrite), or breaks one of the OURS_ONLY rules the parser
  cannot see (each with the reason the run would not measure what its labels say).
- 0.5.10 (`pip install --no-deps --target .venv/sglang-0.5.10 sglang==0.5.10`), the points we accept:
  `prepare_server_args`, which in 0.5.10 runs the whole `__post_init__` validation.
SGLang runs in a child process (workers/sglang/argcheck.py) with `--device cuda` (our argv carries it) and
model directories holding a hand-written config.json (SGLang's `prepare_server_args`, `sglang/srt/server_args.py:668`, needs no GPU).
SGLang's answer for a point whose inputs are unchanged since the last run in this checkout comes from pytest's cache
(tests/workers/sglang/argcache.py); a clean checkout asks SGLang about every point.

BAD lists combinations our validation must reject before SGLang sees them; where SGLang itself rejects them on
a CPU host too, the test checks that it does (so the rule is not ours alone).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import pytest
from orchestrator.config.plan import build_server
from specsweep_common.spec import Algorithm, AttentionKind, ModelSpec
from tests.workers.sglang.argcache import check_argv
from tools.composed_config import compose_run
from orchestrator.config.validate import validate_run
from specsweep_common.builtin_models import REFERENCE_MODEL_PATHS
from workers.registry import adapter_for
from workers.sglang.argv import (LONGER_CONTEXT_ENV, SERVER_ARG_KEYS, build_sglang_argv, expected_server_args,
                            reported_server_args, sglang_env)

ROOT = Path(__file__).resolve().parents[3]
SGLANG_0_5_10 = Path(os.environ.get("SPECSWEEP_SGLANG_0_5_10", ROOT / ".venv" / "sglang-0.5.10"))
PAGE_SIZES = (1, 16, 64)
TREE = ("drafter.topk=4", "drafter.num_draft_tokens=8")


def _require(available: bool, why: str) -> None:
    if not available:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must run this: `make setup` installs it)")
        pytest.skip(why)


def _sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


# ---------------------------------------------------------------- the grid, from conf/


def _names(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


def _write_model(directory: Path, m: ModelSpec) -> str:
    """A config.json with the conf model's shape; SGLang reads nothing else while parsing/resolving."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"vocab_size": 1024, "hidden_size": m.hidden_size, "intermediate_size": 4 * m.hidden_size,
           "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_q_heads,
           "max_position_embeddings": m.max_context_len, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
           "torch_dtype": m.dtype, "tie_word_embeddings": False}
    if m.attention_kind is AttentionKind.MLA:
        rope = m.head_dim - m.v_head_dim
        cfg.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", num_key_value_heads=m.num_q_heads,
                   kv_lora_rank=m.v_head_dim, qk_rope_head_dim=rope, qk_nope_head_dim=128, v_head_dim=128,
                   q_lora_rank=1536, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                   n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                   topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True)
    else:
        cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=m.num_kv_heads,
                   head_dim=m.head_dim)
    (directory / "config.json").write_text(json.dumps(cfg))
    return str(directory)


def _compose(overrides: list[str]):
    return compose_run(*overrides, cwd=str(ROOT))  # Hydra composes each distinct overrides once per process


# attention variants beyond conf/attention: the kernel as the decode half of a split, with and without the mode
# that makes it verify
ATTENTION_VARIANTS = {
    "split-decode-ours": ["attention=triton", "attention.decode_backend=specsweep_verify"],
    "split-decode-ours-mode-decode": ["attention=triton", "attention.decode_backend=specsweep_verify",
                                      "attention.speculative_attention_mode=decode"],
    "split-prefill-ours-mode-decode": ["attention=specsweep_verify", "attention.decode_backend=triton",
                                       "attention.speculative_attention_mode=decode"],
}


@dataclasses.dataclass
class Point:
    name: str
    version: str
    argv: list[str]  # without interpreter and module
    env: dict[str, str]
    problems: list  # our validation's Problems; empty = accepted
    server: object  # ServerSpec, with local model dirs


# SGLang's CPU backend (`--device cpu`, engine=sglang_cpu): its rules are checked against SGLang 0.5.18 live,
# tests/workers/sglang_live/test_live_rules.py::test_cpu_verdict_equals_sglang_0_5_18
CPU_ONLY_ATTENTION = ("intel_amx",)


def _attention_choices() -> list[tuple[str, list[str]]]:
    return [(a, [f"attention={a}"]) for a in _names("attention") if a not in CPU_ONLY_ATTENTION] \
        + list(ATTENTION_VARIANTS.items())


def _grid(tmp: Path, versions=("0.5.23", "0.5.10"), *, null_paths: bool = False) -> list[Point]:
    """Every point of engine=sglang x conf/model x conf/drafter x attention (conf/ + ATTENTION_VARIANTS) x a tree
    and a draft-window variant of each drafter x page size x version, accepted or not. Models built into the
    reference engine are left out (SGLang cannot load them: our validation refuses them by name).
    null_paths: also the drafters that need a draft path without one."""
    points, dirs = [], {}
    models = [m for m in _names("model")
              if _compose(["engine=sglang", f"model={m}"]).model.path not in REFERENCE_MODEL_PATHS]
    for model in models:
        for drafter in _names("drafter"):
            for attention, attn_overrides in _attention_choices():
                base = ["engine=sglang", f"model={model}", f"drafter={drafter}", *attn_overrides]
                rc0 = _compose(base)
                variants = [base]
                if rc0.drafter.algorithm not in (Algorithm.NONE, Algorithm.DFLASH):
                    variants.append(base + list(TREE) + (["drafter.num_steps=3"] if rc0.drafter.algorithm
                                                         is not Algorithm.NGRAM else []))
                if rc0.drafter.algorithm is not Algorithm.NONE:
                    variants.append(base + ["drafter.draft_window_size=64"])
                for overrides in variants:
                    rc = _fitting(_compose(overrides))
                    for version in versions:
                        for page in PAGE_SIZES:
                            point = dataclasses.replace(rc, page_size=page, engine=dataclasses.replace(
                                rc.engine, version=version))
                            paths = [None, "org/draft-model"] if null_paths else ["org/draft-model"]
                            needs_path = rc.drafter.draft_model_path is None and rc.drafter.algorithm in (
                                Algorithm.EAGLE3, Algorithm.STANDALONE, Algorithm.DFLASH)
                            for path in paths if needs_path else [rc.drafter.draft_model_path]:
                                p = dataclasses.replace(point, drafter=dataclasses.replace(
                                    point.drafter, draft_model_path=path))
                                name = (f"{version} page={page} {attention} " + " ".join(overrides[1:]) +
                                        (" no-draft-path" if needs_path and path is None else ""))
                                points.append(_point(p, name, version, tmp, dirs))
    return points


def _fitting(rc):
    """At the smallest power-of-two tp_size whose weights fit a GPU (deepseek-v3: 4; workers/sglang/startup_rules.py),
    so that the grid checks SGLang's verdict on the model and not our weights rule."""
    return dataclasses.replace(rc, tp_size=max(rc.tp_size, 1 << (adapter_for(rc.engine.kind).resource_estimate(rc).min_tp_size - 1).bit_length()))


def _point(rc, name: str, version: str, tmp: Path, dirs: dict) -> Point:
    problems = validate_run(rc)
    # local config.json dirs stand in for the HF ids of conf/model
    m = rc.model
    target = dirs.setdefault(m.name, _write_model(tmp / m.name, m))
    draft = target if rc.drafter.is_oracle else dirs.setdefault(
        "draft-" + m.name, _write_model(tmp / ("draft-" + m.name), dataclasses.replace(m, num_layers=1)))
    local = dataclasses.replace(rc, model=dataclasses.replace(m, path=target))
    if local.drafter.draft_model_path:
        local = dataclasses.replace(local, drafter=dataclasses.replace(local.drafter, draft_model_path=draft))
    server = build_server(local)
    return Point(name, version, build_sglang_argv(server, 30000)[3:], sglang_env(server), problems, server)


def _check(cases, *, cache, label: str, models: Path, sglang_path: Path | None = None) -> dict[str, dict]:
    """cases: [(id, argv, env, version)] -> {id: argcheck result}, plus "_header". SGLang's answer for a case whose
    inputs (argv, env, model config.json files, SGLang, the argcheck) are unchanged since the last run comes from
    pytest's cache (tests/workers/sglang/argcache.py); a clean checkout runs them all."""
    results, ran = check_argv([(cid, argv, env) for cid, argv, env, _ in cases], cache=cache, label=label,
                              models=models, sglang_path=sglang_path)
    print(f"\nargcheck {label}: SGLang ran {ran} of {len(cases)} cases (the rest unchanged since the cached run)")
    return results


@pytest.fixture(scope="module")
def grid_models(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang-models")


@pytest.fixture(scope="module")
def grid(grid_models):
    return _grid(grid_models, versions=("0.5.10",))


# ---------------------------------------------------------------- our verdict = SGLang 0.5.23's verdict

# Rules of ours that SGLang's parser cannot see (it accepts the point and keeps what we asked), each with why the
# point would still not measure what its labels say. Every other rejection must be an SGLang rejection or an
# SGLang rewrite (resolved values != what the point asks).
OURS_ONLY = [  # (key, words of its `allowed`)
    ("attention.speculative_attention_mode", "would never verify"),  # the kernel is not the verify backend
    ("attention.prefill_backend", "without speculation"),  # prefill-only kernel without speculation: never runs
    ("attention.backend", "MLA model"),  # the plugin hands MLA layers to SGLang's Triton backend
    ("attention.decode_backend", "MLA model"),
    ("attention.prefill_backend", "MLA model"),
    ("drafter.draft_window_size", "ignores the draft window"),  # NGRAM/STANDALONE: SGLang says "has no effect"
    ("drafter.draft_model_path", "draft with the target itself"),  # that would be the oracle, unlabelled
    ("attention.draft_backend", "draft worker does not support"),  # EAGLE draft worker: fails at start-up
    ("drafter.draft_num_layers", "SGLang has no such flag"),  # layer skipping is the reference engine's
    # workers/sglang/startup_rules.py: the parser accepts them, the server dies at start-up
    ("attention.backend", "dies at its own warm-up"),  # torch_native cannot run TARGET_VERIFY
    ("attention.prefill_backend", "dies at its own warm-up"),
    ("attention.decode_backend", "dies at its own warm-up"),
    ("attention.backend", "asserts SM 8.x"),  # fa3 on another architecture (with cluster.accelerator)
    ("attention.backend", "factory refuses speculative decoding"),  # hpc_ops
    ("tp_size", "refuse to start with no memory left"),  # weights that cannot fit the GPU
]


def _ours_only(problems) -> bool:
    return all(any(p.key == key and words in p.allowed for key, words in OURS_ONLY) for p in problems)


def test_our_verdict_equals_sglang_0_5_23_on_every_conf_combination(tmp_path, pytestconfig):
    _require(_sglang_installed(), "sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    points = _grid(tmp_path, versions=("0.5.23",), null_paths=True)
    results = _check([(p.name, p.argv, p.env, p.version) for p in points], cache=pytestconfig.cache,
                     label="grid-0.5.23", models=tmp_path)
    assert results.pop("_header")["sglang_version"] == "0.5.23"
    wrong: dict[str, str] = {}
    counts = {"accepted": 0, "sglang rejects": 0, "sglang rewrites": 0, "ours only": 0}
    for p in points:
        r = results[p.name]
        resolved = reported_server_args(r["resolved"]) if r["ok"] else {}
        expected = expected_server_args(p.server)
        differs = {k: (expected[k], resolved[k]) for k in SERVER_ARG_KEYS if resolved and resolved[k] != expected[k]}
        if not p.problems:
            counts["accepted"] += 1
            if not r["ok"]:
                wrong[p.name] = f"ours accepts, SGLang rejects: {r['error'][-300:]}"
            elif differs:
                wrong[p.name] = f"ours accepts, SGLang resolves differently (expected, got): {differs}"
        elif not r["ok"]:
            counts["sglang rejects"] += 1
        elif differs:
            counts["sglang rewrites"] += 1
        elif _ours_only(p.problems):
            counts["ours only"] += 1
        else:
            wrong[p.name] = f"ours rejects ({'; '.join(map(str, p.problems))}), SGLang accepts it unchanged"
    print(f"\nSGLang 0.5.23 verdicts over {len(points)} points: {counts}")
    assert counts["accepted"] >= 100 and counts["sglang rejects"] and counts["sglang rewrites"] and counts["ours only"]
    assert not wrong, json.dumps(wrong, indent=1)[:8000]


def test_every_conf_combination_passes_sglang_0_5_10(grid, grid_models, pytestconfig):
    _require(SGLANG_0_5_10.is_dir() and _sglang_installed(),
             f"SGLang 0.5.10 not unpacked at {SGLANG_0_5_10} (pip install --no-deps --target ... sglang==0.5.10)")
    cases = [(p.name, p.argv, p.env, p.version) for p in grid if p.version == "0.5.10" and not p.problems]
    results = _check(cases, sglang_path=SGLANG_0_5_10, cache=pytestconfig.cache, label="grid-0.5.10",
                     models=grid_models)
    assert results.pop("_header")["sglang_version"] == "0.5.10"
    failed = {cid: r["error"] for cid, r in results.items() if not r["ok"]}
    print(f"\nSGLang 0.5.10 parsed+validated {len(cases) - len(failed)}/{len(cases)} argv")
    assert len(cases) >= 50 and not failed, json.dumps(failed, indent=1)[:6000]


# ---------------------------------------------------------------- bad combinations: ours rejects first

Q = ("engine=sglang", "model=qwen3-8b")
DRAFT = "drafter.draft_model_path=org/draft"
# (overrides, version, key our validation names, SGLang itself rejects it on a CPU host too)
BAD = [
    (Q + ("drafter=eagle3", DRAFT, *TREE, "attention=torch_native", "attention.draft_backend=triton"), "0.5.23",
     "attention.backend", True),  # topk > 1 with page_size > 1 only on flashinfer/fa3/triton
    (Q + ("drafter=eagle3", DRAFT, *TREE, "attention=triton"), "0.5.10", "attention.backend", True),  # 0.5.10: fa3/fi
    (Q + ("drafter=ngram", *TREE, "attention=triton"), "0.5.23", "attention.backend", True),  # NGRAM: flashinfer only
    (Q + ("drafter=ngram", *TREE, "attention=fa3"), "0.5.10", "attention.backend", True),
    (Q + ("drafter=eagle3", DRAFT, *TREE, "attention=specsweep_verify"), "0.5.23", "attention.backend", True),
    (Q + ("drafter=eagle3", DRAFT, "attention=torch_native"), "0.5.23", "attention.draft_backend", False),  # draft worker
    (Q + ("drafter=ngram", "attention=triton", "+attention.backend=flex_attention"), "0.5.23", None, False),
    (Q + ("drafter=dflash", DRAFT), "0.5.10", "drafter.algorithm", True),  # DFLASH does not exist in 0.5.10
    (Q + ("drafter=dflash", DRAFT, "drafter.num_steps=2"), "0.5.23", "drafter.num_steps", False),  # forced to 1
    (Q + ("drafter=dflash", DRAFT, "drafter.topk=2"), "0.5.23", "drafter.topk", False),
    (Q + ("drafter=dflash", DRAFT, "attention=torch_native"), "0.5.23", "attention.draft_backend", False),  # fallback
    (Q + ("drafter=dflash", DRAFT, "drafter.draft_window_size=8"), "0.5.23", "drafter.draft_window_size", False),
    (Q + ("drafter=ngram", "attention=triton", "engine.extra_args=[--cuda-graph-max-bs,8]"), "0.5.23",
     "engine.extra_args", True),  # gone since 0.5.20
    (Q + ("drafter=ngram", "attention=triton", "engine.extra_args=[--cuda-graph-max-bs-decode,8]"), "0.5.10",
     "engine.extra_args", True),
    (Q + ("drafter=none", "attention=flashinfer"), "0.5.16", "engine.version", False),
    (Q + ("drafter=none", "attention=torch"), "0.5.23", "attention.backend", True),  # the reference's name
    (("engine=sglang", "model=tiny", "drafter=none", "attention=triton"), "0.5.23", "model.path", False),
    (Q + ("drafter=none", "attention=triton", "page_size=16", "+attention.decode_backend=flashmla"), "0.5.23",
     None, False),
    (Q + ("drafter=ngram", "attention=triton", "engine.sglang.mem_fraction_static=1.5"), "0.5.23",
     "engine.sglang.mem_fraction_static", False),
    (Q + ("drafter=eagle3", DRAFT, "attention=triton", "drafter.num_draft_tokens=9"), "0.5.23",
     "drafter.num_draft_tokens", False),  # topk 1: SGLang would silently use num_steps + 1
    # start-up only (workers/sglang/startup_rules.py; tests/workers/sglang/test_startup_rules.py runs SGLang's code)
    (Q + ("drafter=ngram", "attention=torch_native", "page_size=1"), "0.5.23", "attention.backend", False),
    (Q + ("drafter=none", "attention=fa3", "cluster.accelerator=sm_120"), "0.5.23", "attention.backend", False),
    (Q + ("drafter=ngram", "attention=triton", "+attention.backend=hpc_ops", "page_size=64"), "0.5.23",
     "attention.backend", False),
    (("engine=sglang", "model=deepseek-v3", "drafter=none", "attention=triton"), "0.5.23", "tp_size", False),
]


def _bad_point(overrides: tuple[str, ...], version: str):
    plain = [o for o in overrides if not o.startswith("+")]
    rc = _compose(plain)
    rc = dataclasses.replace(rc, engine=dataclasses.replace(rc.engine, version=version))
    for o in overrides:  # keys the conf group has no default for
        if o.startswith("+attention."):
            key, value = o[len("+attention."):].split("=", 1)
            rc = dataclasses.replace(rc, attention=dataclasses.replace(rc.attention, **{key: value}))
    return rc


@pytest.mark.smoke  # the fast tier's sample of the SGLang argv checks
@pytest.mark.parametrize("overrides,version,key,sglang_rejects", BAD,
                         ids=[f"{v}:{' '.join(o[2:])}" for o, v, _, _ in BAD])
def test_bad_combinations_are_rejected_by_our_validation(overrides, version, key, sglang_rejects):
    from orchestrator.config.config_error import ConfigError

    try:
        problems = validate_run(_bad_point(overrides, version))
    except ConfigError as e:  # refused by a declared domain at conversion, before the rules
        problems = list(e.problems)
    assert problems, "our validation let it through"
    if key is not None:
        assert key in {p.key for p in problems}, problems
    for p in problems:
        assert p.allowed and str(p).startswith(f"{p.key}=")


def test_sglang_itself_rejects_the_bad_points_marked_so(tmp_path, pytestconfig):
    """The rules that mirror an SGLang error: building the argv anyway, SGLang's parser/resolver refuses it."""
    _require(_sglang_installed(), "sglang is not installed")
    model = ModelSpec(name="q", path="", max_context_len=40960, num_layers=2, hidden_size=256, num_q_heads=8,
                      num_kv_heads=2, head_dim=32, v_head_dim=32, dtype="bfloat16")
    target = _write_model(tmp_path / "m", model)
    cases = {"0.5.23": [], "0.5.10": []}
    for overrides, version, _key, sglang_rejects in BAD:
        if not sglang_rejects:
            continue
        rc = _bad_point(overrides, version)
        rc = dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=target),
                                 drafter=dataclasses.replace(rc.drafter, draft_model_path=rc.drafter.draft_model_path
                                                             and target))
        argv = build_sglang_argv(build_server(rc), 30000)[3:]
        cases[version].append((" ".join(overrides[2:]), argv, {}, version))
    results = _check(cases["0.5.23"], cache=pytestconfig.cache, label="bad-0.5.23", models=tmp_path)
    results.pop("_header")
    accepted = [cid for cid, r in results.items() if r["ok"]]
    if SGLANG_0_5_10.is_dir():
        old = _check(cases["0.5.10"], sglang_path=SGLANG_0_5_10, cache=pytestconfig.cache, label="bad-0.5.10",
                     models=tmp_path)
        old.pop("_header")
        accepted += ["0.5.10 " + cid for cid, r in old.items() if r["ok"]]
    assert not accepted, f"SGLang accepted what our validation calls its error: {accepted}"


# ---------------------------------------------------------------- the version table (docs/sglang.md)


def _flags(argv: list[str]) -> dict[str, str]:
    """{flag: value} of an argv; boolean flags map to ""."""
    out, i = {}, 3
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i]] = argv[i + 1] if has_value else ""
        i += 2 if has_value else 1
    return out


def _argv(version: str, *overrides: str) -> list[str]:
    rc = _compose(list(Q) + list(overrides))
    rc = dataclasses.replace(rc, engine=dataclasses.replace(rc.engine, version=version))
    assert validate_run(rc) == []
    return build_sglang_argv(build_server(rc), 4321)


@pytest.mark.smoke  # the fast tier's sample of the SGLang argv checks
def test_version_flags_cuda_graph():
    new = _argv("0.5.23", "drafter=none", "attention=triton", "engine.sglang.cuda_graph_max_bs=16")
    old = _argv("0.5.10", "drafter=none", "attention=triton", "engine.sglang.cuda_graph_max_bs=16")
    assert new[new.index("--cuda-graph-max-bs-decode") + 1] == "16" and "--cuda-graph-max-bs" not in new
    assert old[old.index("--cuda-graph-max-bs") + 1] == "16" and "--cuda-graph-max-bs-decode" not in old
    off_new = _argv("0.5.23", "drafter=none", "attention=triton", "engine.sglang.disable_cuda_graph=true")
    off_old = _argv("0.5.10", "drafter=none", "attention=triton", "engine.sglang.disable_cuda_graph=true")
    assert "--cuda-graph-backend-decode" in off_new and "--disable-cuda-graph" not in off_new
    assert "--disable-cuda-graph" in off_old


@pytest.mark.smoke  # the fast tier's sample of the SGLang argv checks
def test_version_flags_speculation():
    ngram = _argv("0.5.23", "drafter=ngram", "attention=triton")
    flags = _flags(ngram)
    assert flags["--speculative-algorithm"] == "NGRAM" and flags["--speculative-ngram-max-bfs-breadth"] == "1"
    assert "--speculative-eagle-topk" not in flags  # SGLang copies the BFS breadth into topk
    dflash = _argv("0.5.23", "drafter=dflash", DRAFT, "drafter.draft_window_size=64", "attention=fa3")
    flags = _flags(dflash)
    assert flags["--speculative-dflash-block-size"] == "16" and flags["--speculative-draft-window-size"] == "64"
    assert "--speculative-num-steps" not in flags and "--speculative-eagle-topk" not in flags
    eagle = _argv("0.5.10", "drafter=eagle3", DRAFT, "attention=fa3")
    flags = _flags(eagle)
    assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
            flags["--speculative-num-draft-tokens"]) == ("3", "1", "4")


@pytest.mark.smoke  # the fast tier's sample of the SGLang argv checks
def test_common_flags_and_env():
    argv = _argv("0.5.23", "drafter=none", "attention=triton", "engine.sglang.mem_fraction_static=0.8",
                 "model.load_format=dummy", "server_context_len=65536")
    flags = _flags(argv)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "4321" and flags["--load-format"] == "dummy"
    assert flags["--mem-fraction-static"] == "0.8" and flags["--context-length"] == "65536"
    assert "--enable-metrics" in argv and flags["--tp-size"] == "1"
    rc = _compose(list(Q) + ["drafter=none", "attention=triton", "server_context_len=65536"])
    timer = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}  # verify_step_ms (workers/engine_counters.py)
    assert sglang_env(build_server(rc)) == {LONGER_CONTEXT_ENV: "1", **timer}  # qwen3-8b's config says 40960
    assert sglang_env(build_server(_compose(list(Q) + ["drafter=none", "attention=triton"]))) == timer


def test_plugin_backend_launches_through_the_wrapper_with_a_triton_draft():
    argv = _argv("0.5.10", "drafter=eagle3", DRAFT, "attention=specsweep_verify")
    assert argv[1:3] == ["-m", "workers.sglang.launch"]
    assert argv[argv.index("--speculative-draft-attention-backend") + 1] == "triton"
    assert argv[argv.index("--attention-backend") + 1] == "specsweep_verify"


# ---------------------------------------------------------------- the cache of SGLang's answers (argcache.py)


class _DictCache:
    """pytest's `config.cache` interface (get/set of JSON values), in memory."""

    def __init__(self):
        self.data: dict = {}

    def get(self, key, default):
        return json.loads(json.dumps(self.data.get(key, default)))

    def set(self, key, value):
        self.data[key] = json.loads(json.dumps(value))


def test_argcheck_cache_reruns_only_changed_inputs(tmp_path):
    """A second call with the same inputs asks SGLang nothing and answers the same; a changed argv re-runs only that
    case; a changed model config.json (or SGLang, or the argcheck/builder source) changes the fingerprint."""
    from tests.workers.sglang.argcache import fingerprint

    _require(_sglang_installed(), "sglang is not installed")
    first, second = tmp_path / "a", tmp_path / "b"
    for models in (first, second):
        rc = _compose(list(Q) + ["drafter=ngram", "attention=triton"])
        target = _write_model(models / "q", rc.model)
        server = build_server(dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=target)))
        models.joinpath("argv.json").write_text(json.dumps(build_sglang_argv(server, 30000)[3:]))
    argv = json.loads(first.joinpath("argv.json").read_text())
    cases = [("ok", argv, {}), ("bad", argv + ["--no-such-flag"], {})]
    cache = _DictCache()
    fresh, ran = check_argv(cases, cache=cache, label="t", models=first)
    assert ran == 2 and fresh["ok"]["ok"] and not fresh["bad"]["ok"] and fresh["_header"]["sglang_version"]
    # the same inputs in another temp dir (each run has its own): nothing asked, the same answers there
    moved = [(cid, [a.replace(str(first), str(second)) for a in av], env) for cid, av, env in cases]
    again, ran = check_argv(moved, cache=cache, label="t", models=second)
    assert ran == 0 and again["_header"] == fresh["_header"]
    assert json.dumps(again).replace(str(second), str(first)) == json.dumps(fresh)
    changed, ran = check_argv([cases[0], ("bad", argv + ["--page-size", "x"], {})], cache=cache, label="t",
                              models=first)
    assert ran == 1 and changed["ok"] == fresh["ok"] and not changed["bad"]["ok"]
    before = fingerprint(first, None)
    config = first / "q" / "config.json"
    config.write_text(config.read_text().replace('"vocab_size": 1024', '"vocab_size": 2048'))
    assert fingerprint(first, None) != before  # every cached answer of this model set is dropped
