"""The grid's fast composition (orchestrator/config/grid.py) gives exactly what composing every job in full gives:
the same configs, the same plan (run hashes, names, params, servers) and the same refusals; and it composes once
per distinct choice of config groups, not once per point."""

from __future__ import annotations

import os

import pytest
from hydra import initialize_config_module
from hydra.errors import HydraException

from orchestrator.config.jobs import compose_jobs, convert_and_validate, expand_grid
from orchestrator.config.plan import plan_sweep
from orchestrator.config.schema import register_configs
from orchestrator.config.config_error import ConfigError

FIXED = ("engine=stub", "model=tiny", "gen_tokens=32", "sweep_name=grid-test")


def _compose(jobs, *, fast):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        return compose_jobs(jobs, fast=fast)


def _plan(jobs, composed):
    configs = convert_and_validate(list(zip(composed, jobs)), sweep=True, cwd=os.getcwd())
    plan = plan_sweep(configs[0].sweep_name, configs, base_config=composed[0])
    return [(r.job_index, r.run_hash, r.name, r.params, r.overrides, r.server) for r in plan.runs], plan.dropped


def _refusals(jobs, composed):
    with pytest.raises(ConfigError) as e:
        convert_and_validate(list(zip(composed, jobs)), sweep=True, cwd=os.getcwd())
    return [(p.key, repr(p.value), p.allowed, p.overrides) for p in e.value.problems]


# group axes, plain axes, a dict value that merges, a key added under a dict, a list value, an interpolation's source
# (model.path feeds drafter.draft_model_path: those jobs compose in full), one key twice in one job
SAMPLE = [
    *expand_grid({"drafter": ["ngram", "oracle"], "probe": ["predictable", "novel"], "context_len": [64, 256],
                  "seed": [0, 1]}, *FIXED),
    [*FIXED, "drafter=oracle", "engine.stub={token_s: 0.002}"],
    [*FIXED, "+engine.env.SPECSWEEP_GRID_TEST=1", "context_len=128"],
    [*FIXED, "metrics.log_patterns=['x=(?P<x>\\d+)']"],
    [*FIXED, "drafter=oracle", "model.path=tiny"],
    [*FIXED, "seed=3", "seed=4"],
    [*FIXED, "engine.stub.token_s=0.003", "engine.stub={prefill_s: 0.0}"],
]


def test_the_fast_path_plans_exactly_what_composing_every_job_plans():
    fast, slow = _compose(SAMPLE, fast=True), _compose(SAMPLE, fast=False)
    for job, a, b in zip(SAMPLE, fast, slow):
        assert repr(a) == repr(b), job  # repr: 1 is not 1.0 nor True, and nan is nan
    assert repr(_plan(SAMPLE, fast)) == repr(_plan(SAMPLE, slow))


def test_the_fast_path_refuses_exactly_what_composing_every_job_refuses():
    jobs = [*expand_grid({"page_size": [0, 16], "context_len": [64, 40000], "drafter": ["ngram", "oracle"]}, *FIXED),
            [*FIXED, "engine.stub.token_s=-1"], [*FIXED, "report.novel_gap=nan"], [*FIXED, "seed=18446744073709551616"],
            [*FIXED, "drafter=oracle", "model.path=/nonexistent/elsewhere.gguf"]]
    fast, slow = _compose(jobs, fast=True), _compose(jobs, fast=False)
    assert repr(fast) == repr(slow)
    assert repr(_refusals(jobs, fast)) == repr(_refusals(jobs, slow))


@pytest.mark.parametrize("bad", ["page_size=abc", "+context_len=5", "no_such_key=1", "engine.stub.token_s=[1]"])
def test_an_override_hydra_cannot_apply_fails_with_hydras_own_error(bad):
    jobs = [[*FIXED, "context_len=64"], [*FIXED, bad]]
    with pytest.raises(HydraException) as fast:
        _compose(jobs, fast=True)
    with pytest.raises(HydraException) as slow:
        _compose(jobs, fast=False)
    assert type(fast.value) is type(slow.value) and str(fast.value) == str(slow.value)


