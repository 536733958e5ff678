"""The work behind the `specsweep` Hydra launcher, and the single-run path of `python -m orchestrator`.

compose every job → convert to `RunConfig` → validate all (one `ConfigError` listing every invalid
point, before any Ray or MLflow work) → plan → preflight → run the sweep (resume, claims, execution) → one
`JobReturn` per job.

    launch(launcher=..., job_overrides=..., initial_job_idx=...)   Hydra's `Launcher.launch`: every job of a multirun
    run_single(cfg, overrides, *, dry_run) -> RunResult | NotRun   `python -m orchestrator [overrides]`: one run

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

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from orchestrator.config.grid import compose_grid, hydra_group_test
from orchestrator.config.jobs import build_settings, convert_and_validate, task_container
from orchestrator.config.plan import plan_sweep
from orchestrator.config.config_error import ConfigError
from orchestrator.execution.progress import live_status, set_phase
from orchestrator.session import sweep
from orchestrator.session.outcomes import NotRun, dry_run_outcomes, outcomes
from orchestrator.session.sweep import ClusterCannotFit, ResourceUnusable, TrackingUnreachable, preflight_before_start
from specsweep_common.spec import RunResult, RunState

if TYPE_CHECKING:
    from hydra.types import HydraContext


class LauncherState(Protocol):
    """What this module reads of the Hydra plugin's launcher (`hydra_plugins/specsweep_launcher`): the plugin calls
    down into this module, never the other way, so the plugin is described here instead of imported."""

    config: DictConfig | None
    hydra_context: HydraContext | None
    dry_run: bool

log = logging.getLogger(__name__)


class InvalidConfig(CompactHydraException):
    """Hydra prints only this message (no traceback) and exits 1."""


class RunFailed(CompactHydraException):
    """A single run (not a sweep) that ended FAILED: exit 1."""


def launch(*, launcher: LauncherState, job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int) -> list[JobReturn]:
    setup_globals()
    config = launcher.config
    assert config is not None and launcher.hydra_context is not None
    configure_log(config.hydra.job_logging, config.hydra.verbose)
    cwd = config.hydra.runtime.cwd or os.getcwd()
    loader = launcher.hydra_context.config_loader

    # once per distinct choice of config groups, plain-key overrides applied to a copy (orchestrator.config.grid)
    try:
        composed = compose_grid(job_overrides, lambda o: loader.load_sweep_config(config, o), hydra_group_test(loader))
    except InterpolationResolutionError as e:  # `tracking.uri=${oc.env:MLFLOW_TRACKING_URI}` with the variable unset
        _remove_sweep_record(str(config.hydra.sweep.dir), cwd)
        raise InvalidConfig(f"{e.full_key}: {(e.msg or str(e)).splitlines()[0]}; allowed: an interpolation that resolves (for ${{oc.env:NAME}}, "
                            f"NAME set in the driver's environment)") from None
    jobs = list(zip(composed, job_overrides))
    try:
        with live_status(enabled=not launcher.dry_run):  # the phases and a ticking clock from here on
            return _sweep_jobs(launcher, config, jobs, initial_job_idx, cwd)
    except (InvalidConfig, ClusterCannotFit, TrackingUnreachable, ResourceUnusable):
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


def _sweep_jobs(launcher: LauncherState, config: DictConfig, jobs: list[tuple[dict[str, Any], Sequence[str]]],
                initial_job_idx: int, cwd: str) -> list[JobReturn]:
    set_phase(f"validating {len(jobs)} job(s)")
    try:
        configs = convert_and_validate(jobs, sweep=True, cwd=cwd)
    except ConfigError as e:
        raise InvalidConfig(str(e)) from None

    sweep_overrides = tuple(OmegaConf.to_container(config.hydra.overrides.task))  # type: ignore[arg-type]
    base = jobs[0][0] if jobs else None
    plan = plan_sweep(configs[0].sweep_name if configs else "specsweep", configs, base_config=base,
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
        done = sweep.sweep_plan(plan, build_settings(configs[0], cwd))
        by_index = outcomes(all_runs, plan, done.ran, done.results, done.held)

    returns = []
    for i, (_, overrides) in enumerate(jobs):
        # no per-job DictConfig (building one costs ms a point): Hydra reads only the return value of a JobReturn
        ret = JobReturn(overrides=list(overrides), working_dir=cwd, task_name=str(config.hydra.job.name),
                        status=JobStatus.COMPLETED)
        ret.return_value = by_index.get(initial_job_idx + i)
        returns.append(ret)
    return returns


def run_single(cfg: DictConfig, overrides: Sequence[str], *, dry_run: bool = False) -> RunResult | NotRun:
    """`python -m orchestrator [overrides]`: the same validation, plan, preflight and execution, one run;
    `dry_run` logs the plan and starts nothing."""
    cwd = os.getcwd()
    try:
        (rc,) = convert_and_validate([(cfg, overrides)], sweep=False, cwd=cwd)
    except ConfigError as e:
        raise InvalidConfig(str(e)) from None
    plan = plan_sweep(rc.sweep_name, [rc], drop_over_max=False, base_config=task_container(cfg),
                      overrides=tuple(overrides))
    settings = build_settings(rc, cwd)
    preflight_before_start(plan, settings, dry_run=dry_run)
    if dry_run:
        outcome = dry_run_outcomes(plan)[plan.runs[0].job_index]
        log.info("dry run: nothing started")
        return outcome
    with live_status():
        done = sweep.sweep_plan(plan, settings)
    result = outcomes(plan.runs, plan, done.ran, done.results, done.held)[0]
    if isinstance(result, RunResult) and result.state is not RunState.FINISHED:
        raise RunFailed(f"run {result.run.name!r} {result.state.value}: "
                        f"{result.reason.value if result.reason else ''} {result.message}".rstrip())
    return result
