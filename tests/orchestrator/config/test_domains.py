"""Every config leaf declares its domain once, beside its type, and one check enforces it for every grid point,
before anything starts: the refusal names the key, the value and what is allowed."""

from __future__ import annotations

import math
import typing

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.domains import schema_leaves
from orchestrator.config.jobs import convert_and_validate
from orchestrator.config.schema import SpecsweepConf, register_configs, to_run_config
from orchestrator.config.config_error import ConfigError
from specsweep_common.domain import NAME


def _value_type(tp):
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union else [tp]
    tp = args[0]
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0]
    return tp


def test_every_numeric_and_string_leaf_declares_a_domain():
    leaves = schema_leaves(SpecsweepConf)
    assert len(leaves) > 80  # the walk reaches every section
    missing = [key for key, tp, d in leaves if _value_type(tp) in (int, float, str) and d is None]
    assert missing == [], f"config leaves without a declared domain (field(metadata=domain(...))): {missing}"


def test_the_defaults_are_in_their_domains():
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        for overrides in ([], ["engine=stub"], ["engine=sglang", "model=qwen3-8b", "attention=triton"],
                          ["job=kernel"], ["tracking=server", "tracking.uri=http://h:5000"]):
            to_run_config(compose("config", overrides=overrides), tuple(overrides), cwd="/tmp")


