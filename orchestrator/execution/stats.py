"""What one `execute_plan` call did and how long each phase took, for benchmarks
(`tools.bench_orchestrator --breakdown`), tests and the parent run's metrics. Plain data: no Ray, no MLflow.

    ExecutionStats      filled in by `execute_plan`: engine starts, start-up and stop seconds per group, the phase
                        marks (seconds from the call), the parent run id, a SlotRecord per server slot
    SlotRecord          when and where one server slot (placement group + actors) ran
    parent_metrics(results, stats) -> {name: value}   the parent run's metrics (runs by state, engine starts, ...)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

from specsweep_common.spec import RunResult, RunState


@dataclass(frozen=True)
class SlotRecord:
    """When and where one slot ran, for tests and benchmarks (unix seconds)."""

    group_id: str
    attempt: int
    node_ids: tuple[str, ...]
    submitted_at: float
    began_at: float  # the engine start began (the placement group was ready and the actor up)
    ended_at: float  # the engine was stopped
    runs: int


@dataclass
class ExecutionStats:
    wall_s: float = 0.0
    ray_init_s: float = 0.0
    ray_shutdown_s: float = 0.0
    tracking_setup_s: float = 0.0  # from the call to MLflow ready (import, store, parent run; overlaps the engine start)
    ready_s: float = 0.0  # from the call to Ray up, MLflow ready and every actor submitted
    report_s: float = 0.0  # writing the report (a thread: overlaps the engine stop and Ray's shutdown)
    engine_starts: dict[str, int] = field(default_factory=dict)  # group_id -> engine start attempts
    engine_startup_s: dict[str, float] = field(default_factory=dict)  # group_id -> seconds starting engines
    engine_stop_s: dict[str, float] = field(default_factory=dict)  # group_id -> seconds stopping its engine
    marks: dict[str, float] = field(default_factory=dict)  # phase -> seconds from the call (ray_up, submitted, ...)
    tracking_s: float = 0.0  # driver seconds spent writing MLflow
    parent_run_id: str | None = None  # the MLflow parent run of this invocation (e.g. for the report)
    slots: list[SlotRecord] = field(default_factory=list)  # where and when each server ran
    attempts_retried: int = 0  # failed attempts (node lost mid-run) that were re-queued
    t0: float = field(default_factory=time.perf_counter, repr=False, compare=False)  # perf_counter at `begin`

    @property
    def total_engine_starts(self) -> int:
        return sum(self.engine_starts.values())

    def begin(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since `begin`."""
        return time.perf_counter() - self.t0

    def mark(self, phase: str) -> None:
        self.marks[phase] = self.elapsed()


def parent_metrics(results: Iterable[RunResult], stats: ExecutionStats) -> dict[str, float]:
    results = list(results)
    count = {s: sum(r.state is s for r in results) for s in RunState}
    return {"runs_finished": float(count[RunState.FINISHED]), "runs_failed": float(count[RunState.FAILED]),
            "runs_killed": float(count[RunState.KILLED]), "engine_starts": float(stats.total_engine_starts),
            "servers": float(len({r.run.server.key for r in results})), "wall_s": stats.wall_s}
