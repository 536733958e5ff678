"""The `specsweep` sweeper's hand-off when `hydra.sweeper.load` is set (hydra_plugins/specsweep_launcher):

    specsweep +load=NAME [overrides]            the load curve of the one configuration the overrides give
    specsweep +tune=NAME +load=NAME             after the tune, the load curve of each batch size's winner

    check_load(config, hydra_context, arguments) -> LoadSettings   before anything starts (InvalidLoad: exit 1)
    run_load(config, hydra_context, arguments, settings) -> [Curve]
    run_tune_load(config, hydra_context, arguments, settings, tune_result) -> [Curve]

Exit codes: invalid settings or a configuration no load generator can run against exits 1 before any server
starts (`InvalidLoad`, naming the key, the value and what is allowed); every curve failing exits 1 (`LoadFailed`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Sequence

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from orchestrator.config.config_error import ConfigError, Problem
from orchestrator.load.settings import KEY_PREFIX, LoadSettings, limits, settings_problems, to_load_settings

if TYPE_CHECKING:
    from hydra.types import HydraContext

    from orchestrator.config.run_config import RunConfig
    from orchestrator.load.run import Curve

log = logging.getLogger(__name__)

# overrides that do not change the server: left out of a configuration's label
NOT_SERVER_KEYS = ("hydra", "load", "tune", "sweep", "context_len", "gen_tokens", "probe", "cluster", "tracking",
                   "resume", "report", "progress")


class InvalidLoad(CompactHydraException):
    """Hydra prints only this message and exits 1: nothing started."""


class LoadFailed(CompactHydraException):
    """No configuration's load curve was measured (exit 1); the runs say why."""


def _compose(config: DictConfig, hydra_context: HydraContext, jobs: Sequence[Sequence[str]]) -> list[RunConfig]:
    from orchestrator.config.grid import compose_grid, hydra_group_test
    from orchestrator.config.jobs import convert_and_validate

    loader = hydra_context.config_loader
    composed = compose_grid(jobs, lambda o: loader.load_sweep_config(config, list(o)), hydra_group_test(loader))
    cwd = config.hydra.runtime.cwd or os.getcwd()
    return convert_and_validate(list(zip(composed, jobs)), sweep=True, cwd=cwd)


def _server_problems(rc: RunConfig) -> list[Problem]:
    from workers.registry import adapter_for

    out = []
    if not adapter_for(rc.engine.kind).serves_load_generator:
        out.append(Problem("engine.kind", rc.engine.kind.value, "an engine that SGLang's bench_serving runs against "
                           "and that keeps SGLang's per-request record (the reference engine or SGLang): "
                           f"{KEY_PREFIX}* needs one"))
    if rc.nnodes > 1:
        out.append(Problem("nnodes", rc.nnodes, f"1: {KEY_PREFIX}* runs bench_serving beside a one-node server"))
    return out


def check_load(config: DictConfig, hydra_context: HydraContext, arguments: Sequence[str]) -> LoadSettings:
    """The load settings and the configuration's engine, checked before Ray, MLflow or any server starts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    container = OmegaConf.to_container(config.hydra.sweeper.load, resolve=True)
    assert isinstance(container, dict)
    values = {str(k): v for k, v in container.items()}
    problems = settings_problems(values)
    if config.hydra.sweeper.get("tune") is None:
        problems += [Problem(o.key_or_group, o.input_line, "one value: a load curve is of one configuration (its "
                             f"levels are {KEY_PREFIX}concurrency / request_rates)", tuple(arguments))
                     for o in OverridesParser.create().parse_overrides(list(arguments)) if o.is_sweep_override()]
    if problems:
        raise InvalidLoad(str(ConfigError(problems)))
    try:
        (rc,) = _compose(config, hydra_context, [list(arguments)])
    except ConfigError as e:
        raise InvalidLoad(str(e)) from None
    if problems := _server_problems(rc):
        raise InvalidLoad(str(ConfigError(problems)))
    return to_load_settings(values)


def _label(arguments: Sequence[str], rc: RunConfig) -> str:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [str(o.input_line) for o in OverridesParser.create().parse_overrides(list(arguments))
            if not o.key_or_group.lstrip("+~").startswith(NOT_SERVER_KEYS)]
    return " ".join(keys) or f"drafter={rc.drafter.name}"


def _finish(curves: list[Curve]) -> list[Curve]:
    for c in curves:
        if c.table:
            log.info("load curve (run %s)\n%s", c.run_id, c.table)
    if not any(c.levels for c in curves):
        raise LoadFailed("no load curve was measured: " + "; ".join(f"{c.label}: {c.error}" for c in curves))
    return curves


def run_load(config: DictConfig, hydra_context: HydraContext, arguments: Sequence[str],
             settings: LoadSettings) -> list[Curve]:
    from hydra.core.utils import configure_log, setup_globals

    from orchestrator.config.jobs import build_settings
    from orchestrator.config.plan import plan_sweep
    from orchestrator.load.run import run_curves
    from orchestrator.session.sweep import preflight_before_start

    setup_globals()
    configure_log(config.hydra.job_logging, config.hydra.verbose)
    (rc,) = _compose(config, hydra_context, [list(arguments)])
    cwd = config.hydra.runtime.cwd or os.getcwd()
    exec_settings = build_settings(rc, cwd)
    preflight_before_start(plan_sweep(rc.sweep_name, [rc]), exec_settings, dry_run=False)
    return _finish(run_curves({_label(arguments, rc): rc}, settings, limits(settings), exec_settings))


def run_tune_load(config: DictConfig, hydra_context: HydraContext, arguments: Sequence[str], settings: LoadSettings,
                  result: Any) -> list[Curve]:
    """After a tune: one load curve per distinct winner of its answer (each batch size's), nested under the tune's
    run, the report and the Pareto chart of all of them on the tune's run. The latency limits default to the
    tune's, read on each level's p99 (`limits`)."""
    from orchestrator.config.jobs import build_settings
    from orchestrator.load.run import run_curves
    from orchestrator.results.tracking import Tracker, experiment_for
    from orchestrator.tune.rounds import STUDY_TAG

    winners: dict[str, tuple[str, int]] = {}
    for row in result.rows:
        w = row.pick.winner
        winners.setdefault(w.key, (w.label or "no speculation", row.context_len))
    if not winners:
        log.warning("load curves: the tune has no winner to measure")
        return []
    keys = list(winners)
    jobs = [[*arguments, *k.split(), f"context_len={winners[k][1]}"] for k in keys]
    configs = _compose(config, hydra_context, jobs)
    cwd = config.hydra.runtime.cwd or os.getcwd()
    exec_settings = build_settings(configs[0], cwd)
    from orchestrator.config.plan import plan_sweep

    tracker = Tracker(exec_settings.tracking_uri, experiment_for(exec_settings, plan_sweep(configs[0].sweep_name,
                                                                                           configs)))  # reads only
    found = tracker.client.search_runs([tracker.experiment_id], f"tags.`{STUDY_TAG}` = '{result.study}'",
                                       max_results=1)
    tune_run = found[0].info.run_id if found else None
    tune = config.hydra.sweeper.tune
    lim = limits(settings, tune.get("max_tpot_ms"), tune.get("max_ttft_s"))
    labelled = {winners[k][0]: rc for k, rc in zip(keys, configs)}
    return _finish(run_curves(labelled, settings, lim, exec_settings, parent_run_id=tune_run,
                              report_run_id=tune_run))
