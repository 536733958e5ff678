"""An engine's plan-time rules and estimates are its own: the config layer asks the engine's adapter
(workers/registry.py `adapter_for`) and names no engine itself, and each estimate is the edge of its rule."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.schema import register_configs, to_run_config
from orchestrator.config.validate import validate_run
from specsweep_common.plan_point import PlanPoint
from specsweep_common.problem import Problem
from specsweep_common.spec import EngineKind
from workers import registry
from workers.adapter import EngineAdapter
from workers.registry import adapter_for


def run_config(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return to_run_config(cfg, overrides, cwd="/tmp")


def keys(rc) -> dict[str, Problem]:
    return {p.key: p for p in validate_run(rc)}


def test_validate_run_asks_the_points_engine_and_only_it(monkeypatch):
    """A rule added to an engine's adapter reaches validation with no change to orchestrator/config: what a new
    engine's folder adds is all it takes."""

    class Refusing(type(adapter_for(EngineKind.STUB))):  # type: ignore[misc]
        def plan_problems(self, point: PlanPoint) -> list[Problem]:
            return [Problem("engine.kind", point.engine.kind.value, "a test's own rule", point.overrides)]

        def context_problem(self, point: PlanPoint) -> Problem | None:
            return Problem("context_len", point.probe.context_len, "a test's own context rule", point.overrides)

    monkeypatch.setitem(registry._ADAPTERS, EngineKind.STUB, Refusing())
    stub = keys(run_config("engine=stub"))
    assert stub["engine.kind"].allowed == "a test's own rule" and stub["context_len"].allowed.startswith("a test")
    assert keys(run_config("model=tiny")) == {}  # the reference engine's adapter is not asked for the stub's rules


def test_each_engine_keeps_its_own_refusals():
    ref = keys(run_config("model=tiny", "attention.speculative_attention_mode=decode", "tp_size=2"))
    assert ref["attention.speculative_attention_mode"].allowed.startswith("null on engine=reference")
    assert ref["tp_size"].allowed == "1 on engine=reference"
    sglang = keys(run_config("engine=sglang", "model=qwen3-8b", "attention=triton", "model.path=tiny"))
    assert "built into the reference engine" in sglang["model.path"].allowed  # the reference engine's names
    # SGLang may run past the model's length (the default rule of an engine that cannot is not SGLang's)
    assert "server_context_len" in keys(run_config("model=tiny", "server_context_len=65536"))
    assert "server_context_len" not in keys(run_config("engine=sglang", "model=qwen3-8b", "attention=triton",
                                                       "server_context_len=65536"))


def test_the_reference_estimate_is_the_edge_of_its_concurrency_rule():
    rc = run_config("model=tiny", "drafter=oracle", "context_len=8192")
    n = adapter_for(EngineKind.REFERENCE).resource_estimate(rc).max_concurrency
    assert n is not None and 1 < n < 48  # the KV pool binds, not --max-running-requests
    at = dataclasses.replace(rc, probe=dataclasses.replace(rc.probe, concurrency=n))
    over = dataclasses.replace(rc, probe=dataclasses.replace(rc.probe, concurrency=n + 1))
    assert "probe.concurrency" not in keys(at)
    assert f"<= {n} at context_len 8192" in keys(over)["probe.concurrency"].allowed


def test_the_sglang_estimates_are_the_edges_of_its_rules():
    rc = run_config("engine=sglang", "model=deepseek-v3", "attention=triton", "drafter=ngram", "tp_size=8")
    est = adapter_for(EngineKind.SGLANG).resource_estimate(rc)
    assert est.max_concurrency == 48 and est.min_tp_size > 1
    fits = dataclasses.replace(rc, tp_size=est.min_tp_size)
    short = dataclasses.replace(rc, tp_size=est.min_tp_size - 1)
    assert "tp_size" not in keys(fits)
    assert keys(short)["tp_size"].allowed.startswith(f">= {est.min_tp_size} for model deepseek-v3")
    over = dataclasses.replace(rc, probe=dataclasses.replace(rc.probe, concurrency=49))
    assert "<= 48, the server's max running requests" in keys(over)["probe.concurrency"].allowed


@pytest.mark.parametrize("kind", list(EngineKind))
def test_every_engine_kind_has_an_adapter_with_the_plan_time_interface(kind):
    adapter = adapter_for(kind)
    assert adapter.kind is kind and isinstance(adapter, EngineAdapter)
    for method in ("plan_problems", "context_problem", "draft_path_allowed", "resource_estimate", "owned_flags",
                   "argv_problem", "model_file"):
        assert callable(getattr(adapter, method))


def test_a_probe_task_is_checked_against_the_models_chat_frame_at_plan_time():
    """probe.task (conf/probe/story.yaml) on the reference engine: a context too short for the chat template's frame
    is refused before any work, naming context_len and the frame's size; the story probe as `make run` uses it is
    accepted, and a task-free probe is never asked about a template."""
    short = keys(run_config("model=smollm2-135m", "probe=story", "context_len=40"))
    assert "chat template and probe.task" in short["context_len"].allowed
    assert "context_len" not in keys(run_config("model=smollm2-135m", "probe=story", "context_len=1024"))
    assert "probe.task" not in keys(run_config("model=tiny", "probe=novel", "context_len=16"))