def _refusal(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    with pytest.raises(ConfigError) as e:
        convert_and_validate([(cfg, overrides)], sweep=False, cwd="/tmp")
    return e.value


# values tried as a careful user would (2026-12-02, 46 bad inputs; 35 started Ray first): each reached Ray or
# the engine before
@pytest.mark.parametrize("override,key,allowed", [
    ("engine.startup_timeout_s=-5", "engine.startup_timeout_s", "(0, 604800]"),
    ("engine.request_timeout_s=0", "engine.request_timeout_s", "(0, 604800]"),
    ("engine.request_timeout_s=nan", "engine.request_timeout_s", "finite"),
    ("engine.stub.token_s=inf", "engine.stub.token_s", "finite"),
    ("cluster.num_cpus=0", "cluster.num_cpus", "[1, 65536]"),
    ("cluster.cpus_per_server=-1", "cluster.cpus_per_server", "(0, 4096]"),
    ("cluster.num_gpus=-1", "cluster.num_gpus", "[0, 65536]"),
    ("cluster.max_retries=-1", "cluster.max_retries", "[0, 100]"),
    ("cluster.max_concurrent_servers=0", "cluster.max_concurrent_servers", "[1, 65536]"),
    ("report.novel_gap=nan", "report.novel_gap", "finite number in [0, 1]"),
    (f"seed={2 ** 64}", "seed", "[0, 4294967295]"),
    ("page_size=100000000", "page_size", "[1, 4096]"),
    ("probe.concurrency=5000", "probe.concurrency", "[1, 1024]"),
    ("probe.repeats=0", "probe.repeats", "[1, 64]"),
    ("probe.repeats=65", "probe.repeats", "[1, 64]"),
    ("sweep_name=../../x", "sweep_name", "no path separator"),
    ("sweep_name=''", "sweep_name", "a name of 1 to 100"),
    ("tracking.experiment_name=a/b", "tracking.experiment_name", "no path separator"),
    ("model.dtype=float8", "model.dtype", "one of float32, float16, bfloat16"),
])
def test_declared_domain_refused_naming_key_value_allowed(override, key, allowed):
    extra = ("engine=stub",) if key.startswith(("engine.stub", "probe.concurrency")) else ()
    err = _refusal(*extra, override)
    (p,) = [p for p in err.problems if p.key == key]
    assert allowed in p.allowed, p
    value = override.split("=", 1)[1].strip("'")
    assert str(p).startswith(f"{key}="), str(p)
    if isinstance(p.value, float) and math.isnan(p.value):
        assert value == "nan"
    else:
        assert str(p.value) == value or repr(p.value) == value or float(p.value) == float(value)
    assert "Traceback" not in str(err)


# The range checks the rules used to repeat (validate.py, the engines' rules: "an integer >= 1", "a number of
# seconds >= 0", "null or a fraction in (0, 1)", ...): each of these values is refused by its declared domain at
# conversion, before any rule runs, so the rules no longer check them. (extra overrides, override, key)
DOMAIN_ONLY = [
    ((), "page_size=0", "page_size"), ((), "context_len=0", "context_len"), ((), "gen_tokens=0", "gen_tokens"),
    ((), "probe.concurrency=0", "probe.concurrency"), ((), "tp_size=0", "tp_size"), ((), "nnodes=0", "nnodes"),
    ((), "server_context_len=0", "server_context_len"), ((), "model.max_context_len=0", "model.max_context_len"),
    ((), "model.num_layers=0", "model.num_layers"), ((), "model.hidden_size=0", "model.hidden_size"),
    ((), "model.num_q_heads=0", "model.num_q_heads"), ((), "model.num_kv_heads=0", "model.num_kv_heads"),
    ((), "model.head_dim=0", "model.head_dim"), ((), "model.v_head_dim=0", "model.v_head_dim"),
    (("drafter=layer_skip",), "drafter.draft_num_layers=0", "drafter.draft_num_layers"),
    (("engine=sglang", "model=qwen3-8b"), "attention.speculative_attention_mode=verify",
     "attention.speculative_attention_mode"),
    (("engine=sglang", "model=qwen3-8b"), "engine.sglang.mem_fraction_static=1.0", "engine.sglang.mem_fraction_static"),
    (("engine=sglang", "model=qwen3-8b"), "engine.sglang.cuda_graph_max_bs=0", "engine.sglang.cuda_graph_max_bs"),
    (("engine=sglang", "model=qwen3-8b"), "engine.sglang.max_running_requests=0",
     "engine.sglang.max_running_requests"),
    (("engine=sglang", "model=qwen3-8b"), "cluster.gpu_memory_gib=0", "cluster.gpu_memory_gib"),
    (("engine=stub",), "engine.stub.token_s=-1", "engine.stub.token_s"),
    (("engine=stub",), "engine.stub.startup_s=nan", "engine.stub.startup_s"),
    (("engine=stub",), "engine.stub.rendezvous_timeout_s=0", "engine.stub.rendezvous_timeout_s"),
    (("job=kernel",), "kernel.prefix=0", "kernel.prefix"), (("job=kernel",), "kernel.tokens=0", "kernel.tokens"),
    (("job=kernel",), "kernel.num_q_heads=0", "kernel.num_q_heads"),
    (("job=kernel",), "kernel.head_dim=0", "kernel.head_dim"),
]


@pytest.mark.parametrize("extra,override,key", DOMAIN_ONLY, ids=[o for _, o, _ in DOMAIN_ONLY])
def test_ranges_the_rules_no_longer_check_are_refused_by_their_domain_at_conversion(extra, override, key):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=[*extra, override])
    with pytest.raises(ConfigError) as e:
        to_run_config(cfg, (*extra, override), cwd="/tmp")  # the conversion alone: no rule has run
    (p,) = [p for p in e.value.problems if p.key == key]
    assert p.allowed.startswith(("an integer in [", "a finite number in ", "one of ")), p


def test_every_grid_point_is_checked():
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        jobs = [(compose("config", overrides=o), o) for o in (["page_size=16"], ["page_size=0"],
                                                                ["page_size=9999"])]
    with pytest.raises(ConfigError) as e:
        convert_and_validate(jobs, sweep=True, cwd="/tmp")
    assert sorted(p.value for p in e.value.problems) == [0, 9999]


@pytest.mark.parametrize("name,ok", [
    ("nightly", True), ("ctx-sweep_2026.12", True), ("a=b,c", True), ("x" * 100, True),
    ("", False), ("../../x", False), ("a/b", False), ("a\\b", False), ("..", False), (".hidden", False),
    ("-rf", False), ("a..b", False), ("x" * 101, False), ("a b", False), ("a\0b", False),
])
def test_one_rule_for_names_that_become_paths(name, ok):
    assert (NAME.why_not(name) is None) is ok
