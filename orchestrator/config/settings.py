"""Driver-side settings: where a sweep runs (Ray), where it is recorded (MLflow), how its report judges it.

None of these is part of any run's identity (run_hash). The `cluster`, `tracking` and `report` config sections are
generated from these dataclasses (orchestrator/config/schema.py), so each key and its default is declared here only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """The diagnosis rules' thresholds (orchestrator/results/diagnosis.py), config section `report`."""

    oracle_tolerance: float = 1e-6  # commit_len_mean may fall this far below num_steps + 1
    collapse_drop: float = 0.5  # fraction lost from the shortest context
    novel_gap: float = 0.5  # fraction novel text commits below predictable text at the same context
    # a novel-text continuation whose share of repeated word trigrams is at least this loops: easy text, not novel
    loop_repeat_frac: float = field(default=0.5, metadata={"domain": (0.0, 1.0)})
    superlinear_exponent: float = 1.3  # verify_step_ms ~ context^k with k above this
    min_context_ratio: float = 4.0  # the super-linearity test needs contexts this far apart
    min_bw_frac: float = 0.10  # kv_bw_gbs / device peak GB/s
    bw_min_context: int = 16384  # short prefixes are overhead-dominated: judge bandwidth from here up
    max_gpu_util: float = 50.0  # percent
    high_step_ms: float = 5.0  # "step time is high" for rule (d) when no roofline is known
    max_roofline_frac_host: float = 0.5  # ... or roofline_frac under this


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
    address: str | None = None  # kind=ray: "auto" or "ray://head:10001"
    num_cpus: int | None = None  # kind=local: ray.init(num_cpus=...); None = Ray's default
    num_gpus: int | None = None  # kind=local: logical GPUs to advertise; None = Ray's detection
    object_store_memory_mb: int | None = None  # kind=local; None = Ray's default
    include_dashboard: bool = False
    namespace: str = "specsweep"
    runtime_env: dict[str, Any] | None = field(default=None, hash=False)  # ray.init(runtime_env=...)
    gpus_per_server: int = 0  # GPUs a server asks for on each of its nodes (0: tp_size / nnodes on GPU engines)
    gpus_per_node: int | None = None  # GPUs of one node; None: whatever the cluster's nodes have
    cpus_per_server: float = 1.0  # Ray CPUs in each node bundle of a server (k in {GPU: g, CPU: k})
    accelerator: str | None = None  # GPU architecture every server must land on, e.g. "sm_120"
    accelerator_label: str = "gpu-arch"  # node label key that carries the architecture
    accelerator_match: AcceleratorMatch = AcceleratorMatch.AUTO
    # memory of one GPU (GiB) for the plan-time weights check; None: the largest GPU of `accelerator`
    # (orchestrator/config/validate_startup.py GPU_MEMORY_GIB), or of any architecture when that is unset too
    gpu_memory_gib: float | None = None
    max_concurrent_servers: int | None = None  # cap on servers at once; None: as many as the cluster fits
    max_retries: int = 2  # per run: re-queues after its node was lost while it ran

    @property
    def accelerator_resource(self) -> str | None:
        """The custom-resource fallback name: sm_90 -> "accelerator_sm_90"."""
        return f"accelerator_{self.accelerator}" if self.accelerator else None


@dataclass(frozen=True)
class TrackingSettings:
    uri: str = "sqlite:///mlflow.db"  # resolved at the entry: relative sqlite paths made absolute
    experiment_name: str | None = None  # None → the sweep name


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
