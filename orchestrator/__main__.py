"""The Hydra app: `python -m orchestrator [overrides]` (one run) or `... +sweep=NAME` (a sweep).

A sweep goes through the `specsweep` launcher (hydra_plugins/specsweep_launcher), which plans and
executes every job at once; a single run calls the same core with one job.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from orchestrator.schema import register_configs

register_configs()


@hydra.main(config_path="pkg://conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> object:
    from hydra.core.hydra_config import HydraConfig

    from orchestrator.launcher_core import launch_single

    return launch_single(cfg, tuple(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    main()
