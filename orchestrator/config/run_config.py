"""`RunConfig`: one grid point, fully typed: what validation, planning and the launcher pass around.

It sits below both `orchestrator.config.schema` (which builds it from Hydra's DictConfig) and
`orchestrator.config.validate` (whose rules read it), so that neither imports the other's module for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.settings import (ClusterSettings, ExecutionSettings, RegressSettings, Thresholds,
                                          TrackingSettings)
from specsweep_common.domain import NAME, TOKENS, Int, Items, Text, domain
from specsweep_common.spec import (AttentionSpec, DrafterSpec, EngineSpec, JobKind, KernelSpec, ModelSpec,
                                  ProbeSpec)


LOG_PATTERNS = Items(Text(1000, what="a regular expression"), 64)
CONTEXT_LEN = TOKENS  # the probe's prompt tokens (top-level `context_len`)
GEN_TOKENS = Int(1, 2 ** 20)  # tokens generated per run (top-level `gen_tokens`)


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
    regress: RegressSettings = field(default_factory=RegressSettings)  # comparison with the sweep's history
    kernel: KernelSpec | None = None  # job=kernel: the shape the `kernel` section (KernelConf) resolves to
    # `metrics.log_patterns` (checked by validate.log_pattern_problems)
    log_patterns: tuple[str, ...] = field(default=(), metadata=domain(LOG_PATTERNS))
    job: JobKind = JobKind.ENGINE  # engine (an engine + probe per point) | kernel (one verify-kernel shape per point)
    sweep_name: str = field(default="specsweep", metadata=domain(NAME))  # a folder and the MLflow experiment
    page_size: int = field(default=16, metadata=domain(Int(1, 4096)))  # KV page (tokens)
    seed: int = field(default=0, metadata=domain(Int(0, 2 ** 32 - 1)))  # numpy's and SGLang's seed range
    resume: bool = ExecutionSettings.resume  # the defaults that execution also holds are ExecutionSettings's
    # None = the model's max_context_len
    server_context_len: int | None = field(default=None, metadata=domain(TOKENS))
    tp_size: int = field(default=1, metadata=domain(Int(1, 1024)))
    # nodes one server spans (SGLang --nnodes); tp_size is split evenly across them
    nnodes: int = field(default=1, metadata=domain(Int(1, 1024)))
    progress: bool = ExecutionSettings.progress
    params: tuple[tuple[str, str], ...] = ()  # flattened resolved config
    overrides: tuple[str, ...] = ()  # this job's Hydra overrides
