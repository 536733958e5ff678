"""Automatic diagnosis of a sweep: pipeline bug vs drafter quality vs kernel- or host-bound.

Pure functions over `RunRow`s (one per child run); every finding cites the runs and numbers that
prove it. The rules (thresholds in `Thresholds`, set from the `report` config):

(a) the oracle drafter commits less than num_steps + 1 per verify step  -> pipeline bug;
(b) commit collapse with context (>= `collapse_drop` below the shortest context of the same
    drafter x page x attention) on predictable text -> drafting bug at long context; collapse only
    on novel text -> drafter quality, not infrastructure;
(c) verify-step time growing faster than linearly with context, or effective KV bandwidth under
    `min_bw_frac` of the device's peak at contexts >= `bw_min_context` (shorter prefixes are
    overhead-dominated) -> attention-kernel bound (names backend and page size);
(d) GPU utilisation under `max_gpu_util` while the step time is high -> launch- or host-bound.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


class Cause(str, enum.Enum):
    PIPELINE_BUG = "pipeline bug"
    LONG_CONTEXT_DRAFTING_BUG = "drafting bug at long context"
    DRAFTER_QUALITY = "drafter quality"
    KERNEL_BOUND = "attention-kernel bound"
    HOST_BOUND = "launch- or host-bound"


@dataclass(frozen=True)
class Thresholds:
    oracle_tolerance: float = 1e-6  # commit_len_mean may fall this far below num_steps + 1
    collapse_drop: float = 0.5  # fraction lost from the shortest context
    superlinear_exponent: float = 1.3  # verify_step_ms ~ context^k with k above this
    min_context_ratio: float = 4.0  # the super-linearity test needs contexts this far apart
    min_bw_frac: float = 0.10  # kv_bw_gbs / device peak GB/s
    bw_min_context: int = 16384  # short prefixes are overhead-dominated: judge bandwidth from here up
    max_gpu_util: float = 50.0  # percent
    high_step_ms: float = 5.0  # "step time is high" for rule (d) when no roofline is known
    max_roofline_frac_host: float = 0.5  # ... or roofline_frac under this


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

    def metric(self, key: str) -> float | None:
        v = self.metrics.get(key)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


@dataclass(frozen=True)
class Finding:
    cause: Cause
    summary: str
    evidence: tuple[str, ...]  # one line per cited run / number
    run_ids: tuple[str, ...]


def _cite(row: RunRow, *keys: str) -> str:
    values = ", ".join(f"{k}={row.metric(k):.4g}" for k in keys if row.metric(k) is not None)
    return f"`{row.name}` (run {row.run_id[:8]}): {values}"


def _ctx(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def find_oracle_shortfall(rows: Sequence[RunRow], th: Thresholds) -> list[Finding]:
    bad = [r for r in rows if r.is_oracle and r.metric("commit_len_mean") is not None
           and r.metric("commit_len_mean") < r.num_steps + 1 - th.oracle_tolerance]
    if not bad:
        return []
    return [Finding(
        Cause.PIPELINE_BUG,
        f"The oracle drafter (the target drafting for itself) committed less than num_steps + 1 in "
        f"{len(bad)} run(s): every oracle draft must be accepted whatever the text, so the speculative "
        f"pipeline itself is broken (draft/verify positions, KV rollback, tree mask or acceptance).",
        tuple(f"{_cite(r, 'commit_len_mean')}; expected {r.num_steps + 1}" for r in bad),
        tuple(r.run_id for r in bad),
    )]


def _series_key(r: RunRow) -> tuple[str, str, int]:
    return (r.drafter, r.attention, r.page_size)


def _collapses(rows: Iterable[RunRow], th: Thresholds) -> dict[tuple, list[tuple[RunRow, RunRow]]]:
    """(probe, drafter, attention, page) -> [(shortest-context run, collapsed longer run)]."""
    by: dict[tuple, list[RunRow]] = defaultdict(list)
    for r in rows:
        if not r.is_oracle and r.metric("commit_len_mean") is not None:
            by[(r.probe, *_series_key(r))].append(r)
    out: dict[tuple, list[tuple[RunRow, RunRow]]] = {}
    for key, series in by.items():
        series.sort(key=lambda r: r.context_len)
        base = series[0]
        # commit_len counts the bonus token (>= 1 always): a collapse is measured on the drafted part.
        base_gain = base.metric("commit_len_mean") - 1.0
        if base_gain <= 0:
            continue
        hits = [(base, r) for r in series[1:] if r.context_len > base.context_len
                and (r.metric("commit_len_mean") - 1.0) <= (1 - th.collapse_drop) * base_gain]
        if hits:
            out[key] = hits
    return out


def _collapse_finding(cause: Cause, collapses: dict[tuple, list[tuple[RunRow, RunRow]]], summary: str) -> Finding:
    pairs = [p for v in collapses.values() for p in v]
    return Finding(cause, summary,
                   tuple(f"{_cite(lo, 'commit_len_mean')} -> {_cite(hi, 'commit_len_mean')} "
                         f"at ctx {_ctx(lo.context_len)} -> {_ctx(hi.context_len)}" for lo, hi in pairs),
                   tuple(r.run_id for p in pairs for r in p))


def find_commit_collapse(rows: Sequence[RunRow], th: Thresholds) -> list[Finding]:
    collapses = _collapses(rows, th)
    findings = []
    predictable = {k: v for k, v in collapses.items() if k[0] == "predictable"}
    novel = {k: v for k, v in collapses.items() if k[0] != "predictable"}
    if predictable:
        findings.append(_collapse_finding(
            Cause.LONG_CONTEXT_DRAFTING_BUG, predictable,
            "Commit length collapses with context on predictable text, which any working drafter keeps "
            "committing: drafting is broken at long context (suspect sliding-window attention, the KV "
            "cache, or RoPE/YaRN positions)."))
    # Novel-text collapse means drafter quality only where the same drafter stays healthy on
    # predictable text (otherwise the predictable finding above already explains it).
    healthy_novel = {k: v for k, v in novel.items() if ("predictable", *k[1:]) not in predictable}
    if healthy_novel:
        findings.append(_collapse_finding(
            Cause.DRAFTER_QUALITY, healthy_novel,
            "Commit length collapses with context only on novel text while predictable text keeps "
            "committing: the pipeline is healthy; the drafter cannot predict this text (drafter quality, "
            "not infrastructure)."))
    return findings


def find_kernel_bound(rows: Sequence[RunRow], th: Thresholds, peak_gbs: float | None) -> list[Finding]:
    evidence: list[str] = []
    ids: list[str] = []
    named: set[tuple[str, int]] = set()
    by: dict[tuple[str, int], list[RunRow]] = defaultdict(list)
    for r in rows:
        if r.metric("verify_step_ms") is not None:
            by[(r.attention, r.page_size)].append(r)
    for (attn, page), series in sorted(by.items()):
        # One point per context: the median step time over drafters/probes at that context.
        per_ctx: dict[int, list[float]] = defaultdict(list)
        for r in series:
            per_ctx[r.context_len].append(r.metric("verify_step_ms"))
        ctxs = sorted(per_ctx)
        med = {c: sorted(v)[len(v) // 2] for c, v in per_ctx.items()}
        if len(ctxs) >= 2 and ctxs[-1] / ctxs[0] >= th.min_context_ratio and med[ctxs[0]] > 0:
            k = math.log(med[ctxs[-1]] / med[ctxs[0]]) / math.log(ctxs[-1] / ctxs[0])
            if k > th.superlinear_exponent:
                named.add((attn, page))
                evidence.append(f"attn={attn} page={page}: verify_step_ms {med[ctxs[0]]:.4g} at ctx "
                                f"{_ctx(ctxs[0])} -> {med[ctxs[-1]]:.4g} at ctx {_ctx(ctxs[-1])}, "
                                f"grows as context^{k:.2f} (> {th.superlinear_exponent})")
                ids += [r.run_id for r in series]
        for r in series:
            peak = r.metric("peak_bw_gbs") or peak_gbs
            bw = r.metric("kv_bw_gbs")
            if peak and bw is not None and r.context_len >= th.bw_min_context and bw < th.min_bw_frac * peak:
                named.add((attn, page))
                evidence.append(f"{_cite(r, 'kv_bw_gbs', 'verify_step_ms')}: {100 * bw / peak:.1f}% of "
                                f"the device's {peak:.0f} GB/s (< {100 * th.min_bw_frac:.0f}%)")
                ids.append(r.run_id)
    if not named:
        return []
    which = ", ".join(f"attn={a} page={p}" for a, p in sorted(named))
    return [Finding(
        Cause.KERNEL_BOUND,
        f"The verify pass is attention-kernel bound for {which}: step time far above what the KV "
        f"bytes need. Try another attention backend or page size, or this project's verify kernel.",
        tuple(evidence), tuple(dict.fromkeys(ids)),
    )]


def find_host_bound(rows: Sequence[RunRow], th: Thresholds) -> list[Finding]:
    bad = []
    for r in rows:
        util = r.metric("gpu_util_mean")
        if util is None or util >= th.max_gpu_util:
            continue
        frac, step = r.metric("roofline_frac"), r.metric("verify_step_ms")
        high = (frac is not None and frac < th.max_roofline_frac_host) or \
               (frac is None and step is not None and step >= th.high_step_ms)
        if high:
            bad.append(r)
    if not bad:
        return []
    return [Finding(
        Cause.HOST_BOUND,
        f"GPU utilisation stays under {th.max_gpu_util:.0f}% while the step time is high in {len(bad)} "
        f"run(s): the GPU waits on the host (kernel launches, Python, scheduling). CUDA graphs or a "
        f"larger batch are the usual cures.",
        tuple(_cite(r, "gpu_util_mean", "verify_step_ms", "roofline_frac") for r in bad),
        tuple(r.run_id for r in bad),
    )]


def diagnose(rows: Sequence[RunRow], th: Thresholds = Thresholds(), peak_gbs: float | None = None) -> list[Finding]:
    return [*find_oracle_shortfall(rows, th), *find_commit_collapse(rows, th),
            *find_kernel_bound(rows, th, peak_gbs), *find_host_bound(rows, th)]


def render_markdown(findings: Sequence[Finding], sweep: str, n_runs: int) -> str:
    lines = [f"# Diagnosis: {sweep}", "", f"{n_runs} run(s) examined."]
    if not findings:
        lines += ["", "**Healthy**: no rule fired. The oracle commits its maximum, commit length holds with "
                  "context, and verify-step time and bandwidth show no kernel or host bottleneck."]
    for f in findings:
        lines += ["", f"## {f.cause.value}", "", f.summary, ""] + [f"- {e}" for e in f.evidence]
    return "\n".join(lines) + "\n"
