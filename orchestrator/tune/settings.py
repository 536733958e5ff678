"""`TuneSettings`: what a tune searches, on which workload, with what budget (Hydra: `hydra.sweeper.tune.*` of the
`specsweep` sweeper, set by `conf/tune/<name>.yaml`). Declared once here; the sweeper's `tune` section is generated
from it (hydra_plugins/specsweep_launcher).

    settings_problems(values) -> [Problem]    each field in its declared domain, the space's keys, the limits
    to_tune_settings(values) -> TuneSettings  the sweeper's composed config, typed (after settings_problems)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from specsweep_common.domain import FRACTION, NAME, TOKENS, Int, Items, Num, domain
from specsweep_common.problem import Problem

KEY_PREFIX = "hydra.sweeper.tune."
# The workload axes: never searched (the answer is per batch size and context), given as their own fields.
WORKLOAD_KEYS = {"probe.concurrency": "batch_sizes", "context_len": "context_lens"}
BATCH = Int(1, 1024)  # probe.concurrency's domain (specsweep_common/spec.py ProbeSpec)


class SamplerKind(str, enum.Enum):
    TPE = "tpe"  # a single-objective TPESampler per workload point, the points taking turns (loop.py _ask)
    MOTPE = "motpe"  # Optuna's TPESampler over every workload point at once (multi-objective, by Pareto rank)
    RANDOM = "random"  # Optuna's RandomSampler: the benchmark's reference
    GRID = "grid"  # every candidate once, in Optuna's GridSampler order: the full grid through the same loop


@dataclass(frozen=True)
class TuneSettings:
    """One tune. `space` maps an override key to its values: `drafter` (a config group: the algorithm and its
    defaults), `drafter.num_steps`, `drafter.topk`, `drafter.num_draft_tokens` (searched only where the drafter
    speculates; num_draft_tokens only where topk > 1, else num_steps + 1), `page_size`, `attention`, or any other
    key of a server's configuration."""

    space: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # probe.concurrency values: the answer is per batch size; every candidate runs at each on one server
    batch_sizes: tuple[int, ...] = field(default=(1, 4, 16), metadata=domain(Items(BATCH, 64)))
    # context_len values (empty: the config's context_len); a workload axis like the batch size
    context_lens: tuple[int, ...] = field(default=(), metadata=domain(Items(TOKENS, 64)))
    name: str | None = field(default=None, metadata=domain(NAME))  # the study's name (None: sweep_name)
    trials: int = field(default=16, metadata=domain(Int(1, 100000)))  # distinct configurations measured
    per_round: int = field(default=4, metadata=domain(Int(1, 1024)))  # configurations run together per round
    sampler: str = field(default=SamplerKind.TPE.value, metadata=domain(NAME))
    seed: int = field(default=0, metadata=domain(Int(0, 2 ** 32 - 1)))
    # Optuna RDB storage URL (None: sqlite `optuna.db` beside the MLflow store, or in the working directory)
    storage: str | None = None
    # candidates per workload point re-run with `repeats` prompts to pick a winner that survives noise
    leaders: int = field(default=3, metadata=domain(Int(1, 64)))
    repeats: int = field(default=3, metadata=domain(Int(3, 64)))  # >= 3: a median and a MAD mean something
    tie_frac: float = field(default=0.01, metadata=domain(FRACTION))  # robust scores this close: fewer drafts win
    # a drafter setting committing at most this at the smallest batch is not tried again. 1: no draft was ever
    # accepted. Not higher by default: a drafter committing a little over 1 still gains where verifying its tokens
    # costs what decoding one does (on the reference engine's tiny model on the 2-core VM, 2026-12-06, a 1-step tree
    # committing 1.046 at batch 1 ranked first at batch 4, within that grid's noise)
    no_gain_commit_len: float = field(default=1.0, metadata=domain(Num(1, 2)))
    # latency limits (None: none), on the probe's per-run means: mean TTFT, mean TPOT = 1000 / decode_tok_s
    max_ttft_s: float | None = field(default=None, metadata=domain(Num(0, 1e6, lo_open=True)))
    max_tpot_ms: float | None = field(default=None, metadata=domain(Num(0, 1e9, lo_open=True)))
    sentinel: bool = True  # the oracle at batch 1 first: a pipeline bug stops the tune before the search

    @property
    def sampler_kind(self) -> SamplerKind:
        return SamplerKind(self.sampler)


def settings_problems(values: Mapping[str, Any]) -> list[Problem]:
    """What a `hydra.sweeper.tune` section refuses, each with its key, value and what is allowed."""
    from orchestrator.config.domains import domain_problems

    out = [Problem(KEY_PREFIX + p.key, p.value, p.allowed) for p in domain_problems(values, TuneSettings)]
    if values.get("sampler") not in {k.value for k in SamplerKind}:
        out.append(Problem(KEY_PREFIX + "sampler", values.get("sampler"),
                           "one of " + ", ".join(k.value for k in SamplerKind)))
    if not values.get("batch_sizes"):
        out.append(Problem(KEY_PREFIX + "batch_sizes", values.get("batch_sizes"), "at least one batch size"))
    space = values.get("space") or {}
    if not space:
        out.append(Problem(KEY_PREFIX + "space", dict(space), "at least one key with its values to search, "
                           "e.g. {drafter: [none, ngram], drafter.num_steps: [2, 4, 6]}"))
    for key, vals in space.items():
        if key in WORKLOAD_KEYS:
            out.append(Problem(f"{KEY_PREFIX}space.{key}", vals, f"no {key} in the space: it is the workload, "
                               f"set {KEY_PREFIX}{WORKLOAD_KEYS[key]}"))
        elif not isinstance(vals, (list, tuple)) or not vals or len(set(map(repr, vals))) != len(vals):
            out.append(Problem(f"{KEY_PREFIX}space.{key}", vals, "a non-empty list of distinct values"))
        elif any(isinstance(v, (list, dict, tuple)) for v in vals):
            out.append(Problem(f"{KEY_PREFIX}space.{key}", vals, "scalar values (a string, number or bool each)"))
    return out


def to_tune_settings(values: Mapping[str, Any]) -> TuneSettings:
    space = {str(k): tuple(v) for k, v in (values.get("space") or {}).items()}
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()
                             if k in TuneSettings.__dataclass_fields__ and k != "space"}
    return TuneSettings(**given, space=space)
