"""The work behind the `specsweep` Hydra sweeper with `hydra.sweeper.tune` set (hydra_plugins/specsweep_launcher):
`specsweep +tune=NAME`.

    run_tune(config, hydra_context, arguments) -> TuneResult

Why our own sweeper over Optuna, not hydra-optuna-sweeper: that plugin hands each batch of `n_jobs` trials to the
launcher as a multirun of its own (`OptunaSweeperImpl.sweep`: `self.launcher.launch(overrides, ...)` per batch), so
the whole space is never validated before work starts, and a job's return value must be one float (or one per
objective) from a task function, while here a trial is a server configuration measured at every batch size on one
server and judged afterwards (repeats, the robust winner). It also has no place for a conditioned space but a Python
hook (`custom_search_space`), and no way to stop on a diagnosis. The sampler, the study and its RDB storage are
Optuna's, used directly (orchestrator/tune/study.py).

Exit codes: an invalid tune (settings, space, any override) exits 1 before anything starts (`InvalidConfig`); a
pipeline bug found by the sentinel exits 1 with the finding (`PipelineBugFound`); Ctrl-C as any sweep.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from orchestrator.config.config_error import ConfigError, Problem
from orchestrator.tune.search import PipelineBug, TuneRequest, TuneResult, tune

if TYPE_CHECKING:
    from hydra.types import HydraContext


class InvalidTune(CompactHydraException):
    """Hydra prints only this message and exits 1: nothing started."""


class PipelineBugFound(CompactHydraException):
    """The sentinel oracle found a pipeline bug: the tune stopped with the finding (exit 1)."""


def _grid_overrides(arguments: Sequence[str]) -> list[Problem]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [Problem(o.key_or_group, o.input_line, "one value: a tune searches hydra.sweeper.tune.space (set values there) "
                    "and runs hydra.sweeper.tune.batch_sizes / context_lens as its workload", tuple(arguments))
            for o in OverridesParser.create().parse_overrides(list(arguments)) if o.is_sweep_override()]


def run_tune(config: DictConfig, hydra_context: HydraContext, arguments: Sequence[str]) -> TuneResult:
    from hydra.core.utils import configure_log, setup_globals

    from orchestrator.config.grid import compose_grid, hydra_group_test
    from orchestrator.execution.progress import live_status

    setup_globals()
    configure_log(config.hydra.job_logging, config.hydra.verbose)
    loader = hydra_context.config_loader
    container = OmegaConf.to_container(config.hydra.sweeper.tune, resolve=True)
    assert isinstance(container, dict)
    settings = {str(k): v for k, v in container.items()}
    cwd = config.hydra.runtime.cwd or os.getcwd()

    def compose(jobs: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        return compose_grid(jobs, lambda o: loader.load_sweep_config(config, list(o)), hydra_group_test(loader))

    if problems := _grid_overrides(arguments):
        raise InvalidTune(str(ConfigError(problems)))
    try:
        with live_status():
            return tune(TuneRequest(settings, tuple(arguments), compose, cwd))
    except ConfigError as e:
        raise InvalidTune(str(e)) from None
    except PipelineBug as e:
        raise PipelineBugFound(str(e)) from None
