"""The diagnosis names exactly the right cause for synthetic sweeps, and nothing else."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.diagnosis import Cause, RunRow, Thresholds, diagnose, render_markdown

CONTEXTS = (1024, 4096, 16384, 65536)
PEAK_GBS = 4250.0
NUM_STEPS = 4


def healthy_metrics(ctx: int, probe: str, drafter: str) -> dict[str, float]:
    """A believable healthy run on an H200: linear verify time, bandwidth near the roofline."""
    commit = {"oracle": NUM_STEPS + 1.0, "ngram": 4.6 if probe == "predictable" else 2.2}[drafter]
    kv_bytes = ctx * 36 * 8 * 256 * 2  # Qwen3-8B-ish per step
    step_ms = 0.4 + kv_bytes / (0.8 * PEAK_GBS * 1e9) * 1e3
    return {"commit_len_mean": commit, "verify_step_ms": step_ms,
            "kv_bw_gbs": kv_bytes / (step_ms * 1e-3) / 1e9, "gpu_util_mean": 92.0, "roofline_frac": 0.8}


def sweep(mutate=None) -> list[RunRow]:
    rows = []
    for i, (ctx, probe, drafter) in enumerate(itertools.product(CONTEXTS, ("predictable", "novel"),
                                                                ("ngram", "oracle"))):
        m = healthy_metrics(ctx, probe, drafter)
        row = RunRow(run_id=f"{i:08d}deadbeef", name=f"ctx={ctx // 1024}k probe={probe} drafter={drafter} page=1 "
                     "attn=triton", context_len=ctx, probe=probe, drafter=drafter, attention="triton",
                     page_size=1, is_oracle=drafter == "oracle", num_steps=NUM_STEPS, metrics=m)
        rows.append(mutate(row, m) or row if mutate else row)
    return rows


def causes(rows) -> set[Cause]:
    return {f.cause for f in diagnose(rows, Thresholds(), peak_gbs=PEAK_GBS)}


def test_healthy_sweep_has_no_finding():
    rows = sweep()
    assert causes(rows) == set()
    assert "Healthy" in render_markdown(diagnose(rows, peak_gbs=PEAK_GBS), "s", len(rows))


def test_oracle_underperforming_is_a_pipeline_bug():
    def mutate(row, m):
        if row.is_oracle and row.context_len == 16384 and row.probe == "novel":
            m["commit_len_mean"] = 4.5
    rows = sweep(mutate)
    findings = diagnose(rows, peak_gbs=PEAK_GBS)
    assert [f.cause for f in findings] == [Cause.PIPELINE_BUG]
    bad = next(r for r in rows if r.is_oracle and r.context_len == 16384 and r.probe == "novel")
    assert findings[0].run_ids == (bad.run_id,)
    assert "commit_len_mean=4.5" in findings[0].evidence[0] and "expected 5" in findings[0].evidence[0]


def test_collapse_on_predictable_text_is_a_long_context_drafting_bug():
    def mutate(row, m):
        if row.drafter == "ngram" and row.context_len >= 16384:
            m["commit_len_mean"] = 1.1  # both probes collapse
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert [f.cause for f in findings] == [Cause.LONG_CONTEXT_DRAFTING_BUG]
    text = render_markdown(findings, "s", 16)
    assert "sliding-window" in text and "ctx 1k -> 16k" in text and "commit_len_mean=1.1" in text


def test_collapse_only_on_novel_text_is_drafter_quality():
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "novel" and row.context_len >= 16384:
            m["commit_len_mean"] = 1.2
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert [f.cause for f in findings] == [Cause.DRAFTER_QUALITY]
    assert all("probe=novel" in e for e in findings[0].evidence)


def test_superlinear_verify_time_and_low_bandwidth_are_kernel_bound():
    def mutate(row, m):
        # the verify path streams the prefix once per head: quadratic-ish growth, 7 GB/s
        m["verify_step_ms"] = 0.02 * (row.context_len / 1024) ** 1.8
        m["kv_bw_gbs"] = 7.0
        m["roofline_frac"] = 0.002
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert [f.cause for f in findings] == [Cause.KERNEL_BOUND]
    assert "attn=triton page=1" in findings[0].summary
    assert any("context^1.8" in e for e in findings[0].evidence)
    assert any("of the device's 4250 GB/s" in e for e in findings[0].evidence)


def test_low_gpu_utilisation_with_slow_steps_is_host_bound():
    def mutate(row, m):
        m["gpu_util_mean"] = 23.0
        m["roofline_frac"] = 0.3  # slow, but bandwidth still above the kernel-bound threshold
        m["kv_bw_gbs"] = 0.3 * PEAK_GBS
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert [f.cause for f in findings] == [Cause.HOST_BOUND]
    assert "gpu_util_mean=23" in findings[0].evidence[0]


@pytest.mark.parametrize("drop, fires", [(0.49, False), (0.51, True)])
def test_collapse_threshold_is_respected(drop, fires):
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "predictable" and row.context_len == 65536:
            m["commit_len_mean"] = 1 + (4.6 - 1) * (1 - drop)
    assert (Cause.LONG_CONTEXT_DRAFTING_BUG in causes(sweep(mutate))) is fires
