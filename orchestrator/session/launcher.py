"""The work behind the `specsweep` Hydra launcher, and the single-run path of `python -m orchestrator`.

compose every job → convert to `RunConfig` → validate all (one `ConfigError` listing every invalid
point, before any Ray or MLflow work) → plan → resume filter → execute → one `JobReturn` per job.

Exit codes: an invalid config exits 1 (Hydra prints the `InvalidConfig` message, nothing started), and so does
a sweep whose every point exceeds the model's context. Before Ray or MLflow start, `preflight_before_start`
exits 1 on what the config alone rules out, on servers needing more GPUs than this machine really has
(cluster=local) and on a tracking store that does not answer within 10 s (`ClusterCannotFit`,
`TrackingUnreachable`); once Ray is up, a sweep the Ray cluster can never fit exits 1 too (the Ray preflight,
before MLflow and any engine). `hydra.launcher.dry_run=true` stops after these checks and the plan, sweep or
single run alike (it does not probe the tracking store).
A sweep that ran exits 0 even when some runs FAILED: failures are data (MLflow child runs with a
reason, the final table); every job's JobReturn is COMPLETED with the `RunResult` as return value, so
Hydra never re-raises one run's failure. A single run (no sweep) exits 1 when its run FAILED.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence, cast

from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from orchestrator.plan import NotRun, Plan, plan_resume, plan_sweep
from orchestrator.schema import RunConfig, override_key_problems, register_configs, to_run_config
from orchestrator.settings import ClusterKind, ExecutionSettings
from specsweep_vocab.spec import EngineKind, FailureReason, RunResult, RunSpec, RunState
from orchestrator.validate import ConfigError, Problem, every_point_over_context, validate_run

if TYPE_CHECKING:
    from hydra.types import HydraContext

    from orchestrator.tracking import Tracker


class LauncherState(Protocol):
    """What this module reads of the Hydra plugin's launcher (`hydra_plugins/specsweep_launcher`): the plugin calls
    down into this module, never the other way, so the plugin is described here instead of imported."""

    config: DictConfig | None
    hydra_context: HydraContext | None
    dry_run: bool

log = logging.getLogger(__name__)

# Keys that describe the sweep, not a point: one value per sweep.
SWEEP_LEVEL = ("sweep_name", "cluster", "tracking", "resume", "progress", "report")


class InvalidConfig(CompactHydraException):
    """Hydra prints only this message (no traceback) and exits 1."""


class ClusterCannotFit(CompactHydraException):
    """The preflight found servers the Ray cluster can never place: exit 1, nothing launched or recorded."""


class TrackingUnreachable(CompactHydraException):
    """tracking.uri does not answer: exit 1 before Ray, MLflow or any engine starts."""


class RunFailed(CompactHydraException):
    """A single run (not a sweep) that ended FAILED: exit 1."""


def convert_and_validate(jobs: Sequence[tuple[DictConfig, Sequence[str]]], *, sweep: bool,
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
        problems += validate_run(rc, check_max_context=not sweep)
        configs.append(rc)
    problems += sweep_level_problems(configs)
    if sweep and not problems and (p := every_point_over_context(configs)):
        problems.append(p)
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
    """Execution's part of the config: every ExecutionSettings field is a RunConfig field of the same name,
    but the working directory."""
    shared = {f.name: getattr(rc, f.name) for f in dataclasses.fields(ExecutionSettings) if f.name != "work_dir"}
    return ExecutionSettings(**shared, work_dir=cwd)


def _on_this_machine(settings: ExecutionSettings) -> bool:
    """cluster=local starts its own Ray here, unless the driver is a Ray Job (RAY_ADDRESS) or Ray is already up."""
    ray = sys.modules.get("ray")
    return (settings.cluster.kind is ClusterKind.LOCAL and os.environ.get("RAY_ADDRESS", "local") == "local"
            and not (ray is not None and ray.is_initialized()))


def preflight_before_start(plan: Plan, settings: ExecutionSettings, *, dry_run: bool) -> None:
    """Before Ray or MLflow start: what the config alone rules out (cluster.gpus_per_node), with cluster=local
    the GPUs really on this machine, and (not in a dry run) whether tracking.uri answers within 10 s."""
    from orchestrator.preflight import PreflightError, check_declared, probe_tracking, run_local_preflight
    from specsweep_vocab.redact import redact_text

    try:
        if problems := check_declared(plan.groups, settings.cluster):
            raise PreflightError(problems, f"cluster.gpus_per_node={settings.cluster.gpus_per_node} (declared)")
        if _on_this_machine(settings):
            run_local_preflight(plan.groups, settings.cluster)
    except PreflightError as e:
        raise ClusterCannotFit(str(e)) from None
    if not dry_run and (why := probe_tracking(settings.tracking_uri)):
        raise TrackingUnreachable(f"tracking.uri={redact_text(settings.tracking_uri)!r} cannot be reached: "
                                  f"{redact_text(why)}; "
                                  "nothing was started")


@dataclass
class Executed:
    """What `execute_plan` did: the results, how many FINISHED runs resume skipped, the plan that ran, and the
    runs left to another live driver that held them (job index -> which driver)."""

    results: list[RunResult]
    skipped: int
    ran: Plan
    held: dict[int, str] = field(default_factory=dict)

    def __iter__(self):  # results, skipped, ran = execute_plan(...)
        return iter((self.results, self.skipped, self.ran))


def execute_plan(plan: Plan, settings: ExecutionSettings) -> Executed:
    """The edge: Ray and the cluster preflight (ClusterCannotFit before MLflow is touched), then, under the
    store's lock (orchestrator.tracking): close RUNNING runs of drivers that are gone (`driver_lost`), skip run_hashes
    FINISHED (with `resume`) or claimed by another live driver, begin the parent and claim the rest; then the runs,
    on the same Ray session (`run_plan` neither connects nor runs the preflight again).

    MLflow's import (≈ 1.7 s) runs in a thread while Ray starts; it writes nothing (the store is only opened
    after the preflight)."""
    from orchestrator.execute import run_plan
    from orchestrator.preflight import PreflightError
    from orchestrator.ray_session import ray_session
    from orchestrator.recording import warm_mlflow

    threading.Thread(target=warm_mlflow, args=(settings.tracking_uri,), name="mlflow-import", daemon=True).start()
    try:
        with ray_session(settings.cluster, plan.groups) as session:
            from orchestrator.tracking import Tracker, experiment_for

            experiment = experiment_for(settings, plan)
            tracker = Tracker.from_settings(settings, plan)
            todo, skipped, held = _claim(plan, settings, tracker, experiment)
            if not todo.groups:
                log.info("nothing to run")
                return Executed([], skipped, todo, held)
            try:
                results = run_plan(todo, settings, tracker=tracker, session=session)
            except BaseException as e:  # run_plan closes what it was given; this covers a failure before it began
                _abandon(tracker, e)
                raise
            log.info("results: MLflow experiment %r in %s; browse with `mlflow ui --backend-store-uri %s` "
                     "(or `make ui`), report with `python -m orchestrator.report %s`", experiment,
                     tracker.redact(settings.tracking_uri), tracker.redact(settings.tracking_uri), experiment)
            log_held(plan.runs, held)
            return Executed(results, skipped, todo, held)
    except PreflightError as e:
        raise ClusterCannotFit(str(e)) from None


def _claim(plan: Plan, settings: ExecutionSettings, tracker: Tracker,
           experiment: str) -> tuple[Plan, int, dict[int, str]]:
    """Under the store's lock: close lost drivers' runs, leave out FINISHED (with `resume`) and held points, begin
    the parent and claim the rest. Returns the plan to run, how many FINISHED runs it skips, and the runs another
    live driver holds (job index -> which driver)."""
    with tracker.store_lock():
        tracker.reap_lost_drivers()
        todo, skipped = plan_resume(plan, tracker.finished_run_hashes()) if settings.resume else (plan, 0)
        if skipped:
            log.info("resume: skipping %d run(s) already FINISHED in experiment %r (resume=false re-runs them)",
                     skipped, experiment)
        claims = tracker.live_claims()
        todo = replace(plan_resume(todo, claims)[0], resumed=todo.resumed)  # held: not FINISHED yet
        ran = {r.job_index for r in todo.runs}
        held = {r.job_index: claims[r.run_hash] for r in plan.runs if r.job_index not in ran and r.run_hash in claims}
        log_held(plan.runs, held)
        try:
            if todo.groups:
                tracker.begin_parent(todo, work_dir=settings.work_dir)
                tracker.claim(todo.runs)
        except BaseException as e:  # e.g. Ctrl-C while claiming: nothing of this driver stays RUNNING
            _abandon(tracker, e)
            raise
    return todo, skipped, held


def _abandon(tracker: Tracker, error: BaseException) -> None:
    state = RunState.KILLED if isinstance(error, KeyboardInterrupt) else RunState.FAILED
    with contextlib.suppress(Exception):
        tracker.release_claims(state, FailureReason.INTERRUPTED if state is RunState.KILLED
                               else FailureReason.WORKER_ERROR, f"the driver stopped: {type(error).__name__}")
        tracker.end_parent(state)


def log_held(runs: Sequence[RunSpec], held: dict[int, str]) -> None:
    """The runs this driver left to other drivers: one line, then each run and who holds it."""
    if not held:
        return
    log.info("skipped %d run(s) another driver is running (it records them): %s", len(held),
             "; ".join(f"#{r.job_index} {r.name} [{held[r.job_index]}]" for r in runs if r.job_index in held))


def outcomes(all_runs: Sequence[RunSpec], plan: Plan, ran: Plan, results: Sequence[RunResult],
             held: dict[int, str] | None = None) -> dict[int, RunResult | NotRun]:
    """job index → what happened to it: a RunResult, or NotRun (dropped, skipped, held by another driver,
    no result)."""
    by_index: dict[int, RunResult | NotRun] = {r.run.job_index: r for r in results}
    held = held or {}
    dropped = {run.job_index: why for run, why in plan.dropped if run is not None}
    ran_idx = {r.job_index for r in ran.runs}
    for run in all_runs:
        i = run.job_index
        if i in by_index:
            continue
        if i in dropped:
            by_index[i] = NotRun(run, f"dropped: {dropped[i]}")
        elif i in held:
            by_index[i] = NotRun(run, f"skipped: another driver is running it ({held[i]})")
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


def launch(*, launcher: LauncherState, job_overrides: Sequence[Sequence[str]],
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
        return _launch_jobs(launcher, config, jobs, initial_job_idx, cwd)
    except (InvalidConfig, ClusterCannotFit, TrackingUnreachable):
        _remove_sweep_record(str(config.hydra.sweep.dir), cwd)
        raise


def _remove_sweep_record(sweep_dir: str, cwd: str) -> None:
    """Hydra's sweeper wrote `<hydra.sweep.dir>/multirun.yaml` before the launcher saw the jobs; a sweep refused
    before any run leaves nothing behind: the file, and the folders of a relative sweep dir once empty."""
    folder = Path(cwd, sweep_dir)
    if not folder.is_dir() or [p.name for p in folder.iterdir()] != ["multirun.yaml"]:
        return
    (folder / "multirun.yaml").unlink()
    made = [folder] if Path(sweep_dir).is_absolute() else [Path(cwd, *Path(sweep_dir).parts[:n])
                                                         for n in range(len(Path(sweep_dir).parts), 0, -1)]
    for d in made:
        try:
            d.rmdir()
        except OSError:  # not empty: other sweeps' records
            return


def _launch_jobs(launcher: LauncherState, config: DictConfig, jobs: list[tuple[DictConfig, Sequence[str]]],
                 initial_job_idx: int, cwd: str) -> list[JobReturn]:
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

    if plan.groups:
        preflight_before_start(plan, build_settings(configs[0], cwd), dry_run=launcher.dry_run)
    if launcher.dry_run or not plan.groups:
        by_index = dry_run_outcomes(plan)
        log.info("dry run: nothing started")
    else:
        done = execute_plan(plan, build_settings(configs[0], cwd))
        by_index = outcomes(all_runs, plan, done.ran, done.results, done.held)

    returns = []
    for i, (cfg, overrides) in enumerate(jobs):
        ret = JobReturn(overrides=list(overrides), cfg=_task_cfg(cfg), hydra_cfg=cfg,
                        working_dir=cwd, task_name=str(config.hydra.job.name), status=JobStatus.COMPLETED)
        ret.return_value = by_index.get(initial_job_idx + i)
        returns.append(ret)
    return returns


def launch_single(cfg: DictConfig, overrides: Sequence[str], *, dry_run: bool = False) -> RunResult | NotRun:
    """`python -m orchestrator [overrides]`: the same validation, plan, preflight and execution, one run;
    `dry_run` logs the plan and starts nothing."""
    cwd = os.getcwd()
    try:
        (rc,) = convert_and_validate([(cfg, overrides)], sweep=False, cwd=cwd)
    except ConfigError as e:
        raise InvalidConfig(str(e)) from None
    plan = plan_sweep(rc.sweep_name, [rc], drop_over_max=False, base_config=_task_container(cfg),
                      overrides=tuple(overrides))
    settings = build_settings(rc, cwd)
    preflight_before_start(plan, settings, dry_run=dry_run)
    if dry_run:
        outcome = dry_run_outcomes(plan)[plan.runs[0].job_index]
        log.info("dry run: nothing started")
        return outcome
    done = execute_plan(plan, settings)
    result = outcomes(plan.runs, plan, done.ran, done.results, done.held)[0]
    if isinstance(result, RunResult) and result.state is not RunState.FINISHED:
        raise RunFailed(f"run {result.run.name!r} {result.state.value}: "
                        f"{result.reason.value if result.reason else ''} {result.message}".rstrip())
    return result


def check_overrides(overrides: Sequence[str], *, cwd: str | None = None) -> list[Problem]:
    """Every problem `python -m orchestrator OVERRIDES` would refuse to start with (unknown keys, each grid point's
    values, a sweep with nothing to run), found without starting anything: `orchestrator.schedule` checks each
    schedule with it. The grid is expanded as Hydra's basic sweeper does."""
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
            jobs = [(compose("config", overrides=list(o)), o) for o in job_overrides]
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
    # the top-level keys of a composed config are all str
    task = OmegaConf.masked_copy(cfg, cast(list[str], [k for k in cfg.keys() if k != "hydra"]))
    return task  # type: ignore[return-value]


def _task_container(cfg: DictConfig) -> dict[str, Any]:
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    c.pop("hydra", None)
    return c  # type: ignore[return-value]
