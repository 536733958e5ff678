"""What happened to each job of a sweep, as Hydra's return values: a `RunResult`, or `NotRun` and why.

    outcomes(all_runs, plan, ran, results, held) -> {job index: RunResult | NotRun}
    dry_run_outcomes(plan) -> {job index: NotRun}       (and the plan logged, server by server)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from orchestrator.config.plan import Plan
from specsweep_common.spec import RunResult, RunSpec, RunState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotRun:
    """Hydra return value of a job that was not run: dropped at planning, skipped on resume, held by another
    driver, or a dry run."""

    run: RunSpec | None
    reason: str


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


DRY_RUN_LISTED = 200  # a larger plan lists each server's first DRY_RUN_PER_SERVER runs at INFO, every run at DEBUG
DRY_RUN_PER_SERVER = 3


def dry_run_outcomes(plan: Plan) -> dict[int, RunResult | NotRun]:
    """Log the plan server by server (a plan of more than DRY_RUN_LISTED runs: each server's first few at INFO,
    the rest at DEBUG, so an 8,000-point grid answers in a second); every job's outcome is NotRun."""
    listed = len(plan.runs) if len(plan.runs) <= DRY_RUN_LISTED else DRY_RUN_PER_SERVER
    for g in plan.groups:
        log.info("server %s (%d runs)", g.group_id, len(g.runs))
        for i, r in enumerate(g.runs):
            log.log(logging.INFO if i < listed else logging.DEBUG, "  #%d %s  run_hash=%s", r.job_index, r.name,
                    r.run_hash[:12])
        if len(g.runs) > listed:
            log.info("  ... and %d more run(s) of this server (all %d runs of the plan: hydra.verbose=%s)",
                     len(g.runs) - listed, len(plan.runs), log.name)
    by_index: dict[int, RunResult | NotRun] = {r.job_index: NotRun(r, "dry run") for r in plan.runs}
    by_index.update({r.job_index: NotRun(r, f"dropped: {why}") for r, why in plan.dropped if r})
    return by_index
