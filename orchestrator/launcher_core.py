"""The work behind the `specsweep` Hydra launcher, and the single-run path of `python -m orchestrator`.

compose every job → convert to `RunConfig` → validate all (one `ConfigError` listing every invalid
point, before any Ray or MLflow work) → plan → resume filter → execute → one `JobReturn` per job.

Exit codes: an invalid config exits 1 (Hydra prints the `InvalidConfig` message, nothing started); so does
a sweep the Ray cluster can never fit (`ClusterCannotFit`: the preflight, before MLflow and any engine).
A sweep that ran exits 0 even when some runs FAILED: failures are data (MLflow child runs with a
reason, the final table); every job's JobReturn is COMPLETED with the `RunResult` as return value, so
Hydra never re-raises one run's failure. A single run (no sweep) exits 1 when its run FAILED.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from orchestrator.plan import NotRun, Plan, plan_resume, plan_sweep
from orchestrator.schema import RunConfig, register_configs, to_run_config
from orchestrator.spec import EngineKind, ExecutionSettings, RunResult, RunSpec, RunState
from orchestrator.validate import ConfigError, Problem, validate_run

if TYPE_CHECKING:
    from hydra_plugins.specsweep_launcher.specsweep_launcher import SpecsweepLauncher

log = logging.getLogger(__name__)

# Keys that describe the sweep, not a point: one value per sweep.
SWEEP_LEVEL = ("sweep_name", "cluster", "tracking", "resume", "progress", "report")


class InvalidConfig(CompactHydraException):
    """Hydra prints only this message (no traceback) and exits 1."""


class ClusterCannotFit(CompactHydraException):
    """The preflight found servers the Ray cluster can never place: exit 1, nothing launched or recorded."""


class RunFailed(CompactHydraException):
    """A single run (not a sweep) that ended FAILED: exit 1."""


def convert_and_validate(jobs: Sequence[tuple[DictConfig, Sequence[str]]], *, sweep: bool,
                         cwd: str) -> list[RunConfig]:
    """Every job's config typed and checked; raises one ConfigError listing every problem."""
    configs, problems = [], []
    for cfg, overrides in jobs:
        try:
            rc = to_run_config(cfg, tuple(overrides), cwd=cwd)
        except ConfigError as e:
            problems += e.problems
            continue
        problems += validate_run(rc, check_max_context=not sweep)
        configs.append(rc)
    problems += sweep_level_problems(configs)
    if problems:
        raise ConfigError(problems)
    return configs


def sweep_level_problems(configs: Sequence[RunConfig]) -> list[Problem]:
    out = []
    for key in SWEEP_LEVEL:
        values = {repr(getattr(rc, key)) for rc in configs}
        if len(values) > 1:
            out.append(Problem(key, sorted(values), "one value for the whole sweep (it is not a grid axis)"))
    kinds = {rc.engine.kind for rc in configs}
    if EngineKind.STUB in kinds and len(kinds) > 1:
        out.append(Problem("engine.kind", sorted(k.value for k in kinds),
                           "the stub engine alone or real engines alone in one sweep (stub runs are simulated and "
                           "recorded in their own experiment, `<sweep_name>-stub`)"))
    return out


def build_settings(rc: RunConfig, cwd: str) -> ExecutionSettings:
    return ExecutionSettings(sweep_name=rc.sweep_name, cluster=rc.cluster, tracking=rc.tracking,
                             resume=rc.resume, work_dir=cwd, progress=rc.progress,
                             report=rc.report)


def execute_plan(plan: Plan, settings: ExecutionSettings) -> tuple[list[RunResult], int, Plan]:
    """The edge: Ray and the cluster preflight (ClusterCannotFit before MLflow is touched), the resume
    lookup in MLflow, then the runs. Returns (results, skipped, the plan that ran).

    The lookup needs MLflow right after the preflight, so with `resume` MLflow's import (≈ 1.7 s) runs in a thread
    while Ray starts; it writes nothing (the store is only opened after the preflight)."""
    from orchestrator.execute import ray_session, run_plan, warm_mlflow
    from orchestrator.preflight import PreflightError

    if settings.resume:
        threading.Thread(target=warm_mlflow, args=(settings.tracking_uri,), name="mlflow-import", daemon=True).start()
    try:
        with ray_session(settings.cluster, plan.groups):
            from orchestrator.tracking import experiment_for, finished_run_hashes

            experiment = experiment_for(settings, plan)
            skipped = 0
            if settings.resume:
                plan, skipped = plan_resume(plan, finished_run_hashes(settings, plan))
                if skipped:
                    log.info("resume: skipping %d run(s) already FINISHED in experiment %r (resume=false re-runs "
                             "them)", skipped, experiment)
            if not plan.groups:
                log.info("nothing to run")
                return [], skipped, plan
            results = run_plan(plan, settings)
            log.info("results: MLflow experiment %r in %s; browse with `mlflow ui --backend-store-uri %s` "
                     "(or `make ui`), report with `python -m orchestrator.report %s`", experiment,
                     settings.tracking_uri, settings.tracking_uri, experiment)
            return results, skipped, plan
    except PreflightError as e:
        raise ClusterCannotFit(str(e)) from None


def outcomes(all_runs: Sequence[RunSpec], plan: Plan, ran: Plan,
             results: Sequence[RunResult]) -> dict[int, RunResult | NotRun]:
    """job index → what happened to it: a RunResult, or NotRun (dropped, skipped, no result)."""
    by_index: dict[int, RunResult | NotRun] = {r.run.job_index: r for r in results}
    dropped = {run.job_index: why for run, why in plan.dropped if run is not None}
    ran_idx = {r.job_index for r in ran.runs}
    for run in all_runs:
        i = run.job_index
        if i in by_index:
            continue
        if i in dropped:
            by_index[i] = NotRun(run, f"dropped: {dropped[i]}")
        elif i not in ran_idx:
            by_index[i] = NotRun(run, "skipped: already FINISHED in MLflow (resume)")
        else:
            by_index[i] = RunResult(run=run, state=RunState.FAILED, message="execution returned no result")
    return by_index


