"""Hydra discovers this launcher and these sweepers by scanning the `hydra_plugins` namespace package.

The launcher is a shell: `launch()` hands every job of the multirun at once to
`orchestrator.session.launcher`, which validates, plans and executes them as one sweep.
The sweeper is Hydra's basic sweeper (the same grid, the same order) without its own composition of every job
before the launch (`Sweeper.validate_batch_is_legal`, there for launchers that compose elsewhere): our launcher
composes every job in this process right away, raising the same errors, and composes each distinct choice of
config groups once (`orchestrator.config.grid`), which the sweeper's check would undo at ~0.15 s a point.
With `hydra.sweeper.tune` set (by a `conf/tune/<name>.yaml`: `specsweep +tune=NAME`), the sweeper hands the search
to `orchestrator.tune.entry` instead: Optuna chooses the points (docs/tune.md). With `hydra.sweeper.load` set (by a
`conf/load/<name>.yaml`: `specsweep +load=NAME`), it runs SGLang's bench_serving at each load level against the one
configuration the overrides give, or, beside a tune, against each batch size's winner (`orchestrator.load.entry`).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class SpecsweepLauncherConf:
    _target_: str = "hydra_plugins.specsweep_launcher.specsweep_launcher.SpecsweepLauncher"
    dry_run: bool = False  # validate and plan only: log the plan, start nothing


ConfigStore.instance().store(group="hydra/launcher", name="specsweep", node=SpecsweepLauncherConf,
                             provider="specsweep")


def _tune_conf() -> Any:
    """`hydra.sweeper.tune`: `orchestrator.tune.settings.TuneSettings`'s fields (declared there once)."""
    from orchestrator.config.schema import structured_conf
    from orchestrator.tune.settings import TuneSettings

    return structured_conf(TuneSettings, "TuneConf",
                           replace={"space": [("space", Dict[str, Any], field(default_factory=dict))]})


TuneConf = _tune_conf()


def _load_conf() -> Any:
    """`hydra.sweeper.load`: `orchestrator.load.settings.LoadSettings`' fields. The levels are lists of any value,
    so that a wrong one is refused by our check, naming what is allowed (not by OmegaConf's type conversion)."""
    from orchestrator.config.schema import structured_conf
    from orchestrator.load.settings import LoadSettings

    return structured_conf(LoadSettings, "LoadConf", replace={
        "concurrency": [("concurrency", List[Any], field(default_factory=lambda: [1, 4, 16]))],
        "request_rates": [("request_rates", List[Any], field(default_factory=list))]})


LoadConf = _load_conf()


@dataclass
class SpecsweepSweeperConf:
    _target_: str = "hydra_plugins.specsweep_launcher.specsweep_launcher.SpecsweepSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None
    # set (by a conf/tune/<name>.yaml): Optuna chooses the points instead of the grid of `params` (orchestrator/tune)
    tune: Optional[TuneConf] = None  # type: ignore[valid-type]
    # set (by a conf/load/<name>.yaml): bench_serving's load curves of a configuration, or of the tune's winners
    load: Optional[LoadConf] = None  # type: ignore[valid-type]


ConfigStore.instance().store(group="hydra/sweeper", name="specsweep", node=SpecsweepSweeperConf,
                             provider="specsweep")


class SpecsweepSweeper(BasicSweeper):
    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[DictConfig] = None,
                 tune: Optional[DictConfig] = None, load: Optional[DictConfig] = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.tune = tune
        self.load = load

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Nothing here: the launcher composes the batch in this process before anything starts."""

    def sweep(self, arguments: List[str]) -> Any:
        if self.tune is None and self.load is None:
            return super().sweep(arguments)
        assert self.config is not None and self.hydra_context is not None
        settings = None
        if self.load is not None:  # checked before the tune or any server starts
            from orchestrator.load.entry import check_load

            settings = check_load(self.config, self.hydra_context, arguments)
        if self.tune is None:
            from orchestrator.load.entry import run_load

            return run_load(self.config, self.hydra_context, arguments, settings)
        from orchestrator.tune.entry import run_tune

        result = run_tune(self.config, self.hydra_context, arguments)
        if settings is not None:
            from orchestrator.load.entry import run_tune_load

            run_tune_load(self.config, self.hydra_context, arguments, settings, result)
        return result


class SpecsweepLauncher(Launcher):
    def __init__(self, dry_run: bool = False) -> None:
        self.dry_run = dry_run
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from orchestrator.session import launcher

        assert self.config is not None and self.hydra_context is not None
        return launcher.launch(launcher=self, job_overrides=job_overrides, initial_job_idx=initial_job_idx)

    def __repr__(self) -> Any:
        return f"SpecsweepLauncher(dry_run={self.dry_run})"

