"""`RunConfig`: one grid point, fully typed: what validation, planning and the launcher pass around.

It sits below both `orchestrator.config.schema` (which builds it from Hydra's DictConfig) and
`orchestrator.config.validate` (whose rules read it), so that neither imports the other's module for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.settings import ClusterSettings, ExecutionSettings, Thresholds, TrackingSettings
from specsweep_vocab.spec import (AttentionSpec, DrafterSpec, EngineSpec, JobKind, KernelSpec, ModelSpec,
                                  ProbeSpec)


@dataclass(frozen=True)
class RunConfig:
    """One grid point, fully typed. Nothing below the entry sees a DictConfig.

    Its fields are the config's top level (`SpecsweepConf` is generated from them): a section per spec, then the
    top-level keys with their defaults."""

    engine: EngineSpec
    model: ModelSpec
    drafter: DrafterSpec
    attention: AttentionSpec
    probe: ProbeSpec  # its context_len and gen_tokens are the top-level keys of the same names
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    report: Thresholds = field(default_factory=Thresholds)
    kernel: KernelSpec | None = None  # job=kernel: the shape the `kernel` section (KernelConf) resolves to
    log_patterns: tuple[str, ...] = ()  # `metrics.log_patterns` (checked by validate.log_pattern_problems)
    job: JobKind = JobKind.ENGINE  # engine (an engine + probe per point) | kernel (one verify-kernel shape per point)
    sweep_name: str = "specsweep"
    page_size: int = 16
    seed: int = 0
    resume: bool = ExecutionSettings.resume  # the defaults that execution also holds are ExecutionSettings's
    server_context_len: int | None = None  # None = the model's max_context_len
    tp_size: int = 1
    nnodes: int = 1  # nodes one server spans (SGLang --nnodes); tp_size is split evenly across them
    progress: bool = ExecutionSettings.progress
    params: tuple[tuple[str, str], ...] = ()  # flattened resolved config
    overrides: tuple[str, ...] = ()  # this job's Hydra overrides