def dry_run_outcomes(plan: Plan) -> dict[int, RunResult | NotRun]:
    """Log the plan server by server; every job's outcome is NotRun."""
    for g in plan.groups:
        log.info("server %s (%d runs)", g.group_id, len(g.runs))
        for r in g.runs:
            log.info("  #%d %s  run_hash=%s", r.job_index, r.name, r.run_hash[:12])
    by_index: dict[int, RunResult | NotRun] = {r.job_index: NotRun(r, "dry run") for r in plan.runs}
    by_index.update({r.job_index: NotRun(r, f"dropped: {why}") for r, why in plan.dropped if r})
    return by_index


def launch(*, launcher: SpecsweepLauncher, job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int) -> list[JobReturn]:
    setup_globals()
    config = launcher.config
    assert config is not None and launcher.hydra_context is not None
    configure_log(config.hydra.job_logging, config.hydra.verbose)
    cwd = config.hydra.runtime.cwd or os.getcwd()
    loader = launcher.hydra_context.config_loader

    jobs: list[tuple[DictConfig, Sequence[str]]] = []
    for i, overrides in enumerate(job_overrides):
        cfg = loader.load_sweep_config(config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.id = cfg.hydra.job.num = initial_job_idx + i
        jobs.append((cfg, overrides))
    try:
        configs = convert_and_validate(jobs, sweep=True, cwd=cwd)
    except ConfigError as e:
        raise InvalidConfig(str(e)) from None

    sweep_overrides = tuple(OmegaConf.to_container(config.hydra.overrides.task))  # type: ignore[arg-type]
    base = _task_container(jobs[0][0]) if jobs else None
    plan = plan_sweep(configs[0].sweep_name if configs else "default", configs, base_config=base,
                      overrides=sweep_overrides, first_job_index=initial_job_idx)
    log.info("plan: %d run(s) on %d server(s)%s", plan.num_runs, len(plan.groups),
             f", {len(plan.dropped)} dropped" if plan.dropped else "")
    all_runs = [*plan.runs, *(r for r, _ in plan.dropped if r is not None)]

    if launcher.dry_run or not plan.groups:
        by_index = dry_run_outcomes(plan)
    else:
        results, _, ran = execute_plan(plan, build_settings(configs[0], cwd))
        by_index = outcomes(all_runs, plan, ran, results)

    returns = []
    for i, (cfg, overrides) in enumerate(jobs):
        ret = JobReturn(overrides=list(overrides), cfg=_task_cfg(cfg), hydra_cfg=cfg,
                        working_dir=cwd, task_name=str(config.hydra.job.name), status=JobStatus.COMPLETED)
        ret.return_value = by_index.get(initial_job_idx + i)
        returns.append(ret)
    return returns


def launch_single(cfg: DictConfig, overrides: Sequence[str]) -> RunResult | NotRun:
    """`python -m orchestrator [overrides]`: the same validation, plan and execution, one run."""
    cwd = os.getcwd()
    try:
        (rc,) = convert_and_validate([(cfg, overrides)], sweep=False, cwd=cwd)
    except ConfigError as e:
        raise InvalidConfig(str(e)) from None
    plan = plan_sweep(rc.sweep_name, [rc], drop_over_max=False, base_config=_task_container(cfg),
                      overrides=tuple(overrides))
    results, _, ran = execute_plan(plan, build_settings(rc, cwd))
    result = outcomes(plan.runs, plan, ran, results)[0]
    if isinstance(result, RunResult) and result.state is not RunState.FINISHED:
        raise RunFailed(f"run {result.run.name!r} {result.state.value}: "
                        f"{result.reason.value if result.reason else ''} {result.message}".rstrip())
    return result


def expand_grid(axes: dict[str, Sequence[Any]], *fixed: str) -> list[list[str]]:
    """{"context_len": [256, 1024], "drafter": ["ngram", "oracle"]} → one override list per job, in the
    basic sweeper's order (first key outermost), each ending with `fixed`."""
    keys = list(axes)
    return [[f"{k}={v}" for k, v in zip(keys, values)] + list(fixed)
            for values in itertools.product(*(axes[k] for k in keys))]


def plan_jobs(job_overrides: Sequence[Sequence[str]], *, sweep: bool = True,
              cwd: str | None = None) -> tuple[Plan, ExecutionSettings]:
    """Compose, validate and plan from Python (tests, benchmarks) without the Hydra app:
    `plan, settings = plan_jobs(expand_grid({...}, "sweep_name=bench")); run_plan(plan, settings)`.
    Raises ConfigError like the launcher. Needs no Hydra instance to be initialized."""
    from hydra import compose, initialize_config_module

    register_configs()
    cwd = cwd or os.getcwd()
    with initialize_config_module("conf", version_base="1.3"):
        jobs = [(compose("config", overrides=list(o)), o) for o in job_overrides]
    configs = convert_and_validate(jobs, sweep=sweep, cwd=cwd)
    plan = plan_sweep(configs[0].sweep_name, configs, drop_over_max=sweep, base_config=_task_container(jobs[0][0]))
    return plan, build_settings(configs[0], cwd)


def _task_cfg(cfg: DictConfig) -> DictConfig:
    task = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    return task  # type: ignore[return-value]


def _task_container(cfg: DictConfig) -> dict[str, Any]:
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    c.pop("hydra", None)
    return c  # type: ignore[return-value]
