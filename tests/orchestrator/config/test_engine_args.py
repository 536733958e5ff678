"""Flags the orchestrator owns cannot be overridden through extra_args, and the reference engine's own parser
reads the argv at validation (`engine.extra_args=[--host,0.0.0.0]` made the engine serve on every interface,
2026-12-02)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.engine_args import owned_flags
from orchestrator.config.jobs import convert_and_validate
from orchestrator.config.plan import build_server
from orchestrator.config.schema import register_configs
from orchestrator.config.config_error import ConfigError


def _jobs(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        return [(compose("config", overrides=list(overrides)), overrides)]


def _problems(*overrides: str):
    try:
        convert_and_validate(_jobs(*overrides), sweep=False, cwd="/tmp")
    except ConfigError as e:
        return {(p.key, str(p.value)): p for p in e.problems}
    return {}


@pytest.mark.parametrize("extra,key,flag", [
    ("engine.extra_args=[--host,0.0.0.0]", "engine.extra_args", "--host"),
    ("engine.extra_args=['--port=1']", "engine.extra_args", "--port"),
    ("engine.extra_args=[--context-length,99999]", "engine.extra_args", "--context-length"),
    ("drafter.extra_args=[--speculative-num-steps,9]", "drafter.extra_args", "--speculative-num-steps"),
])
def test_owned_flags_refused(extra, key, flag):
    for engine in ("engine=reference", "engine=stub"):
        p = _problems(engine, "drafter=ngram", extra)[(key, flag)]
        assert "no flag the orchestrator sets itself" in p.allowed


def test_owned_set_is_derived_from_the_built_argv():
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=["engine=sglang", "model=qwen3-8b", "attention=triton", "tp_size=2"])
    from orchestrator.config.schema import to_run_config

    owned = owned_flags(build_server(to_run_config(cfg, ())))
    assert {"--host", "--port", "--context-length", "--tp-size", "--model-path", "--page-size"} <= owned
    assert "--max-running-requests" not in owned  # not set by the plan: the user's to set


def test_reference_parser_reads_the_extra_args():
    p = _problems("engine.extra_args=[--no-such-flag,1]")[("engine.extra_args", "['--no-such-flag', '1']")]
    assert "unrecognized arguments: --no-such-flag" in p.allowed
    p = _problems("engine.extra_args=[--max-running-requests,zero]")[("engine.extra_args",
                                                                      "['--max-running-requests', 'zero']")]
    assert "--max-running-requests" in p.allowed
    assert _problems("model=tiny", "engine.extra_args=[--max-running-requests,8]") == {}
