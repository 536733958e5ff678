"""The diagnosis' vocabulary (orchestrator/results/diagnosis.py has the rules): the causes and rules it names, a
run as the rules read it (`RunRow`), a finding with its evidence, whether a rule could be evaluated (`Check`), and
the verdict over them (`Diagnosis`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from specsweep_common.greedy_output import GreedyOutput
from specsweep_common.spec import EngineKind


class Cause(str, enum.Enum):
    PIPELINE_BUG = "pipeline bug"
    LONG_CONTEXT_DRAFTING_BUG = "drafting bug at long context"
    DRAFTER_QUALITY = "drafter quality"
    KERNEL_BOUND = "attention-kernel bound"
    HOST_BOUND = "launch- or host-bound"
    KERNEL_NOT_RUN = "verify kernel not proven to run"


class Rule(str, enum.Enum):
    """What each check looks at (the names `diagnosis.md` lists under "Checked" / "Not checked")."""

    ORACLE = "(a) oracle commits num_steps + 1"
    PREDICTABLE_COLLAPSE = "(b) commit length vs context on predictable text"
    DRAFTER_QUALITY = "(b) predictable vs novel text (drafter quality)"
    STEP_GROWTH = "(c) verify-step time vs context"
    KV_BANDWIDTH = "(c) KV bandwidth vs the device peak"
    HOST_BOUND = "(d) GPU utilisation vs step time"
    PLUGIN_DISPATCH = "(e) specsweep_verify runs on its kernel (plugin counters)"
    LOSSLESS = "(f) speculative text equals the text without speculation (lossless check)"


class Verdict(str, enum.Enum):
    NO_RUNS = "no verdict"  # nothing examined
    FINDINGS = "findings"  # at least one rule fired
    HEALTHY = "healthy"  # every rule evaluated, none fired
    INCOMPLETE = "incomplete"  # none fired, but some rule could not be evaluated


@dataclass(frozen=True)
class RunRow:
    run_id: str
    name: str
    context_len: int
    probe: str
    drafter: str
    attention: str
    page_size: int
    is_oracle: bool = False
    num_steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    engine: str = ""  # reference | sglang | stub ("" when unknown)
    concurrency: int = 1  # probe.concurrency: requests in flight at once (runs compare only at equal values)
    dummy_weights: str = ""  # why its weights are random (orchestrator.config.weights_scope); "" = real: (a), (b) judge it
    plugin: bool = False  # SGLang run with the specsweep_verify plugin as a backend (its counters are recorded)
    speculative: bool = False  # drafter.algorithm is not NONE
    temperature: float = 0.0  # probe.temperature: a sweep always probes at 0 (not a config key: config/schema.py)
    dtype: str = ""  # model.dtype
    lossless_key: str = ""  # the point without its drafter (specsweep_common.point_key.lossless_key); "" = not recorded
    output: GreedyOutput | None = None  # its output_ids.json (report/read_back.py `with_outputs`); None = not read

    def metric(self, key: str) -> float | None:
        v = self.metrics.get(key)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    def need(self, key: str) -> float:
        """metric(key) where the caller has already kept only runs that have it."""
        v = self.metric(key)
        if v is None:
            raise ValueError(f"run {self.run_id}: metric {key!r} is missing or NaN")
        return v

    @property
    def simulated(self) -> bool:
        kind = EngineKind.named(self.engine)
        return kind is not None and kind.simulated


@dataclass(frozen=True)
class Finding:
    cause: Cause
    summary: str
    evidence: tuple[str, ...]  # one line per cited run / number
    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class Check:
    """One rule on this sweep: evaluated (`detail` says what was checked) or not (`detail` says why)."""

    rule: Rule
    evaluated: bool
    detail: str


@dataclass(frozen=True)
class Diagnosis:
    runs: int  # rows examined (stub-engine ones included)
    simulated: int  # of them on the stub engine: in no rule
    findings: tuple[Finding, ...]
    checks: tuple[Check, ...]
    dummy_weights: tuple[str, ...] = ()  # why, for each real-engine run on random weights: not in (a), (b)

    @property
    def not_evaluated(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.evaluated)

    @property
    def verdict(self) -> Verdict:
        if self.runs == self.simulated:  # nothing, or only stub-engine runs
            return Verdict.NO_RUNS
        if self.findings:
            return Verdict.FINDINGS
        return Verdict.INCOMPLETE if self.not_evaluated else Verdict.HEALTHY

    @property
    def causes(self) -> list[Cause]:
        return [f.cause for f in self.findings]


def cite(row: RunRow, *keys: str) -> str:
    values = ", ".join(f"{k}={row.metric(k):.4g}" for k in keys if row.metric(k) is not None)
    return f"`{row.name}` (run {row.run_id[:8]}): {values}"


def ctx(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)
