"""Does a point's prompt and generation fit its server's context? (split from validate.py, #32)

    server_context_len(rc)        the server's --context-length
    reserved_tokens(rc)           slots SGLang's EAGLE drafts take per request
    check_context(rc) -> Problem | None             one point
    every_point_over_context(configs) -> Problem | None   a sweep with nothing left to run
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from orchestrator.config.problems import Problem
from specsweep_vocab.sglang_limits import context_need, sglang_generated
from specsweep_vocab.spec import Algorithm, EngineKind, JobKind

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig


def reserved_tokens(rc: RunConfig) -> int:
    """Context slots SGLang reserves per request on top of the prompt: EAGLE/EAGLE3 store their draft tokens in
    the output slots, max(topk * num_steps, num_draft_tokens) (`compute_num_reserved_tokens`, 0.5.10-0.5.23)."""
    d = rc.drafter
    if rc.engine.kind is EngineKind.SGLANG and d.algorithm in (Algorithm.EAGLE, Algorithm.EAGLE3):
        return max(d.topk * d.num_steps, d.num_draft_tokens)
    return 0


def server_context_len(rc: RunConfig) -> int:
    """The server's --context-length: server_context_len, else the model's max_context_len."""
    return rc.server_context_len or rc.model.max_context_len


def check_context(rc: RunConfig) -> Problem | None:
    """The probe's prompt and all its gen_tokens must fit the server's context (a sweep drops such points instead).
    The reference engine takes prompt + max_new_tokens <= context (workers/reference/engine.py `check`). SGLang
    (0.5.23, `specsweep_vocab.sglang_limits`, checked against its own code): prompt + max_new_tokens + max(reserve, 2)
    <= context and prompt <= context - 7, the reserve being EAGLE/EAGLE3's draft slots; nearer the edge it refuses
    the request (HTTP 400), aborts it, or generates fewer tokens than asked."""
    limit, reserved = server_context_len(rc), reserved_tokens(rc)
    prompt, gen = rc.probe.context_len, rc.probe.gen_tokens
    sglang = rc.engine.kind is EngineKind.SGLANG
    if (sglang_generated(prompt, gen, limit, reserve=reserved) == gen) if sglang else prompt + gen <= limit:
        return None
    where = (f"server_context_len {limit}" if rc.server_context_len
             else f"model {rc.model.name}'s max_context_len {limit}")
    if not sglang:
        return Problem("context_len", prompt, f"context_len + gen_tokens ({gen}) <= {where}", rc.overrides)
    total, alone = context_need(reserved)
    why = (f"the {reserved} tokens SGLang reserves for {rc.drafter.algorithm.value} drafts "
           "(max(topk*num_steps, num_draft_tokens))" if reserved >= total else
           "SGLang's scheduler keeps max_new_tokens <= context - prompt - 2")
    return Problem("context_len", prompt, f"context_len + gen_tokens ({gen}) + {total} ({why}) <= {where}, and "
                   f"context_len <= {limit - alone} (SGLang aborts prompts of context - 6 tokens or more)",
                   rc.overrides)


def every_point_over_context(configs: Sequence[RunConfig]) -> Problem | None:
    """A sweep drops points above the model's context; when that leaves nothing to run it is an error."""
    over = [p for rc in configs if rc.job is JobKind.ENGINE and (p := check_context(rc))]
    if not configs or len(over) < len(configs):
        return None
    values = sorted({p.value for p in over})
    return Problem("context_len", values if len(values) > 1 else values[0],
                   f"at least one grid point with {over[0].allowed} (all {len(configs)} point(s) exceed it: "
                   "nothing would run)")
