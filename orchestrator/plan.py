"""Planning: pure functions from typed run configs to a `Plan` of server groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.spec import RunSpec, ServerGroup


@dataclass(frozen=True)
class Plan:
    sweep_name: str
    groups: tuple[ServerGroup, ...]  # one per distinct ServerSpec, deterministic order
    dropped: tuple[tuple[RunSpec | None, str], ...] = ()  # (point, why) left out at planning
    base_config: dict[str, Any] | None = None  # resolved config of the first job (parent-run params)
    overrides: tuple[str, ...] = ()  # the sweep's command-line overrides

    @property
    def runs(self) -> tuple[RunSpec, ...]:
        """Every planned run, in job order."""
        return tuple(sorted((r for g in self.groups for r in g.runs), key=lambda r: r.job_index))

    @property
    def num_runs(self) -> int:
        return sum(len(g.runs) for g in self.groups)
