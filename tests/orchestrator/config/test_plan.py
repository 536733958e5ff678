"""Planning: pure functions over RunConfigs (no Ray, MLflow, engine)."""

from __future__ import annotations

import logging
from dataclasses import replace

from hydra import compose, initialize_config_module

from orchestrator.config.plan import build_name, build_run, format_tokens, plan_resume, plan_sweep
from orchestrator.config.schema import register_configs, to_run_config


def run_config(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return to_run_config(cfg, overrides, cwd="/tmp")


def grid(contexts=(1024, 4096), probes=("predictable", "novel"), drafters=("ngram", "oracle"), pages=(1, 16),
         extra=()):
    """Job configs in the BasicSweeper's order (first key outermost)."""
    return [run_config(f"context_len={c}", f"probe={p}", f"drafter={d}", f"page_size={s}", *extra)
            for c in contexts for p in probes for d in drafters for s in pages]


def test_groups_by_server_without_context():
    plan = plan_sweep("t", grid())
    assert plan.num_runs == 16 and len(plan.groups) == 4  # drafter x page size
    for g in plan.groups:
        assert {r.server for r in g.runs} == {g.server}
        assert g.server.server_context_len == 8192  # the default model's (smollm2-135m) max covers every context
        assert [r.job_index for r in g.runs] == sorted(r.job_index for r in g.runs)
    assert [g.runs[0].job_index for g in plan.groups] == [0, 1, 2, 3]  # by first job: deterministic
    assert [r.job_index for r in plan.runs] == list(range(16))
    assert len({r.run_hash for r in plan.runs}) == 16


def test_run_hash_is_stable_and_ignores_names():
    a, b = build_run(run_config("drafter=ngram"), 0), build_run(run_config("drafter=ngram"), 7)
    assert a.run_hash == b.run_hash and len(a.run_hash) == 64
    renamed = replace(a.server, model=replace(a.server.model, name="other"))
    from specsweep_common.spec import stable_hash
    assert stable_hash(renamed, a.probe) == a.run_hash
    assert build_run(run_config("drafter=ngram", "context_len=2048"), 0).server == a.server
    assert build_run(run_config("drafter=ngram", "context_len=2048"), 0).run_hash != a.run_hash
    assert build_run(run_config("drafter=ngram", "seed=1"), 0).run_hash != a.run_hash


def test_server_context_len_override():
    assert build_run(run_config("server_context_len=8192"), 0).server.server_context_len == 8192


def test_human_name():
    rc = run_config("context_len=16384", "probe=predictable", "drafter=ngram", "page_size=1")
    assert build_name(rc) == "ctx=16k probe=predictable drafter=ngram page=1 attn=torch"
    rc = run_config("context_len=189440", "model=qwen3-8b", "+sweep=longctx", "tracking.uri=sqlite:///x.db")
    assert build_name(rc) == "ctx=185k probe=predictable drafter=ngram page=16 attn=torch model=qwen3-8b"
    assert [format_tokens(n) for n in (256, 1000, 1024, 131072)] == ["256", "1000", "1k", "128k"]


def test_over_max_points_dropped_with_one_log_line(caplog):
    configs = grid(contexts=(1024, 65536, 131072))
    with caplog.at_level(logging.INFO, logger="orchestrator.config.plan"):
        plan = plan_sweep("t", configs)
    assert plan.num_runs == 8 and len(plan.dropped) == 16
    assert all(run.probe.context_len > 8192 and "context_len" in why for run, why in plan.dropped)
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(lines) == 1
    assert "dropped 16 of 24" in lines[0] and "65536, 131072" in lines[0] and "8192" in lines[0]


def test_single_run_is_not_dropped():
    plan = plan_sweep("t", [run_config()], drop_over_max=False)
    assert plan.num_runs == 1 and len(plan.groups) == 1 and not plan.dropped


def test_resume_filter():
    plan = plan_sweep("t", grid())
    finished = {r.run_hash for r in plan.groups[0].runs} | {plan.groups[1].runs[0].run_hash, "unrelated"}
    resumed, skipped = plan_resume(plan, finished)
    assert skipped == len(plan.groups[0].runs) + 1
    assert len(resumed.groups) == 3  # the fully finished group starts no server
    assert resumed.num_runs == plan.num_runs - skipped
    assert plan_resume(plan, set()) == (plan, 0)


def test_plan_is_reproducible():
    assert plan_sweep("t", grid()) == plan_sweep("t", grid())


def test_duplicate_points_are_planned_once_with_a_warning(caplog):
    """The same point twice (an axis value listed twice) is measured once, and the log says so."""
    from orchestrator.config.jobs import plan_jobs

    with caplog.at_level("WARNING"):
        plan, _ = plan_jobs([["model=tiny", "context_len=64"], ["model=tiny", "context_len=64"],
                             ["model=tiny", "context_len=128"]])
    assert plan.num_runs == 2
    (dup,) = [(r, why) for r, why in plan.dropped if r is not None]
    assert dup[0].job_index == 1 and "the same point as job 0: planned once" in dup[1]
    assert "1 duplicate grid point(s) planned once" in caplog.text


def test_points_sglang_would_refuse_are_said_on_the_reference_engine(caplog):
    """The reference engine serves prompt + gen_tokens == context; SGLang (which it rehearses) keeps two slots more
    and refuses the request: the plan serves the point and says so, once, naming the edge."""
    edge = ("model=tiny", "server_context_len=1088", "gen_tokens=64")
    configs = [run_config(*edge, "context_len=1024"), run_config(*edge, "context_len=1000")]
    with caplog.at_level(logging.WARNING, logger="orchestrator.config.plan"):
        plan = plan_sweep("t", configs)
    assert plan.num_runs == 2 and not plan.dropped
    (line,) = [r.getMessage() for r in caplog.records if "engine=sglang" in r.getMessage()]
    assert line.startswith("1 grid point(s) are served")
    assert "context_len 1024 + gen_tokens 64 against server context 1088" in line and "+ 2 <= 1088" in line
