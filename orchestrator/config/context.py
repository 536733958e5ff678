"""Does a point's prompt and generation fit its server's context?

    server_context_len(rc)        the server's --context-length
    check_context(rc) -> Problem | None             one point, as its engine counts (`EngineAdapter.context_problem`:
                                                    the reference engine's prompt + gen_tokens <= context by default,
                                                    SGLang's own accounting in workers/sglang/rules.py)
    every_point_over_context(configs) -> Problem | None   a sweep with nothing left to run
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from specsweep_common.problem import Problem
from specsweep_common.plan_point import server_context_len as server_context_len
from specsweep_common.spec import JobKind
from workers.registry import adapter_for

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig


def check_context(rc: RunConfig) -> Problem | None:
    """The probe's prompt and all its gen_tokens must fit the server's context (a sweep drops such points instead);
    nearer the edge an engine refuses the request, aborts it, or generates fewer tokens than asked."""
    return adapter_for(rc.engine.kind).context_problem(rc)


def every_point_over_context(configs: Sequence[RunConfig]) -> Problem | None:
    """A sweep drops points above the model's context; when that leaves nothing to run it is an error."""
    over = [p for rc in configs if rc.job is JobKind.ENGINE and (p := check_context(rc))]
    if not configs or len(over) < len(configs):
        return None
    values = sorted({p.value for p in over})
    return Problem("context_len", values if len(values) > 1 else values[0],
                   f"at least one grid point with {over[0].allowed} (all {len(configs)} point(s) exceed it: "
                   "nothing would run)")
