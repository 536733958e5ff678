"""Driver-side settings: where a sweep runs (Ray), where it is recorded (MLflow), how its report judges it.

None of these is part of any run's identity (run_hash). The `cluster`, `tracking` and `report` config sections are
generated from these dataclasses (orchestrator/config/schema.py), so each key and its default is declared here only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from specsweep_common.domain import FRACTION, IDENT, NAME, TOKENS, Int, Num, Text, domain


@dataclass(frozen=True)
class Thresholds:
    """The diagnosis rules' thresholds (orchestrator/results/diagnosis.py), config section `report`."""

    # commit_len_mean may fall this far below num_steps + 1
    oracle_tolerance: float = field(default=1e-6, metadata=domain(Num(0, 1)))
    collapse_drop: float = field(default=0.5, metadata=domain(FRACTION))  # fraction lost from the shortest context
    # fraction novel text commits below predictable text at the same context
    novel_gap: float = field(default=0.5, metadata=domain(FRACTION))
    # a novel-text continuation whose share of repeated word trigrams is at least this loops: easy text, not novel
    loop_repeat_frac: float = field(default=0.5, metadata=domain(FRACTION))
    # verify_step_ms ~ context^k with k above this
    superlinear_exponent: float = field(default=1.3, metadata=domain(Num(0, 10, lo_open=True)))
    # the super-linearity test needs contexts this far apart
    min_context_ratio: float = field(default=4.0, metadata=domain(Num(1, 1e6, lo_open=True)))
    min_bw_frac: float = field(default=0.10, metadata=domain(FRACTION))  # kv_bw_gbs / device peak GB/s
    # short prefixes are overhead-dominated: judge bandwidth from here up
    bw_min_context: int = field(default=16384, metadata=domain(TOKENS))
    max_gpu_util: float = field(default=50.0, metadata=domain(Num(0, 100)))  # percent
    # "step time is high" for rule (d) when no roofline is known
    high_step_ms: float = field(default=5.0, metadata=domain(Num(0, 1e6, lo_open=True)))
    max_roofline_frac_host: float = field(default=0.5, metadata=domain(FRACTION))  # ... or roofline_frac under this
    # lossless check (f): where a speculative run's greedy tokens first differ from the run without speculation, the
    # none-run's two best logprobs must be this close for a tie (either token a correct greedy choice). Measured by
    # tools/lossless_numerics.py (SmolLM2-135M, reference engine, make run's texts and drafters, 768 positions a dtype):
    # verify vs decode forwards move a top-2 gap by <= 2.7e-5 in float32 (no divergence), by <= 0.375 in bfloat16
    # (3 ulps of a logit in [16, 32)), where the story text parts at a gap of 0.125 (docs/orchestrator.md)
    lossless_tie_gap: float = field(default=1e-4, metadata=domain(Num(0, 100)))
    lossless_tie_gap_16bit: float = field(default=0.5, metadata=domain(Num(0, 100)))


# a parent run id, or KEY:VALUE of a parent-run tag (neither side empty)
BASELINE = Text(256, r"[^:\s]([^\s]*[^:\s])?", what="a parent run id, or KEY:VALUE of a parent-run tag")


@dataclass(frozen=True)
class RegressSettings:
    """The regression check against the sweep's own history (orchestrator/results/regress), config section
    `regress`. The report reads them back from the parent run's params, so `specsweep-report` judges as the sweep did."""

    enabled: bool = True
    # None: the last `history` FINISHED parent runs of this sweep; else a parent run id, or `KEY:VALUE`, a tag of
    # the parent runs to compare with (the latest FINISHED parent carrying it), e.g. `git_sha:3f2c1ab`
    baseline: str | None = field(default=None, metadata=domain(BASELINE))
    # how many earlier FINISHED parent runs make the baseline
    history: int = field(default=5, metadata=domain(Int(1, 1000)))
    # noisy metrics: a change under this fraction of the baseline is never flagged
    min_rel_change: float = field(default=0.03, metadata=domain(Num(0, 1)))
    # noisy metrics: flagged outside the Student-t prediction interval whose two-sided tail is a normal's at max_z,
    # with the spread between sweeps pooled over the points (regress/verdict.py; docs/schedule.md, "Noise model")
    max_z: float = field(default=4.0, metadata=domain(Num(0, 1000, lo_open=True)))


class ClusterKind(str, enum.Enum):
    LOCAL = "local"  # embedded: a local `ray.init()` with logical GPUs
    RAY = "ray"  # an existing Ray cluster: `ray.init(address=...)`


