"""Hydra jobs to validated `RunConfig`s, and a plan of them from Python without the Hydra app.

    convert_and_validate(jobs, *, sweep, cwd) -> list[RunConfig]   composed configs typed and checked, all at once
    check_overrides(overrides) -> list[Problem]     what `python -m orchestrator OVERRIDES` would refuse
    expand_grid(axes, *fixed) -> list[list[str]]    one override list per grid point (the basic sweeper's order)
    plan_jobs(job_overrides) -> (Plan, ExecutionSettings)   compose, validate and plan (tests, benchmarks)
    compose_jobs(job_overrides, *, fast=True) -> [dict]     each job's resolved config (orchestrator.config.grid)
    build_settings(rc, cwd) -> ExecutionSettings    execution's part of a config

Validation is all or nothing: one `ConfigError` lists every problem of every point, before any Ray or MLflow work.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Mapping, Sequence, cast

from omegaconf import DictConfig, OmegaConf

from orchestrator.config.engine_args import engine_arg_problems
from orchestrator.config.grid import compose_grid, hydra_group_test
from orchestrator.config.model_facts import model_fact_problems
from orchestrator.config.plan import Plan, plan_sweep
from orchestrator.config.overrides import override_key_problems
from orchestrator.config.schema import RunConfig, register_configs, to_run_config
from orchestrator.config.settings import ExecutionSettings
from orchestrator.config.context import every_point_over_context
from orchestrator.config.config_error import ConfigError
from orchestrator.config.validate import validate_run
from specsweep_common.problem import Problem
from specsweep_common.spec import JobKind, engine_mix_allowed

# Keys that describe the sweep, not a point: one value per sweep.
SWEEP_LEVEL = ("sweep_name", "cluster", "tracking", "resume", "progress", "report")


def convert_and_validate(jobs: Sequence[tuple[DictConfig | Mapping[str, Any], Sequence[str]]], *, sweep: bool,
                         cwd: str) -> list[RunConfig]:
    """Every job's config typed and checked; raises one ConfigError listing every problem."""
    configs: list[RunConfig] = []
    problems: list[Problem] = []
    for cfg, overrides in jobs:
        try:
            rc = to_run_config(cfg, tuple(overrides), cwd=cwd)
        except ConfigError as e:
            problems += e.problems
            continue
        facts = model_fact_problems(rc) if rc.job is JobKind.ENGINE else []
        problems += facts or validate_run(rc, check_max_context=not sweep)  # the context rule needs true facts
        configs.append(rc)
    problems += engine_arg_problems(configs)
    problems += sweep_level_problems(configs)
    if sweep and not problems and (p := every_point_over_context(configs)):
        problems.append(p)
    if problems:  # one rule and the generic checks may name the same key and value: once
        raise ConfigError({(p.key, repr(p.value), p.overrides): p for p in problems}.values())
    return configs


def sweep_level_problems(configs: Sequence[RunConfig]) -> list[Problem]:
    out = []
    for key in SWEEP_LEVEL:
        values = {repr(getattr(rc, key)) for rc in configs}
        if len(values) > 1:
            out.append(Problem(key, sorted(values), "one value for the whole sweep (it is not a grid axis)"))
    kinds = {rc.engine.kind for rc in configs}
    if allowed := engine_mix_allowed(kinds):
        out.append(Problem("engine.kind", sorted(k.value for k in kinds), allowed))
    return out


def build_settings(rc: RunConfig, cwd: str) -> ExecutionSettings:
    """Execution's part of the config: every ExecutionSettings field is a RunConfig field of the same name,
    but the working directory."""
    shared = {f.name: getattr(rc, f.name) for f in dataclasses.fields(ExecutionSettings) if f.name != "work_dir"}
    return ExecutionSettings(**shared, work_dir=cwd)


def check_overrides(overrides: Sequence[str], *, cwd: str | None = None) -> list[Problem]:
    """Every problem `python -m orchestrator OVERRIDES` would refuse to start with (unknown keys, each grid point's
    values, a sweep with nothing to run), found without starting anything: the schedules check each schedule
    with it. The grid is expanded as Hydra's basic sweeper does."""
    from hydra import compose, initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from hydra.types import RunMode

    if problems := override_key_problems(overrides):
        return problems
    register_configs()
    try:
        parser = OverridesParser.create()
        # parse_overrides sets input_line on every override it returns
        fixed = [cast(str, o.input_line) for o in parser.parse_overrides(list(overrides)) if not o.is_sweep_override()]
        with initialize_config_module("conf", version_base="1.3"):
            base = compose("config", overrides=fixed, return_hydra_config=True)
            sweep = base.hydra.mode == RunMode.MULTIRUN
            job_overrides: Sequence[Sequence[str]] = [list(overrides)]
            if sweep:
                params = [f"{k}={v}" for k, v in base.hydra.sweeper.params.items()] + list(overrides)
                (job_overrides,) = BasicSweeper.split_arguments(parser.parse_overrides(params), None)
            jobs = list(zip(compose_jobs(job_overrides), job_overrides))
    except HydraException as e:
        return [Problem("overrides", list(overrides), f"overrides Hydra can compose ({str(e).splitlines()[0]})")]
    try:
        convert_and_validate(jobs, sweep=sweep, cwd=cwd or os.getcwd())
    except ConfigError as e:
        return list(e.problems)
    return []


def expand_grid(axes: dict[str, Sequence[Any]], *fixed: str) -> list[list[str]]:
    """{"context_len": [256, 1024], "drafter": ["ngram", "oracle"]} → one override list per job, in the
    basic sweeper's order (first key outermost), each ending with `fixed`."""
    keys = list(axes)
    return [[f"{k}={v}" for k, v in zip(keys, values)] + list(fixed)
            for values in itertools.product(*(axes[k] for k in keys))]


def plan_jobs(job_overrides: Sequence[Sequence[str]], *, sweep: bool = True,
              cwd: str | None = None) -> tuple[Plan, ExecutionSettings]:
    """Compose, validate and plan from Python (tests, benchmarks) without the Hydra app:
    `plan, settings = plan_jobs(expand_grid({...}, "sweep_name=bench")); execute_plan(plan, settings)`.
    Raises ConfigError like the launcher. Needs no Hydra instance to be initialized."""
    from hydra import initialize_config_module

    register_configs()
    cwd = cwd or os.getcwd()
    with initialize_config_module("conf", version_base="1.3"):
        jobs = list(zip(compose_jobs(job_overrides), job_overrides))
    configs = convert_and_validate(jobs, sweep=sweep, cwd=cwd)
    plan = plan_sweep(configs[0].sweep_name, configs, drop_over_max=sweep, base_config=dict(jobs[0][0]))
    return plan, build_settings(configs[0], cwd)


def compose_jobs(job_overrides: Sequence[Sequence[str]], *, fast: bool = True) -> list[dict[str, Any]]:
    """Each job's resolved config (plain dicts), inside an initialized Hydra (`initialize_config_module`): composed
    once per distinct choice of config groups (`orchestrator.config.grid`); `fast=False` composes every job in
    full, the reference the fast path is tested against."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    def full(overrides: list[str]) -> DictConfig:
        return compose("config", overrides=overrides, return_hydra_config=True)

    return compose_grid(job_overrides, full, hydra_group_test(GlobalHydra.instance().config_loader()), fast=fast)


def task_container(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as a plain dict, resolved, without Hydra's own `hydra` node (the parent run's params)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    c.pop("hydra", None)
    return c  # type: ignore[return-value]
