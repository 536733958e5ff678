"""`PlanPoint`: one grid point as an engine's plan-time rules read it, and `Resources`, what an engine estimates
it needs.

The engines' rules (`workers/<engine>/rules.py`, behind `workers.adapter.EngineAdapter.plan_problems`) run in
the driver before anything starts, but workers/ never imports orchestrator/: they read a grid point through
this protocol, which `orchestrator.config.run_config.RunConfig` satisfies as it is (mypy checks it where the
config layer hands a RunConfig to an adapter), so a grid of thousands of points is checked without a copy.

    PlanPoint        engine, model, drafter, attention, probe, cluster (ClusterFacts), page_size, tp_size,
                     nnodes, server_context_len, overrides
    server_context_len(point) -> int     the server's --context-length: server_context_len, else the model's
    context_limit_words(point) -> str    that length and where it comes from, in words
    Resources        an engine's estimate for one point: the smallest tp_size whose weights fit, and how many
                     requests run at once before they queue
    argv_flags(args) -> {flag}           the `--flags` of an argv list (`--flag V` and `--flag=V`)
    argv_int(args, flag) -> int | None   the integer value of `flag` in an argv list

Standard library and specsweep_common only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specsweep_common.spec import AttentionSpec, DrafterSpec, EngineSpec, ModelSpec, ProbeSpec


class ClusterFacts(Protocol):
    """What a rule may know of the nodes (`cluster.*`, orchestrator/config/settings.py ClusterSettings)."""

    @property
    def accelerator(self) -> str | None: ...  # "sm_90", or None when not declared

    @property
    def gpu_memory_gib(self) -> float | None: ...  # one GPU's memory, or None when not declared


class PlanPoint(Protocol):
    """One grid point, typed, as the config layer validated its domains (`RunConfig` is one)."""

    @property
    def engine(self) -> EngineSpec: ...

    @property
    def model(self) -> ModelSpec: ...

    @property
    def drafter(self) -> DrafterSpec: ...

    @property
    def attention(self) -> AttentionSpec: ...

    @property
    def probe(self) -> ProbeSpec: ...

    @property
    def cluster(self) -> ClusterFacts: ...

    @property
    def page_size(self) -> int: ...

    @property
    def tp_size(self) -> int: ...

    @property
    def nnodes(self) -> int: ...

    @property
    def server_context_len(self) -> int | None: ...  # None: the model's max_context_len

    @property
    def overrides(self) -> tuple[str, ...]: ...  # the point's Hydra overrides, for its problems


def server_context_len(point: PlanPoint) -> int:
    """The server's --context-length: server_context_len, else the model's max_context_len."""
    return point.server_context_len or point.model.max_context_len


def context_limit_words(point: PlanPoint) -> str:
    """Where the server's context length comes from, in words, for a context problem."""
    limit = server_context_len(point)
    return (f"server_context_len {limit}" if point.server_context_len
            else f"model {point.model.name}'s max_context_len {limit}")


@dataclass(frozen=True)
class Resources:
    """What an engine estimates one grid point needs (`EngineAdapter.resource_estimate`)."""

    min_tp_size: int = 1  # the smallest tp_size at which the weights fit (1: they fit one GPU, or cannot be counted)
    max_concurrency: int | None = None  # requests that run at once before more queue (None: no limit known)


def argv_flags(args: tuple[str, ...]) -> set[str]:
    """The `--flags` of an argv list: `--flag V` and `--flag=V` both give `--flag`."""
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def argv_int(args: tuple[str, ...], flag: str) -> int | None:
    """The value of `flag` in an argv list (`--flag N` or `--flag=N`); None when absent or not an integer."""
    for i, a in enumerate(args):
        value = a.split("=", 1)[1] if a.startswith(flag + "=") else (
            args[i + 1] if a == flag and i + 1 < len(args) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None
