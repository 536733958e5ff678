"""The conditioned search space: candidates, each one server configuration, and the jobs that measure them.

    candidate_overrides(params, speculates) -> tuple[str, ...]   one point of the space as Hydra overrides
    enumerate_space(space, speculates) -> [Candidate]           every distinct candidate, in a stable order
    workload(settings, context_len) -> [(context_len, batch)]  the workload points every candidate runs
    job_overrides(candidate, point, base) -> [str]              the Hydra overrides of one run
    drafter_key(candidate) -> str                               the drafting settings (what commit length depends on)

Conditions (what makes the space smaller than the product of its axes):
- `drafter.*` knobs are searched only where the chosen drafter speculates (its algorithm is not NONE): every value
  of them under `drafter=none` is one and the same server;
- `drafter.num_draft_tokens` is searched only where `drafter.topk` > 1: with topk 1 the draft is a chain of
  num_steps tokens and the verified tokens are num_steps + 1 (SGLang sets it so for a chain:
  sglang/srt/arg_groups/speculative_hook.py:1425-1429 under --speculative-adaptive; the reference engine's drafter
  confs say the same), so it is set to that.
Which of the remaining candidates an engine refuses is the validation's business (search.py leaves them out).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

DRAFTER = "drafter"
NUM_STEPS, TOPK, NUM_DRAFT_TOKENS = "drafter.num_steps", "drafter.topk", "drafter.num_draft_tokens"
BATCH_KEY, CONTEXT_KEY, REPEATS_KEY = "probe.concurrency", "context_len", "probe.repeats"


@dataclass(frozen=True)
class Candidate:
    """One server configuration of the space: its overrides (sorted by key), the Optuna params that name it."""

    overrides: tuple[str, ...]
    speculates: bool
    # the params as the sampler names them (study.suggest asks exactly these keys), in the space's own types
    params: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    extra: bool = False  # not in the space: the no-speculation baseline added for the margin (never searched)

    @property
    def key(self) -> str:
        return " ".join(self.overrides)

    @property
    def values(self) -> dict[str, str]:
        return dict(o.split("=", 1) for o in self.overrides)

    @property
    def draft_tokens(self) -> int:
        """Tokens verified per step (0 without speculation): the tie rule prefers fewer."""
        if not self.speculates:
            return 0
        v = self.values
        if NUM_DRAFT_TOKENS in v:
            return int(v[NUM_DRAFT_TOKENS])
        return int(v.get(NUM_STEPS, 0)) + 1

    @property
    def label(self) -> str:
        """Short: `ngram steps=4 topk=1 page=16`."""
        v = self.values
        short = {DRAFTER: "", NUM_STEPS: "steps=", TOPK: "topk=", NUM_DRAFT_TOKENS: "tokens=", "page_size": "page=",
                 "attention": "attn="}
        return " ".join(f"{short.get(k, k + '=')}{x}" for k, x in v.items())


def fmt_value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def candidate_overrides(params: Mapping[str, Any], speculates: bool) -> tuple[str, ...]:
    """`params` (key -> value, as sampled) to the candidate's overrides, with the conditions applied."""
    out = {k: fmt_value(v) for k, v in params.items() if speculates or not k.startswith(DRAFTER + ".")}
    if speculates and NUM_STEPS in out and int(out.get(TOPK, "1")) == 1:
        out[NUM_DRAFT_TOKENS] = str(int(out[NUM_STEPS]) + 1)
    return tuple(f"{k}={out[k]}" for k in sorted(out))


def enumerate_space(space: Mapping[str, Sequence[Any]], speculates: Callable[[Mapping[str, Any]], bool]
                    ) -> list[Candidate]:
    """Every distinct candidate; `speculates(params)` says whether the params' drafter speculates."""
    keys = list(space)
    seen: dict[str, Candidate] = {}
    for values in itertools.product(*(space[k] for k in keys)):
        params = dict(zip(keys, values))
        spec = speculates(params)
        asked = {k: v for k, v in params.items() if spec or not k.startswith(DRAFTER + ".")}
        if spec and NUM_STEPS in asked and NUM_DRAFT_TOKENS in asked and int(asked.get(TOPK, 1)) == 1:
            del asked[NUM_DRAFT_TOKENS]
        c = Candidate(candidate_overrides(params, spec), spec, tuple(asked.items()))  # equal servers collapse
        seen.setdefault(c.key, c)
    return list(seen.values())


def workload(batch_sizes: Sequence[int], context_lens: Sequence[int], default_context: int) -> list[tuple[int, int]]:
    """(context_len, batch size) pairs, batch sizes ascending within a context."""
    return [(ctx, b) for ctx in (context_lens or (default_context,)) for b in sorted(batch_sizes)]


def job_overrides(candidate: Candidate, point: tuple[int, int], base: Sequence[str], *,
                  repeats: int = 1) -> list[str]:
    """The run of `candidate` at workload `point`: the tune's own overrides (base), the candidate's, the point's."""
    ctx, batch = point
    extra = [f"{REPEATS_KEY}={repeats}"] if repeats > 1 else []
    if extra:  # the leaders' repeats replace the tune's own probe.repeats
        base = [o for o in base if o.split("=", 1)[0].lstrip("+~") != REPEATS_KEY]
    return [*base, *candidate.overrides, f"{CONTEXT_KEY}={ctx}", f"{BATCH_KEY}={batch}", *extra]


def drafter_key(candidate: Candidate) -> str:
    """What the commit length depends on (the drafter and its knobs), not the server's other knobs."""
    return " ".join(o for o in candidate.overrides if o.split("=", 1)[0] == DRAFTER
                    or o.startswith(DRAFTER + "."))
