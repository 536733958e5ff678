"""Every validation rule: the problem names the key, the bad value and what is allowed."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from orchestrator.schema import register_configs, to_run_config
from orchestrator.validate import ConfigError, Problem, validate_run


def run_config(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return to_run_config(cfg, overrides, cwd="/tmp")


def problems(*overrides: str, sweep: bool = False) -> dict[str, Problem]:
    out = validate_run(run_config(*overrides), check_max_context=not sweep)
    return {p.key: p for p in out}


SGLANG = ("engine=sglang", "model=qwen3-8b", "attention=triton")


@pytest.mark.parametrize("overrides", [
    (), ("drafter=ngram",), ("drafter=none",), ("drafter=draft_model", "drafter.draft_model_path=tiny-draft"),
    ("context_len=32704",), SGLANG, SGLANG + ("drafter=eagle3", "drafter.draft_model_path=x"),
    SGLANG + ("drafter=dflash", "drafter.draft_model_path=x"), SGLANG + ("model=deepseek-v3", "drafter=ngram"),
    ("engine.device=cuda", "attention=specsweep_verify"),
])
def test_valid_configs_have_no_problems(overrides):
    assert problems(*overrides) == {}


@pytest.mark.parametrize("key,override,value,allowed", [
    ("page_size", "page_size=0", 0, ">= 1"),
    ("gen_tokens", "gen_tokens=0", 0, ">= 1"),
    ("context_len", "context_len=0", 0, ">= 1"),
    ("context_len", "context_len=32768", 32768, "max_context_len 32768"),
    ("tp_size", "tp_size=2", 2, "1 on engine=reference"),
    ("nnodes", "nnodes=0", 0, ">= 1"),
    ("server_context_len", "server_context_len=65536", 65536, "<= model max_context_len"),
    ("attention.backend", "attention=triton", "triton", "torch, specsweep_verify"),
    ("engine.device", "attention=specsweep_verify", "cpu", "cuda"),
    ("drafter.algorithm", "drafter=eagle3", "EAGLE3", "engine=sglang"),
    ("drafter.num_draft_tokens", "drafter.num_draft_tokens=7", 7, "num_steps + 1 = 5"),
    ("model.num_kv_heads", "model.num_kv_heads=3", 3, "divisor"),
])
def test_each_rule_names_key_value_allowed(key, override, value, allowed):
    p = problems(override)[key]
    assert p.value == value and allowed in p.allowed
    assert p.overrides == (override,)
    assert f"{key}={value!r}" in str(p) and allowed in str(p)


def test_multi_node_servers():
    assert problems(*SGLANG, "tp_size=16", "nnodes=2") == {}
    p = problems(*SGLANG, "tp_size=12", "nnodes=8")["tp_size"]
    assert p.value == 12 and "multiple of nnodes=8" in p.allowed
    assert "single-node" in problems("nnodes=2")["nnodes"].allowed


def test_drafter_needing_a_path_without_one():
    p = problems("drafter=draft_model")["drafter.draft_model_path"]
    assert p.value is None and "tiny-draft" in p.allowed  # the reference engine's example
    for drafter in ("eagle3", "dflash"):
        assert "drafter.draft_model_path" in problems(*SGLANG, f"drafter={drafter}")


def test_oracle_must_draft_with_the_target():
    assert "target's own path" in problems("drafter.draft_model_path=tiny-draft")["drafter.draft_model_path"].allowed


def test_sweep_points_above_max_are_not_errors():
    assert problems("context_len=65536", sweep=True) == {}


def test_sglang_rules():
    assert "triton" in problems("engine=sglang", "model=qwen3-8b", "attention=torch")["attention.backend"].allowed
    assert "cuda" in problems(*SGLANG, "engine.device=cpu")["engine.device"].allowed
    dflash = (*SGLANG, "drafter=dflash", "drafter.draft_model_path=x")
    assert problems(*dflash, "drafter.num_steps=2")["drafter.num_steps"].allowed.startswith("1")
    assert problems(*dflash, "drafter.topk=2")["drafter.topk"].value == 2
    p = problems("engine=sglang", "model=qwen3-8b", "attention=torch_native", "drafter=dflash", "drafter.draft_model_path=x")
    assert "DFLASH draft worker" in p["attention.draft_backend"].allowed
    # topk > 1 with page_size > 1 needs a paged-tree backend
    tree = ("engine=sglang", "model=qwen3-8b", "drafter=eagle3", "drafter.draft_model_path=x", "drafter.topk=4",
            "drafter.num_draft_tokens=8", "page_size=16")
    p = problems(*tree, "attention=torch_native", "attention.draft_backend=triton")["attention.backend"]
    assert p.value == "torch_native" and "flashinfer, fa3, triton" in p.allowed
    assert problems(*tree, "attention=fa3") == {}
    assert problems(*tree, "attention=torch_native", "attention.draft_backend=triton", "page_size=1") == {}
    # the EAGLE draft worker has no torch_native backend unless a draft backend is named
    p = problems("engine=sglang", "model=qwen3-8b", "attention=torch_native", "drafter=eagle3", "drafter.draft_model_path=x")
    assert "draft-worker backend" in p["attention.draft_backend"].allowed
    assert "attention.draft_backend" in problems(*SGLANG, "attention.draft_backend=torch_native")
    ngram = ("engine=sglang", "model=qwen3-8b", "drafter=ngram", "drafter.topk=2", "drafter.num_draft_tokens=8")
    assert problems(*ngram, "attention=triton")["attention.backend"].allowed.startswith("flashinfer")
    assert problems(*ngram, "attention=flashinfer") == {}


def test_config_error_lists_every_point():
    err = ConfigError([Problem("page_size", 0, "an integer >= 1", ("page_size=0", "ctx=1")),
                       Problem("page_size", 0, "an integer >= 1", ("page_size=0", "ctx=2")),
                       Problem("gen_tokens", 0, "an integer >= 1", ("page_size=0", "ctx=2"))])
    text = str(err)
    assert "3 problem(s) in 2 grid point(s)" in text
    assert "[page_size=0 ctx=1]" in text and "[page_size=0 ctx=2]" in text
    assert text.count("page_size=0: allowed an integer >= 1") == 2


# ---------------------------------------------------------------- metrics.log_patterns


def test_log_patterns_default_empty_and_good_patterns_pass():
    assert run_config().log_patterns == ()
    good = r"metrics.log_patterns=['commit=(?P<commit_len>\d+) depth=(?P<tree_depth>\d+)','nodes=(?P<n>[0-9]+)']"
    rc = run_config(good)
    assert rc.log_patterns == (r"commit=(?P<commit_len>\d+) depth=(?P<tree_depth>\d+)", "nodes=(?P<n>[0-9]+)")
    assert validate_run(rc) == []


@pytest.mark.parametrize("pattern,why", [
    (r"commit=\d+", "no named group"),  # compiles, but nothing would name a series
    (r"commit=(\d+)", "no named group"),  # an unnamed group is not a series name
    (r"commit=(?P<commit_len\d+)", "does not compile"),
    (r"commit=(?P<c>\d+", "does not compile: missing ), unterminated subpattern"),
])
def test_bad_log_pattern_names_key_value_allowed(pattern, why):
    override = f"metrics.log_patterns=['(?P<ok>x)','{pattern}']"
    p = problems(override)
    assert list(p) == ["metrics.log_patterns[1]"]  # the good first pattern is not blamed
    bad = p["metrics.log_patterns[1]"]
    assert bad.value == pattern and bad.overrides == (override,)
    assert "regular expression with at least one named group" in bad.allowed and why in bad.allowed
    assert str(bad).startswith(f"metrics.log_patterns[1]={pattern!r}: allowed a Python regular expression")


def test_log_patterns_refused_for_kernel_jobs():
    p = problems("job=kernel", "engine.device=cuda", "metrics.log_patterns=['t=(?P<t>\\d+)']")
    assert list(p) == ["metrics.log_patterns"]
    assert "job=kernel" in p["metrics.log_patterns"].allowed and p["metrics.log_patterns"].value == ["t=(?P<t>\\d+)"]


# ---------------------------------------------------------------- engine=stub


def test_stub_engine_conf_converts_and_validates():
    rc = run_config("engine=stub")
    assert rc.engine.kind.value == "stub" and rc.engine.stub is not None and rc.engine.stub.token_s == 0.005
    assert problems("engine=stub") == {}
    # the stub accepts what the reference engine refuses: it has no kernels and no model to load
    assert problems("engine=stub", "engine.device=cuda", "tp_size=8", "drafter=ngram", "attention=triton") == {}
    assert problems("engine=stub", "tp_size=16", "nnodes=2") == {}
    assert problems("engine=stub", "engine.stub.token_s=0", "engine.stub.prefill_s=0.001") == {}


@pytest.mark.parametrize("override,key,value,allowed", [
    ("engine.stub.token_s=-0.1", "engine.stub.token_s", -0.1, ">= 0"),
    ("engine.stub.prefill_s=-1", "engine.stub.prefill_s", -1.0, ">= 0"),
    ("engine.stub.startup_s=nan", "engine.stub.startup_s", None, ">= 0"),
    ("engine.stub.rendezvous_timeout_s=0", "engine.stub.rendezvous_timeout_s", 0.0, "> 0"),
    ("engine.extra_args=[--stub-token-s,0.1]", "engine.extra_args", "--stub-token-s", "engine.stub.token_s=N"),
    ("engine.extra_args=['--stub-prefill-s=0.1']", "engine.extra_args", "--stub-prefill-s", "engine.stub.prefill_s=N"),
    ("tp_size=12", "tp_size", 12, None),  # nnodes=2 below: the generic rule still applies to the stub
])
def test_stub_engine_rules(override, key, value, allowed):
    extra = ("nnodes=8",) if key == "tp_size" else ()
    p = problems("engine=stub", override, *extra)[key]
    if value is not None:
        assert p.value == value
    else:
        assert p.value != p.value  # nan
    if allowed:
        assert allowed in p.allowed


def test_stub_engine_section_is_typed():
    with pytest.raises(Exception, match="token_s"):
        run_config("engine=stub", "engine.stub.token_s=fast")  # Hydra's own type error
    with pytest.raises(Exception, match="tokens_s"):
        run_config("engine=stub", "engine.stub.tokens_s=0.1")  # a misspelt key