def test_hydra_composes_once_per_choice_of_config_groups_not_once_per_point():
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    from orchestrator.config.grid import compose_grid, hydra_group_test

    jobs = expand_grid({"drafter": ["ngram", "oracle"], "probe": ["predictable", "novel"],
                        "context_len": [64, 128, 256, 512, 1024], "seed": range(10)}, *FIXED)
    calls = []

    def full(overrides):
        calls.append(tuple(overrides))
        return compose("config", overrides=overrides, return_hydra_config=True)

    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        composed = compose_grid(jobs, full, hydra_group_test(GlobalHydra.instance().config_loader()))
    assert len(composed) == 200
    assert len(calls) == 4  # drafter x probe; context_len and seed are applied to a copy
    assert {c["context_len"] for c in composed} == {64, 128, 256, 512, 1024}


def test_the_sweeper_leaves_composition_to_the_launcher():
    """Hydra's basic sweeper composes every job before the launch (`validate_batch_is_legal`): ~0.15 s a point."""
    from hydra import compose

    from hydra_plugins.specsweep_launcher.specsweep_launcher import SpecsweepSweeper

    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=["+sweep=smoke"], return_hydra_config=True)
    assert cfg.hydra.sweeper._target_.endswith("SpecsweepSweeper")
    assert dict(cfg.hydra.sweeper.params) == {"context_len": "256,1024", "probe": "predictable,novel",
                                              "drafter": "ngram,oracle"}
    sweeper = SpecsweepSweeper(max_batch_size=None)
    sweeper.validate_batch_is_legal([["no_such_key=1"]])  # would raise in Hydra's own sweeper: composes nothing


@pytest.mark.parametrize("overrides, key, value, says", [
    (["model=tiny", "model=smollm2-135m"], "model", ["tiny", "smollm2-135m"], "one value per config group"),
    (["+sweep=smoke", "drafter=ngram", "drafter=oracle"], "drafter", ["ngram", "oracle"], "drafter=ngram,oracle"),
    (["model=tiny", "+model=smollm2-135m"], "+model", "smollm2-135m", "already selects a model (smollm2-135m)"),
    (["+model=tiny"], "+model", "tiny", "model=tiny"),
    (["seed=1,2", "seed=3"], "seed", ["1,2", "3"], "seed=1,2,3"),
    (["seed=1", "++seed=2"], "seed", ["1", "2"], "one value per key"),
])
def test_conflicting_overrides_are_refused_naming_the_key_the_values_and_what_is_allowed(overrides, key, value, says):
    """Hydra 1.3.8 keeps the last of `model=tiny model=smollm2-135m` silently and answers `model=tiny
    +model=smollm2-135m` with "model appears more than once in the final defaults list"."""
    from orchestrator.config.overrides import override_key_problems

    problems = override_key_problems(overrides)
    assert any(p.key == key and p.value == value and says in p.allowed for p in problems), problems


@pytest.mark.parametrize("overrides", [["model=tiny", "model=tiny"], ["+sweep=smoke", "model=smollm2-135m"],
                                       ["engine=stub", "engine.stub.token_s=0.1"], ["seed=1,2"]])
def test_what_does_not_conflict_passes(overrides):
    """The same value twice; the command line over a sweep file's choice; a group and a key under it."""
    from orchestrator.config.overrides import override_key_problems

    assert override_key_problems(overrides) == []


def test_a_secret_given_twice_is_not_printed():
    from orchestrator.config.overrides import override_key_problems
    from orchestrator.config.config_error import ConfigError

    (p,) = override_key_problems(["engine.env.HF_TOKEN=abcdefgh", "engine.env.HF_TOKEN=ijklmnop"])
    assert "abcdefgh" not in str(ConfigError([p])) and "ijklmnop" not in str(ConfigError([p]))