class AcceleratorMatch(str, enum.Enum):
    """How `cluster.accelerator` picks nodes (docs/cluster.md)."""

    AUTO = "auto"  # labels when some node carries `accelerator_label`, else custom resources
    LABEL = "label"  # Ray >= 2.49 node labels: `ray start --labels gpu-arch=sm_120`
    RESOURCE = "resource"  # older clusters: `ray start --resources '{"accelerator_sm_120": 1}'`


@dataclass(frozen=True)
class ClusterSettings:
    kind: ClusterKind = ClusterKind.LOCAL
    # kind=ray: "auto" or "ray://head:10001"
    address: str | None = field(default=None, metadata=domain(Text(1024, r"auto|[A-Za-z0-9+.-]+://\S+|[\w.-]+:\d+",
                                                                     what="auto, ray://host:port or host:port")))
    # kind=local: ray.init(num_cpus=...); None = Ray's default
    num_cpus: int | None = field(default=None, metadata=domain(Int(1, 65536)))
    # kind=local: logical GPUs to advertise; None = Ray's detection
    num_gpus: int | None = field(default=None, metadata=domain(Int(0, 65536)))
    # kind=local; None = Ray's default (Ray's minimum is 75 MiB)
    object_store_memory_mb: int | None = field(default=None, metadata=domain(Int(75, 2 ** 24)))
    include_dashboard: bool = False
    namespace: str = field(default="specsweep", metadata=domain(NAME))
    runtime_env: dict[str, Any] | None = field(default=None, hash=False)  # ray.init(runtime_env=...)
    # GPUs a server asks for on each of its nodes (0: tp_size / nnodes on GPU engines)
    gpus_per_server: int = field(default=0, metadata=domain(Int(0, 1024)))
    # GPUs of one node; None: whatever the cluster's nodes have
    gpus_per_node: int | None = field(default=None, metadata=domain(Int(1, 1024)))
    # Ray CPUs in each node bundle of a server (k in {GPU: g, CPU: k})
    cpus_per_server: float = field(default=1.0, metadata=domain(Num(0, 4096, lo_open=True)))
    # GPU architecture every server must land on, e.g. "sm_120"
    accelerator: str | None = field(default=None, metadata=domain(Text(16, r"sm_\d+[a-z]?", what="sm_<N>")))
    # node label key that carries the architecture
    accelerator_label: str = field(default="gpu-arch", metadata=domain(IDENT))
    accelerator_match: AcceleratorMatch = AcceleratorMatch.AUTO
    # memory of one GPU (GiB) for the plan-time weights check; None: the largest GPU of `accelerator`
    # (workers/sglang/startup_rules.py GPU_MEMORY_GIB), or of any architecture when that is unset too
    gpu_memory_gib: float | None = field(default=None, metadata=domain(Num(0, 65536, lo_open=True)))
    # cap on servers at once; None: as many as the cluster fits
    max_concurrent_servers: int | None = field(default=None, metadata=domain(Int(1, 65536)))
    # per run: re-queues after its node was lost while it ran
    max_retries: int = field(default=2, metadata=domain(Int(0, 100)))

    @property
    def accelerator_resource(self) -> str | None:
        """The custom-resource fallback name: sm_90 -> "accelerator_sm_90"."""
        return f"accelerator_{self.accelerator}" if self.accelerator else None


@dataclass(frozen=True)
class TrackingSettings:
    # resolved at the entry: relative sqlite paths made absolute
    uri: str = field(default="sqlite:///mlflow.db", metadata=domain(Text(4096, r"[A-Za-z][A-Za-z0-9+.-]*:\S*",
                                                                         what="an MLflow tracking URI scheme:...")))
    experiment_name: str | None = field(default=None, metadata=domain(NAME))  # None → the sweep name


@dataclass(frozen=True)
class ExecutionSettings:
    """What execution needs besides the Plan: where to run, where to record, whether to resume."""

    sweep_name: str
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    resume: bool = True  # skip run_hashes already FINISHED in the experiment
    work_dir: str = "."  # the user's original working directory (absolute), for logs/artifacts
    progress: bool = True  # live progress line + final table on the driver
    report: Thresholds = field(default_factory=Thresholds)  # diagnosis thresholds (config `report`)

    @property
    def tracking_uri(self) -> str:
        return self.tracking.uri

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment_name or self.sweep_name
