"""Hydra discovers this launcher and these sweepers by scanning the `hydra_plugins` namespace package.

The launcher is a shell: `launch()` hands every job of the multirun at once to
`orchestrator.session.launcher`, which validates, plans and executes them as one sweep.
The sweeper is Hydra's basic sweeper (the same grid, the same order) without its own composition of every job
before the launch (`Sweeper.validate_batch_is_legal`, there for launchers that compose elsewhere): our launcher
composes every job in this process right away, raising the same errors, and composes each distinct choice of
config groups once (`orchestrator.config.grid`), which the sweeper's check would undo at ~0.15 s a point.
The tune sweeper (`hydra/sweeper=specsweep_tune`, selected by `conf/tune/<name>.yaml`) hands the search to
`orchestrator.tune.entry`: Optuna chooses the points (docs/tune.md).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class SpecsweepLauncherConf:
    _target_: str = "hydra_plugins.specsweep_launcher.specsweep_launcher.SpecsweepLauncher"
    dry_run: bool = False  # validate and plan only: log the plan, start nothing


ConfigStore.instance().store(group="hydra/launcher", name="specsweep", node=SpecsweepLauncherConf,
                             provider="specsweep")


@dataclass
class SpecsweepSweeperConf:
    _target_: str = "hydra_plugins.specsweep_launcher.specsweep_launcher.SpecsweepSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="specsweep", node=SpecsweepSweeperConf,
                             provider="specsweep")


class SpecsweepSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Nothing here: the launcher composes the batch in this process before anything starts."""


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


def _tune_sweeper_conf() -> type:
    """The `specsweep_tune` sweeper's structured config: `orchestrator.tune.settings.TuneSettings`'s fields (declared
    there once), plus Hydra's `_target_`."""
    import dataclasses

    from orchestrator.config.schema import structured_conf
    from orchestrator.tune.settings import TuneSettings

    base = structured_conf(TuneSettings, "TuneConf",
                           replace={"space": [("space", Dict[str, Any], dataclasses.field(default_factory=dict))]})
    target = "hydra_plugins.specsweep_launcher.specsweep_launcher.SpecsweepTuneSweeper"
    return dataclasses.make_dataclass("SpecsweepTuneSweeperConf",
                                      [("_target_", str, dataclasses.field(default=target))], bases=(base,))


ConfigStore.instance().store(group="hydra/sweeper", name="specsweep_tune", node=_tune_sweeper_conf(),
                             provider="specsweep")


class SpecsweepTuneSweeper(Sweeper):
    """`specsweep +tune=NAME`: a sweep whose points Optuna chooses (orchestrator/tune). The settings are
    `hydra.sweeper.*` (orchestrator.tune.settings.TuneSettings)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def sweep(self, arguments: List[str]) -> Any:
        from orchestrator.tune.entry import run_tune

        assert self.config is not None and self.hydra_context is not None
        return run_tune(self.config, self.hydra_context, arguments)
