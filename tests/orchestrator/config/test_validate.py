"""Every validation rule: the problem names the key, the bad value and what is allowed."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.schema import register_configs, to_run_config
from orchestrator.config.config_error import ConfigError
from orchestrator.config.validate import validate_run
from specsweep_common.problem import Problem


def run_config(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return to_run_config(cfg, overrides, cwd="/tmp")


def problems(*overrides: str, sweep: bool = False) -> dict[str, Problem]:
    """Every problem of one point, whichever check finds it (a declared domain at conversion, or a rule)."""
    try:
        rc = run_config(*overrides)
    except ConfigError as e:
        return {p.key: p for p in e.problems}
    out = validate_run(rc, check_max_context=not sweep)
    return {p.key: p for p in out}


SGLANG = ("engine=sglang", "model=qwen3-8b", "attention=triton")
TINY = "model=tiny"


@pytest.mark.parametrize("overrides", [
    (), ("drafter=ngram",), ("drafter=none",), ("drafter=layer_skip",), ("context_len=8128",),
    ("model=tiny", "drafter=draft_model", "drafter.draft_model_path=tiny-draft"), ("model=tiny", "context_len=32704"),
    SGLANG, SGLANG + ("drafter=eagle3", "drafter.draft_model_path=x"),
    SGLANG + ("drafter=dflash", "drafter.draft_model_path=x"), SGLANG + ("model=deepseek-v3", "drafter=ngram", "tp_size=8"),
    ("engine.device=cuda", "attention=specsweep_verify"),
])
def test_valid_configs_have_no_problems(overrides):
    assert problems(*overrides) == {}


@pytest.mark.parametrize("key,override,value,allowed", [
    ("page_size", "page_size=0", 0, "[1, 4096]"),
    ("gen_tokens", "gen_tokens=0", 0, "[1, 1048576]"),
    ("context_len", "context_len=0", 0, "[1, 16777216]"),
    ("context_len", "context_len=8192", 8192, "max_context_len 8192"),  # the default model: smollm2-135m
    ("tp_size", "tp_size=2", 2, "1 on engine=reference"),
    ("nnodes", "nnodes=0", 0, "[1, 1024]"),
    ("server_context_len", "server_context_len=65536", 65536, "<= model max_context_len"),
    ("attention.backend", "attention=triton", "triton", "torch, specsweep_verify"),
    ("engine.device", "attention=specsweep_verify", "cpu", "cuda"),
    ("drafter.algorithm", "drafter=eagle3", "EAGLE3", "engine=sglang"),
    ("drafter.num_draft_tokens", ("drafter=oracle", "drafter.num_draft_tokens=7"), 7, "num_steps + 1 = 5"),
    ("model.num_kv_heads", "model.num_kv_heads=4", 4, "divisor"),
])
def test_each_rule_names_key_value_allowed(key, override, value, allowed):
    overrides = override if isinstance(override, tuple) else (override,)  # the default drafter is ngram
    p = problems(*overrides)[key]
    assert p.value == value and allowed in p.allowed
    assert p.overrides == overrides
    assert f"{key}={value!r}" in str(p) and allowed in str(p)


def test_multi_node_servers():
    assert problems(*SGLANG, "tp_size=16", "nnodes=2") == {}
    p = problems(*SGLANG, "tp_size=12", "nnodes=8")["tp_size"]
    assert p.value == 12 and "multiple of nnodes=8" in p.allowed
    assert "single-node" in problems("nnodes=2")["nnodes"].allowed


def test_drafter_needing_a_path_without_one():
    p = problems(TINY, "drafter=draft_model")["drafter.draft_model_path"]
    assert p.value is None and "tiny-draft" in p.allowed  # the reference engine's example: tiny's vocabulary
    p = problems("drafter=draft_model")["drafter.draft_model_path"]  # smollm2-135m: no built-in draft model shares it
    assert p.value is None and "tiny-draft" not in p.allowed and "drafter=layer_skip" in p.allowed
    for drafter in ("eagle3", "dflash"):
        assert "drafter.draft_model_path" in problems(*SGLANG, f"drafter={drafter}")
    p = problems("drafter=eagle3")["drafter.draft_model_path"]  # not the reference engine's: a checkpoint
    assert "a checkpoint dir or HF id" in p.allowed and "layer_skip" not in p.allowed


def test_oracle_must_draft_with_the_target():
    assert "target's own path" in problems("drafter=oracle", "drafter.draft_model_path=tiny-draft")[
        "drafter.draft_model_path"].allowed


def test_sweep_points_above_max_are_not_errors():
    assert problems("context_len=65536", sweep=True) == {}


def test_sglang_rules():
    assert "triton" in problems("engine=sglang", "model=qwen3-8b", "attention=torch")["attention.backend"].allowed
    # engine.device=cpu is SGLang's CPU backend (engine=sglang_cpu, workers/sglang/cpu.py): its release and rules
    assert "0.5.18" in problems(*SGLANG, "engine.device=cpu")["engine.version"].allowed
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
    # page_size=1 passes that rule; torch_native still cannot verify (test_rules_sglang_checks_only_at_start_up)
    p = problems(*tree, "attention=torch_native", "attention.draft_backend=triton", "page_size=1")
    assert list(p) == ["attention.backend"] and "warm-up" in p["attention.backend"].allowed
    # the EAGLE draft worker has no torch_native backend unless a draft backend is named
    p = problems("engine=sglang", "model=qwen3-8b", "attention=torch_native", "drafter=eagle3", "drafter.draft_model_path=x")
    assert "draft-worker backend" in p["attention.draft_backend"].allowed
    assert "attention.draft_backend" in problems(*SGLANG, "attention.draft_backend=torch_native")
    ngram = ("engine=sglang", "model=qwen3-8b", "drafter=ngram", "drafter.topk=2", "drafter.num_draft_tokens=8")
    assert problems(*ngram, "attention=triton")["attention.backend"].allowed.startswith("flashinfer")
    assert problems(*ngram, "attention=flashinfer") == {}


EAGLE = (*SGLANG, "drafter=eagle3", "drafter.draft_model_path=x")


def test_specsweep_verify_must_be_the_verify_backend():
    """SGLang verifies on the prefill backend unless speculative_attention_mode=decode (HybridAttnBackend)."""
    split = (*EAGLE, "attention.decode_backend=specsweep_verify")
    p = problems(*split)["attention.speculative_attention_mode"]
    assert p.value is None and p.allowed.startswith("decode") and "verifies on triton" in p.allowed
    assert problems(*split, "attention.speculative_attention_mode=decode") == {}
    rev = (*EAGLE, "attention=specsweep_verify", "attention.decode_backend=triton")
    assert problems(*rev) == {}  # verify on the prefill backend = ours
    p = problems(*rev, "attention.speculative_attention_mode=decode")["attention.speculative_attention_mode"]
    assert p.value == "decode" and p.allowed.startswith("prefill (or null)")
    # without speculation the kernel runs decode only: as a prefill-only backend it would never run
    p = problems(*SGLANG, "drafter=none", "attention.prefill_backend=specsweep_verify")["attention.prefill_backend"]
    assert "never" not in p.allowed and "Triton" in p.allowed
    assert problems(*SGLANG, "drafter=none", "attention.decode_backend=specsweep_verify") == {}
    assert problems(*EAGLE, "attention=specsweep_verify") == {}


def test_speculative_attention_mode_values_and_engines():
    p = problems(*EAGLE, "attention.speculative_attention_mode=verify")["attention.speculative_attention_mode"]
    assert p.value == "verify" and "prefill, decode" in p.allowed
    p = problems("attention.speculative_attention_mode=decode")["attention.speculative_attention_mode"]
    assert "null on engine=reference" in p.allowed


def test_specsweep_verify_refused_for_mla_models_on_sglang():
    p = problems("engine=sglang", "model=deepseek-v3", "attention=specsweep_verify", "drafter=ngram")["attention.backend"]
    assert p.value == "specsweep_verify" and "MLA" in p.allowed and "Triton" in p.allowed
    p = problems("engine=sglang", "model=deepseek-v3", "attention=triton", "drafter=none",
                 "attention.decode_backend=specsweep_verify")["attention.decode_backend"]
    assert "deepseek-v3" in p.allowed


def test_draft_window_only_where_sglang_honours_it():
    for drafter in (("drafter=ngram",), ("drafter=draft_model", "drafter.draft_model_path=x")):
        p = problems(*SGLANG, *drafter, "drafter.draft_window_size=64")["drafter.draft_window_size"]
        assert p.value == 64 and p.allowed.startswith("null with") and "no effect" in p.allowed
    assert problems(*EAGLE, "drafter.draft_window_size=64") == {}


def test_eagle3_and_draft_model_without_a_draft_path_on_sglang():
    for drafter in ("eagle3", "draft_model"):
        p = problems(*SGLANG, f"drafter={drafter}")["drafter.draft_model_path"]
        assert p.value is None and "drafter=oracle" in p.allowed
    assert problems(*SGLANG, "drafter=oracle") == {}


def test_context_counts_the_server_context_and_eagle_reserve():
    # qwen3-8b: 40960; EAGLE3 steps 3 topk 1 draft 4 reserves max(3, 4) = 4 slots
    assert problems(*EAGLE, "context_len=40892") == {}  # + 64 + 4 = 40960
    p = problems(*EAGLE, "context_len=40893")["context_len"]
    assert "4 tokens SGLang reserves for EAGLE3" in p.allowed and "40960" in p.allowed
    tree = (*EAGLE, "drafter.topk=4", "drafter.num_draft_tokens=8", "page_size=1")  # max(4 * 3, 8) = 12
    assert "context_len" in problems(*tree, "context_len=40885") and problems(*tree, "context_len=40884") == {}
    # NGRAM reserves nothing, but SGLang's scheduler keeps 2 slots (specsweep_common.sglang_limits)
    assert problems(*SGLANG, "drafter=ngram", "context_len=40894") == {}
    p = problems(*SGLANG, "drafter=ngram", "context_len=40895")["context_len"]
    assert "gen_tokens (64) + 2 (SGLang's scheduler keeps" in p.allowed and "context_len <= 40953" in p.allowed
    p = problems(*SGLANG, "server_context_len=8192", "context_len=8192")["context_len"]
    assert "server_context_len 8192" in p.allowed
    assert problems(*SGLANG, "server_context_len=8192", "context_len=8192", sweep=True) == {}  # dropped, not an error


def test_probe_concurrency():
    # pool sizes below are tiny's (32k context, 4 layers)
    assert problems(TINY, "probe.concurrency=4") == {}  # the reference engine batches
    assert problems(TINY, "drafter=oracle", "page_size=16", "probe.concurrency=16") == {}
    p = problems(TINY, "probe.concurrency=64")["probe.concurrency"]
    assert p.value == 64 and "<= 48" in p.allowed and "--max-running-requests" in p.allowed
    assert problems(TINY, "probe.concurrency=64", "context_len=256", "engine.extra_args=[--max-running-requests,64]") == {}
    assert problems(TINY, "probe.concurrency=64", "context_len=256", "engine.extra_args=['--max-running-requests=64']") == {}
    # 4 requests of 16k prompt + gen tokens do not fit a pool of one 32k context: they would queue
    p = problems(TINY, "probe.concurrency=4", "context_len=16384")["probe.concurrency"]
    assert "<= 1 at context_len 16384" in p.allowed and "KV pages" in p.allowed
    assert problems(TINY, "probe.concurrency=4", "context_len=16384", "engine.extra_args=[--max-total-tokens,70000]") == {}
    assert problems(TINY, "probe.concurrency=0")["probe.concurrency"].allowed == "an integer in [1, 1024]"
    assert problems(*SGLANG, "drafter=ngram", "probe.concurrency=16") == {}
    p = problems(*SGLANG, "drafter=ngram", "probe.concurrency=64")["probe.concurrency"]
    assert "<= 48" in p.allowed and "SGLang sets to 48" in p.allowed
    assert problems(*SGLANG, "drafter=ngram", "probe.concurrency=64", "engine.sglang.max_running_requests=64") == {}
    assert problems("engine=stub", "probe.concurrency=8") == {}


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
    ("engine.stub.token_s=-0.1", "engine.stub.token_s", -0.1, "[0, 3600]"),
    ("engine.stub.prefill_s=-1", "engine.stub.prefill_s", -1.0, "[0, 3600]"),
    ("engine.stub.startup_s=nan", "engine.stub.startup_s", None, "finite"),
    ("engine.stub.rendezvous_timeout_s=0", "engine.stub.rendezvous_timeout_s", 0.0, "(0, 604800]"),
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


# ---------------------------------------------------------------- keys, probe files, a sweep with nothing to run


@pytest.mark.parametrize("overrides,key,closest", [
    (("+engine.stub.tokn_s=1",), "engine.stub.tokn_s", "engine.stub.token_s"),  # engine=reference: not ignored
    (("engine=stub", "+engine.stub.tokn_s=1"), "engine.stub.tokn_s", "engine.stub.token_s"),
    (("engine=sglang", "model=qwen3-8b", "attention=triton", "+engine.sglang.cuda_graph_bs=8"),
     "engine.sglang.cuda_graph_bs", "engine.sglang.cuda_graph_max_bs"),
    (("+contxt_len=5",), "contxt_len", "context_len"),
])
def test_unknown_keys_after_composition_name_the_closest(overrides, key, closest):
    with pytest.raises(ConfigError) as e:
        run_config(*overrides)
    (p,) = e.value.problems
    assert p.key == key and f"did you mean {closest}" in p.allowed and p.overrides == overrides


def test_keys_under_a_dict_are_any():
    assert run_config("+engine.env.HF_HOME=/x").engine.env == (("HF_HOME", "/x"),)


def test_override_keys_left_to_hydra():
    from orchestrator.config.overrides import override_key_problems

    assert override_key_problems(["+sweep=smoke", "engine=stub", "hydra/job_logging=disabled", "~tracking",
                                  "hydra.launcher.dry_run=true", "engine.env.X=1", "page_size=1,16"]) == []
    (p,) = override_key_problems(["+sweep=smoke", "pagesize=1,16"])
    assert p.key == "pagesize" and p.value == "1,16" and "did you mean page_size" in p.allowed
    assert p.overrides == ("+sweep=smoke", "pagesize=1,16")


def test_unknown_key_problem_lists_the_level_and_finds_names_at_other_levels():
    from orchestrator.config.schema import schema_tree
    from orchestrator.config.keys import unknown_key_problem

    tree = schema_tree()
    assert unknown_key_problem("engine.stub.token_s", 1, tree) is None
    assert unknown_key_problem("engine.env.ANY", 1, tree) is None
    p = unknown_key_problem("engine.stub.tokn_s", 1, tree)
    assert p.allowed == ("a key of engine.stub; did you mean engine.stub.token_s? "
                         "(engine.stub has: token_s, prefill_s, startup_s, rendezvous_timeout_s)")
    assert "did you mean engine.stub.token_s" in unknown_key_problem("token_s", 1, tree).allowed
    assert "it is a value" in unknown_key_problem("page_size.x", 1, tree).allowed


@pytest.mark.parametrize("name,raw,why", [
    ("a.txt", b"", "it is empty"),
    ("a.txt", b" \n\t", "only whitespace"),
    ("a.txt", b"\xff\xfe", "not UTF-8"),
    ("a.jsonl", b"", 'no line has a non-blank "text"'),
    ("a.jsonl", b'{"text": 3}\n', 'line 1 has no string "text" field'),
    ("a.ndjson", b'{"text": "x"}\n[1]\n', 'line 2 has no string "text" field'),
    ("a.jsonl", b'{"text": "x"}\n{bad\n', "line 2 is not JSON"),
])
def test_probe_file_problem(name, raw, why):
    from orchestrator.config.probe_file import probe_file_problem

    p = probe_file_problem(name, f"/d/{name}", raw)
    assert p.key == "probe.path" and p.value == name and why in p.allowed
    assert probe_file_problem(name, f"/d/{name}", b'{"text": "x"}\n' if "json" in name else b"x") is None


def test_every_point_over_context():
    from orchestrator.config.context import every_point_over_context

    over = [run_config("context_len=40000"), run_config("context_len=32768")]
    p = every_point_over_context(over)
    assert p.key == "context_len" and p.value == [32768, 40000] and "nothing would run" in p.allowed
    assert every_point_over_context(over + [run_config("context_len=1024")]) is None
    assert every_point_over_context([]) is None


def test_layer_skip_self_draft_is_a_reference_engine_feature():
    real = ("model=smollm2-135m", "drafter=layer_skip")
    assert problems(*real) == {}
    rc = run_config(*real)
    assert rc.drafter.draft_num_layers == 24 and rc.drafter.draft_model_path == rc.model.path == "smollm2-135m"
    p = problems(*real, "drafter.draft_num_layers=31")["drafter.draft_num_layers"]
    assert p.value == 31 and "1..30" in p.allowed
    p = problems("model=tiny", "drafter=layer_skip")["drafter.draft_num_layers"]  # tiny has 4 layers
    assert p.value == 24 and "1..4" in p.allowed
    p = problems("drafter=ngram", "+drafter.draft_num_layers=2")["drafter.draft_num_layers"]
    assert "STANDALONE only" in p.allowed
    p = problems("drafter=oracle", "+drafter.draft_num_layers=2")["drafter.draft_num_layers"]
    assert "oracle" in p.allowed
    p = problems(*SGLANG, "drafter=layer_skip")["drafter.draft_num_layers"]
    assert p.value == 24 and "null on engine=sglang" in p.allowed and "--speculative-draft-num-layers" in p.allowed
    assert "drafter.draft_model_path" not in problems(*SGLANG, "drafter=layer_skip")  # qwen3's path: not built in
    p = problems(*SGLANG, "model.path=smollm2-135m", "drafter=ngram")["model.path"]
    assert "reference engine" in p.allowed


def test_draft_model_must_share_the_targets_vocabulary():
    # the default target is smollm2-135m; tiny-draft has tiny's byte vocabulary: the engine would refuse it at start
    p = problems("drafter=draft_model", "drafter.draft_model_path=tiny-draft")["drafter.draft_model_path"]
    assert p.value == "tiny-draft" and "target's vocabulary" in p.allowed and "smollm2-135m" in p.allowed
    assert "drafter=layer_skip" in p.allowed
    p = problems(TINY, "drafter=draft_model", "drafter.draft_model_path=smollm2-135m")["drafter.draft_model_path"]
    assert "byte vocabulary" in p.allowed and "tiny-draft" in p.allowed
    assert problems(TINY, "drafter=draft_model", "drafter.draft_model_path=tiny-draft") == {}


# ---------------------------------------------------------------- rules SGLang checks only at start-up
# (workers/sglang/startup_rules.py; the parser accepts these points: tests/workers/sglang/test_argv.py OURS_ONLY)


def test_fa3_refused_on_architectures_its_factory_asserts_against(caplog):
    from workers.sglang import startup_rules

    fa3 = ("engine=sglang", "model=qwen3-8b", "attention=fa3", "drafter=ngram")
    for arch in ("sm_120", "sm_100"):
        p = problems(*fa3, f"cluster.accelerator={arch}")["attention.backend"]
        assert p.value == "fa3" and f"cluster.accelerator={arch}" in p.allowed and "SM 8.x" in p.allowed
    assert problems(*fa3, "cluster.accelerator=sm_90") == {}
    assert problems(*fa3, "cluster.accelerator=sm_86") == {}
    mla = ("engine=sglang", "model=deepseek-v3", "attention=fa3", "drafter=none", "tp_size=8")
    assert "only without MLA" in problems(*mla, "cluster.accelerator=sm_80")["attention.backend"].allowed
    assert problems(*mla, "cluster.accelerator=sm_90") == {}
    draft = ("engine=sglang", "model=qwen3-8b", "attention=triton", "drafter=eagle3", "drafter.draft_model_path=x",
             "attention.draft_backend=fa3", "cluster.accelerator=sm_120")
    assert problems(*draft)["attention.draft_backend"].value == "fa3"
    startup_rules._warned.clear()
    with caplog.at_level("WARNING", logger="workers.sglang.startup_rules"):
        assert problems(*fa3) == {}  # not judged without an accelerator: a warning says so
    assert "attention.backend=fa3 with cluster.accelerator=None" in caplog.text and "set cluster.accelerator" in caplog.text


def test_torch_native_cannot_verify():
    p = problems("engine=sglang", "model=qwen3-8b", "attention=torch_native", "drafter=ngram", "page_size=1")
    assert p["attention.backend"].value == "torch_native" and "warm-up" in p["attention.backend"].allowed
    assert problems("engine=sglang", "model=qwen3-8b", "attention=torch_native", "drafter=none") == {}
    split = (*EAGLE, "attention=triton", "attention.draft_backend=triton")
    p = problems(*split, "attention.prefill_backend=torch_native")["attention.prefill_backend"]
    assert "drafter.algorithm=EAGLE3" in p.allowed
    # the decode half does not verify unless the mode says so
    assert problems(*split, "attention.decode_backend=torch_native") == {}
    p = problems(*split, "attention.decode_backend=torch_native", "attention.speculative_attention_mode=decode")
    assert p["attention.decode_backend"].value == "torch_native"


def test_hpc_ops_refused_with_speculation():
    import dataclasses

    def hpc_ops(drafter: str):  # not in conf/attention: the backend set on the typed config
        rc = run_config("engine=sglang", "model=qwen3-8b", "attention=triton", "page_size=64", drafter)
        return validate_run(dataclasses.replace(rc, attention=dataclasses.replace(rc.attention, backend="hpc_ops")))

    assert hpc_ops("drafter=none") == []
    (p,) = hpc_ops("drafter=ngram")
    assert (p.key, p.value) == ("attention.backend", "hpc_ops") and "refuses speculative decoding" in p.allowed


def test_weights_that_cannot_fit_are_refused():
    ds = ("engine=sglang", "model=deepseek-v3", "attention=triton", "drafter=none")
    p = problems(*ds)["tp_size"]  # 671e9 fp8 bytes = 624.9 GiB on one GPU: no GPU has that
    assert p.value == 1 and p.allowed.startswith(">= 3 for model deepseek-v3") and "624.9 GiB" in p.allowed
    assert "the largest GPU known (sm_103)" in p.allowed
    assert problems(*ds, "tp_size=8") == {}
    p = problems(*ds, "tp_size=4", "cluster.accelerator=sm_90")["tp_size"]  # 156 GiB per GPU > 144
    assert p.allowed.startswith(">= 5") and "cluster.accelerator=sm_90" in p.allowed
    # 78.1 GiB per GPU: SGLang resolves mem_fraction_static 0.8 on an 80 GiB GPU at tp 8, so weights get < 64 GiB
    p = problems(*ds, "tp_size=8", "cluster.gpu_memory_gib=80")["tp_size"]
    assert p.allowed.startswith(">= 10") and "mem_fraction_static 0.8, as SGLang resolves it" in p.allowed
    assert problems(*ds, "tp_size=8", "cluster.gpu_memory_gib=141") == {}  # 0.887 of 141 GiB
    p = problems(*ds, "tp_size=8", "cluster.gpu_memory_gib=141", "engine.sglang.mem_fraction_static=0.5")["tp_size"]
    assert p.allowed.startswith(">= 9") and "engine.sglang.mem_fraction_static=0.5" in p.allowed
    # the KV cache the point needs counts too: weights alone fit (78.1 < 0.833 x 96 = 80.0 GiB), not with 4 x 65600 tokens
    fits = ("tp_size=8", "cluster.gpu_memory_gib=96")
    assert problems(*ds, *fits) == {}
    p = problems(*ds, *fits, "context_len=65536", "probe.concurrency=4")["tp_size"]
    assert "less 262400 tokens of KV cache" in p.allowed
    # the oracle's draft worker loads the target a second time
    q = ("engine=sglang", "model=qwen3-8b", "attention=triton", "cluster.gpu_memory_gib=24")
    assert problems(*q, "drafter=ngram") == {}  # 15.3 GiB
    assert "twice" in problems(*q, "drafter=oracle")["tp_size"].allowed
    assert problems(*q, "cluster.gpu_memory_gib=0")["cluster.gpu_memory_gib"].allowed == "a finite number in (0, 65536]"
    assert "float8_e4m3fn" in problems(*q, "model.weight_dtype=fp9")["model.weight_dtype"].allowed


def test_startup_rules_refuse_before_anything_starts(monkeypatch):
    """The single-run entry refuses at validation: neither the preflight nor execution (Ray) is reached."""
    from orchestrator.session import launcher
    from orchestrator.session import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "preflight_before_start", lambda *a, **k: pytest.fail("preflight reached"))
    monkeypatch.setattr(sweep_module, "sweep_plan", lambda *a, **k: pytest.fail("execution reached"))
    overrides = ["engine=sglang", "model=deepseek-v3", "attention=fa3", "drafter=none", "cluster.accelerator=sm_120"]
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with pytest.raises(launcher.InvalidConfig) as e:
        launcher.run_single(cfg, overrides)
    assert "attention.backend='fa3'" in str(e.value) and "tp_size=1" in str(e.value)


def test_load_format_has_a_declared_domain_and_each_engine_its_own():
    """A closed set: refused at conversion with the key, the value and every format an engine here takes, before
    Ray or an engine starts; then each engine's own subset (the reference engine's parser, SGLang's per version)."""
    p = problems(TINY, "model.load_format=bogus")["model.load_format"]
    assert p.value == "bogus" and "safetensors" in p.allowed and "runai_streamer" in p.allowed
    p = problems(TINY, "model.load_format=pt")["model.load_format"]
    assert p.allowed == "one of auto, safetensors, gguf, dummy on engine=reference"
    assert problems(*SGLANG, "drafter=none", "model.load_format=pt") == {}
    p = problems(*SGLANG, "drafter=none", "model.load_format=expert_pack", "engine.version=0.5.10")["model.load_format"]
    assert "on SGLang 0.5.10" in p.allowed and "expert_pack" not in p.allowed
    assert "float8_e4m3fn" in problems(*SGLANG, "model.weight_dtype=fp9")["model.weight_dtype"].allowed


def test_a_file_that_cannot_be_read_is_a_problem_naming_key_and_path(tmp_path):
    """Every file the plan reads goes through one reader (specsweep_common/problem.py read_file): an OSError (EIO from
    /proc/self/mem: a regular, readable file whose read fails) is a problem with the key, the value and the path."""
    p = problems("probe=file", "probe.path=/proc/self/mem")["probe.path"]
    assert p.value == "/proc/self/mem" and p.allowed.startswith("a readable file (/proc/")  # resolved: /proc/<pid>
    assert p.allowed.endswith("/mem: Input/output error, errno 5)")
    from specsweep_common.problem import ProblemError, read_file

    with pytest.raises(ProblemError) as e:
        read_file("model.path", "m", str(tmp_path))  # a folder: EISDIR
    assert e.value.problem.key == "model.path" and f"({tmp_path}: Is a directory, errno 21)" in e.value.problem.allowed
