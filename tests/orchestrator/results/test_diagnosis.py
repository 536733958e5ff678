"""The diagnosis names exactly the right cause for synthetic sweeps, and nothing else; it says what it could not
check, and never calls a sweep healthy on rules it could not evaluate."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from orchestrator.config.settings import Thresholds
from orchestrator.results.diagnosis import Cause, Rule, RunRow, Verdict, diagnose
from orchestrator.results.diagnosis_md import render_markdown
from specsweep_common.greedy_output import GreedyOutput

CONTEXTS = (1024, 4096, 16384, 65536)
PEAK_GBS = 4250.0
NUM_STEPS = 4


def healthy_metrics(ctx: int, probe: str, drafter: str) -> dict[str, float]:
    """A believable healthy run on an H200: linear verify time, bandwidth near the roofline."""
    commit = {"oracle": NUM_STEPS + 1.0, "ngram": 4.6 if probe == "predictable" else 3.4}[drafter]
    kv_bytes = ctx * 36 * 8 * 256 * 2  # Qwen3-8B-ish per step
    step_ms = 0.4 + kv_bytes / (0.8 * PEAK_GBS * 1e9) * 1e3
    return {"commit_len_mean": commit, "verify_step_ms": step_ms,
            "kv_bw_gbs": kv_bytes / (step_ms * 1e-3) / 1e9, "gpu_util_mean": 92.0, "roofline_frac": 0.8}


# every run's greedy output: the speculative runs produce their drafter=none run's tokens (rule (f) holds)
OUTPUT = GreedyOutput(tuple(range(100, 132)), tuple(((-0.1, 100 + i), (-3.0, 7)) for i in range(32)))


def sweep(mutate=None, probes=("predictable", "novel"), drafters=("ngram", "oracle"), contexts=CONTEXTS,
          engine="sglang") -> list[RunRow]:
    """Each point with every drafter, and its drafter=none run (no commit figures) for the lossless check."""
    rows = []
    for i, (ctx, probe, drafter) in enumerate(itertools.product(contexts, probes, drafters)):
        m = healthy_metrics(ctx, probe, drafter)
        row = RunRow(run_id=f"{i:08d}deadbeef", name=f"ctx={ctx // 1024}k probe={probe} drafter={drafter} page=1 "
                     "attn=triton", context_len=ctx, probe=probe, drafter=drafter, attention="triton",
                     page_size=1, is_oracle=drafter == "oracle", num_steps=NUM_STEPS, metrics=m, engine=engine,
                     speculative=True, lossless_key=f"{ctx}-{probe}", output=OUTPUT)
        rows.append(mutate(row, m) or row if mutate else row)
    for i, (ctx, probe) in enumerate(itertools.product(contexts, probes)):
        rows.append(RunRow(run_id=f"{i:08d}0000none", name=f"ctx={ctx // 1024}k probe={probe} drafter=none page=1 "
                           "attn=triton", context_len=ctx, probe=probe, drafter="none", attention="triton",
                           page_size=1, engine=engine, lossless_key=f"{ctx}-{probe}", output=OUTPUT))
    return rows


def causes(rows) -> set[Cause]:
    return set(diagnose(rows, Thresholds(), peak_gbs=PEAK_GBS).causes)


def test_healthy_sweep_has_no_finding():
    rows = sweep()
    d = diagnose(rows, peak_gbs=PEAK_GBS)
    assert d.causes == [] and d.not_evaluated == () and d.verdict is Verdict.HEALTHY
    assert {c.rule for c in d.checks} == set(Rule) - {Rule.PLUGIN_DISPATCH}  # (e): only with plugin runs
    text = render_markdown(d, "s")
    assert "**Healthy**" in text and "24 run(s) examined" in text and "Not checked" not in text


def test_oracle_underperforming_is_a_pipeline_bug():
    def mutate(row, m):
        if row.is_oracle and row.context_len == 16384 and row.probe == "novel":
            m["commit_len_mean"] = 4.5
    rows = sweep(mutate)
    findings = diagnose(rows, peak_gbs=PEAK_GBS).findings
    assert [f.cause for f in findings] == [Cause.PIPELINE_BUG]
    bad = next(r for r in rows if r.is_oracle and r.context_len == 16384 and r.probe == "novel")
    assert findings[0].run_ids == (bad.run_id,)
    assert "commit_len_mean=4.5" in findings[0].evidence[0] and "expected 5" in findings[0].evidence[0]


def test_sglang_oracle_whose_last_step_overshoots_is_healthy():
    """SGLang's meta_info for an oracle at gen_tokens=32 (5 a step): 7 verify steps and 28 correct drafts counted,
    32 tokens sent. commit_len_mean comes out 5, so rule (a) holds; the old (completion - 1) / verify_ct gave 4.43."""
    from workers.http_client import Generation
    from workers.measurement import measure

    meta = {"prompt_tokens": 16384, "completion_tokens": 32, "e2e_latency": 1.0, "ttft": 0.2, "spec_verify_ct": 7,
            "spec_num_correct_drafts": 28, "spec_num_proposed_drafts": 28, "spec_accept_rate": 1.0,
            "spec_accept_length": 32 / 7, "spec_correct_drafts_histogram": [0, 0, 0, 0, 7],
            "finish_reason": {"type": "length", "length": 32}}
    m = measure(Generation("", list(range(32)), meta, 0.2, 1.0), expect_spec=True, version="0.5.23").metrics

    def mutate(row, metrics):
        if row.is_oracle:
            metrics.update(m)
    d = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert d.causes == [] and d.verdict is Verdict.HEALTHY and m["commit_len_mean"] == NUM_STEPS + 1
    assert m["emitted_per_verify"] == pytest.approx(31 / 7)  # recorded, but no rule reads it


def test_collapse_on_predictable_text_is_a_long_context_drafting_bug():
    def mutate(row, m):
        if row.drafter == "ngram" and row.context_len >= 16384:
            m["commit_len_mean"] = 1.1  # both probes collapse
    d = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert d.causes == [Cause.LONG_CONTEXT_DRAFTING_BUG] and d.verdict is Verdict.FINDINGS
    text = render_markdown(d, "s")
    assert "sliding-window" in text and "ctx 1k -> 16k" in text and "commit_len_mean=1.1" in text


def test_collapse_only_on_novel_text_is_drafter_quality():
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "novel" and row.context_len >= 16384:
            m["commit_len_mean"] = 1.2
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS).findings
    assert [f.cause for f in findings] == [Cause.DRAFTER_QUALITY]
    assert all("probe=novel" in e for e in findings[0].evidence)


def test_superlinear_verify_time_and_low_bandwidth_are_kernel_bound():
    def mutate(row, m):
        # the verify path streams the prefix once per head: quadratic-ish growth, 7 GB/s
        m["verify_step_ms"] = 0.02 * (row.context_len / 1024) ** 1.8
        m["kv_bw_gbs"] = 7.0
        m["roofline_frac"] = 0.002
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS).findings
    assert [f.cause for f in findings] == [Cause.KERNEL_BOUND]
    assert "attn=triton page=1" in findings[0].summary
    assert any("context^1.8" in e for e in findings[0].evidence)
    assert any("of the device's 4250 GB/s" in e for e in findings[0].evidence)


def test_low_gpu_utilisation_with_slow_steps_is_host_bound():
    def mutate(row, m):
        m["gpu_util_mean"] = 23.0
        m["roofline_frac"] = 0.3  # slow, but bandwidth still above the kernel-bound threshold
        m["kv_bw_gbs"] = 0.3 * PEAK_GBS
    findings = diagnose(sweep(mutate), peak_gbs=PEAK_GBS).findings
    assert [f.cause for f in findings] == [Cause.HOST_BOUND]
    assert "gpu_util_mean=23" in findings[0].evidence[0]


@pytest.mark.parametrize("drop, fires", [(0.49, False), (0.51, True)])
def test_collapse_threshold_is_respected(drop, fires):
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "predictable" and row.context_len == 65536:
            m["commit_len_mean"] = 1 + (4.6 - 1) * (1 - drop)
    assert (Cause.LONG_CONTEXT_DRAFTING_BUG in causes(sweep(mutate))) is fires


def test_novel_text_far_below_predictable_at_every_context_is_drafter_quality():
    """No collapse with context, but novel text drafts a fraction of what predictable text does."""
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "novel":
            m["commit_len_mean"] = 1.5
    d = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert d.causes == [Cause.DRAFTER_QUALITY]
    assert len(d.findings[0].evidence) == len(CONTEXTS)
    assert "commit_len_mean=4.6 vs" in d.findings[0].evidence[0] and "novel text drafts 14%" in \
        d.findings[0].evidence[0]


@pytest.mark.parametrize("novel, fires", [(1 + 3.6 * 0.51, False), (1 + 3.6 * 0.49, True)])
def test_novel_gap_threshold_is_respected(novel, fires):
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "novel":
            m["commit_len_mean"] = novel
    assert (Cause.DRAFTER_QUALITY in causes(sweep(mutate))) is fires


# --- what could not be evaluated is said, never called healthy ---------------------------------------------------


def test_no_run_examined_is_no_verdict():
    d = diagnose([], peak_gbs=PEAK_GBS)
    assert d.verdict is Verdict.NO_RUNS and d.findings == ()
    text = render_markdown(d, "s")
    assert "0 run(s) examined" in text and "**No verdict**" in text and "Healthy" not in text


def _checks(d):
    return {c.rule: c for c in d.checks}


def test_no_oracle_in_the_sweep_is_not_checked_not_healthy():
    d = diagnose(sweep(drafters=("ngram",)), peak_gbs=PEAK_GBS)
    assert d.findings == () and d.verdict is Verdict.INCOMPLETE
    oracle = _checks(d)[Rule.ORACLE]
    assert not oracle.evaluated and "no oracle drafter in the sweep" in oracle.detail
    assert [c.rule for c in d.not_evaluated] == [Rule.ORACLE]
    text = render_markdown(d, "s")
    assert "Healthy" not in text and "oracle commits its maximum" not in text
    assert "## Not checked" in text and "(a) oracle commits num_steps + 1: no oracle drafter in the sweep" in text


def test_without_a_predictable_novel_pair_the_drafter_quality_rule_is_not_evaluated():
    d = diagnose(sweep(probes=("novel",)), peak_gbs=PEAK_GBS)
    checks = _checks(d)
    assert d.verdict is Verdict.INCOMPLETE
    assert not checks[Rule.DRAFTER_QUALITY].evaluated and "no predictable/novel pair" in \
        checks[Rule.DRAFTER_QUALITY].detail
    assert not checks[Rule.PREDICTABLE_COLLAPSE].evaluated
    assert checks[Rule.ORACLE].evaluated and checks[Rule.STEP_GROWTH].evaluated
    assert "**No verdict**: no rule fired, but 2 of 7 could not be evaluated" in render_markdown(d, "s")


def test_novel_collapse_without_predictable_text_names_no_cause_and_says_why():
    """Novel text alone cannot separate a pipeline bug from a weak drafter: no drafter-quality finding."""
    def mutate(row, m):
        if row.drafter == "ngram" and row.context_len >= 16384:
            m["commit_len_mean"] = 1.1
    d = diagnose(sweep(mutate, probes=("novel",)), peak_gbs=PEAK_GBS)
    assert d.findings == () and d.verdict is Verdict.INCOMPLETE
    check = _checks(d)[Rule.DRAFTER_QUALITY]
    assert not check.evaluated
    assert "collapses on novel text for drafter=ngram attn=triton page=1" in check.detail
    assert "add probe=predictable" in check.detail


def test_one_context_only_cannot_show_a_collapse():
    d = diagnose(sweep(contexts=(1024,)), peak_gbs=PEAK_GBS)
    checks = _checks(d)
    assert d.verdict is Verdict.INCOMPLETE
    assert not checks[Rule.PREDICTABLE_COLLAPSE].evaluated and "one context only (1k)" in \
        checks[Rule.PREDICTABLE_COLLAPSE].detail
    assert not checks[Rule.STEP_GROWTH].evaluated and not checks[Rule.KV_BANDWIDTH].evaluated


def test_cpu_sweep_without_gpu_telemetry_lists_what_was_not_checked():
    """The embedded CPU default: 1k-8k, no GPU utilisation, no device peak."""
    def mutate(row, m):
        for k in ("gpu_util_mean", "kv_bw_gbs", "roofline_frac"):
            del m[k]
    d = diagnose(sweep(mutate, contexts=(1024, 4096, 8192)), peak_gbs=None)
    assert d.findings == () and d.verdict is Verdict.INCOMPLETE
    assert {c.rule for c in d.not_evaluated} == {Rule.KV_BANDWIDTH, Rule.HOST_BOUND}
    text = render_markdown(d, "s")
    assert "**No verdict**: no rule fired, but 2 of 7 could not be evaluated" in text
    assert "(d) GPU utilisation vs step time: no run carries gpu_util_mean" in text
    assert "## Checked" in text and "(a) oracle commits num_steps + 1: 6 of 6 oracle run(s)" in text


def test_collapse_only_on_novel_text_names_drafter_quality_in_the_report_text():
    def mutate(row, m):
        if row.drafter == "ngram" and row.probe == "novel" and row.context_len >= 4096:
            m["commit_len_mean"] = 1.3
    d = diagnose(sweep(mutate), peak_gbs=PEAK_GBS)
    assert d.causes == [Cause.DRAFTER_QUALITY] and _checks(d)[Rule.DRAFTER_QUALITY].evaluated
    text = render_markdown(d, "s")
    assert "## drafter quality" in text and "Healthy" not in text and "pipeline bug" not in text


def test_stub_engine_runs_never_get_a_pipeline_bug():
    """Stub commits are simulated: even an oracle 'shortfall' on the stub is no finding, and no verdict."""
    def mutate(row, m):
        if row.is_oracle:
            m["commit_len_mean"] = 2.0
        if row.drafter == "ngram" and row.context_len >= 16384:
            m["commit_len_mean"] = 1.0
    rows = sweep(mutate, engine="stub")
    d = diagnose(rows, peak_gbs=PEAK_GBS)
    assert d.findings == () and d.simulated == len(rows) and d.verdict is Verdict.NO_RUNS
    assert all("stub engine" in c.detail for c in d.checks)
    text = render_markdown(d, "s")
    assert "pipeline bug" not in text and "Healthy" not in text and "**No verdict**" in text
    assert f"{len(rows)} run(s) ran on the stub engine" in text
    # the same numbers from a real engine are a pipeline bug
    real = [dataclasses.replace(r, engine="reference") for r in rows]
    assert Cause.PIPELINE_BUG in diagnose(real, peak_gbs=PEAK_GBS).causes


def test_earlier_invocations_are_counted_in_the_text():
    d = diagnose(sweep(), peak_gbs=PEAK_GBS)
    assert "24 run(s) examined (5 of them from earlier invocations" in render_markdown(d, "s", earlier=5)


def test_runs_at_other_concurrency_are_their_own_series():
    """A batched run's verify step (16 requests) is slower by design: mixed into the concurrency-1 series it would
    fake superlinear growth; as its own series (one context) it is not evidence of anything."""
    rows = sweep()
    batched = [dataclasses.replace(r, run_id=f"{r.run_id}-c16", concurrency=16,
                                   metrics={**r.metrics, "verify_step_ms": 200 * r.metrics["verify_step_ms"],
                                            "kv_bw_gbs": r.metrics["kv_bw_gbs"]})
               for r in rows if r.context_len == 65536 and r.speculative]
    assert causes(rows + batched) == set()
    d = diagnose(rows + batched, Thresholds(), peak_gbs=PEAK_GBS)
    growth = next(c for c in d.checks if c.rule is Rule.STEP_GROWTH)
    assert "concurrency=16" not in growth.detail  # one context only: no growth to test
    # the same runs labelled concurrency 1 are counted as growth (the mix this keying prevents)
    mixed = [dataclasses.replace(r, concurrency=1) for r in batched]
    assert Cause.KERNEL_BOUND in causes(rows + mixed)


def _plugin_sweep(counters: dict[str, dict[str, float] | None]) -> list[RunRow]:
    """The healthy sweep, its ngram runs at 1k as specsweep_verify runs with the given plugin counters
    (None: none recorded)."""
    rows, i = sweep(), 0
    for r in [r for r in rows if r.drafter == "ngram" and r.context_len == 1024]:
        c = list(counters.values())[i]
        i += 1
        m = {**r.metrics, **(c or {})}
        rows.append(dataclasses.replace(r, run_id=f"plugin{i:02d}feedface", name=list(counters)[i - 1],
                                        attention="specsweep_verify", plugin=True, metrics=m))
    return rows


def test_a_specsweep_verify_run_that_fell_back_or_never_ran_the_kernel_is_flagged():
    from specsweep_common import plugin_counters as pc

    ok = pc.run_metrics({}, {("verify", "kernel", ""): 7200.0})
    fell = pc.run_metrics({("verify", "kernel", ""): 10.0},
                          {("verify", "kernel", ""): 10.0, ("verify", "fallback", "tokens"): 3600.0})
    assert ok == {"plugin_kernel_calls": 7200.0, "plugin_fallback_calls": 0.0, "plugin_verify_kernel_calls": 7200.0,
                  "plugin_decode_kernel_calls": 0.0}
    assert fell["plugin_fallback_calls"] == fell["plugin_fallback_calls.tokens"] == 3600.0
    assert fell["plugin_kernel_calls"] == 0.0
    d = diagnose(_plugin_sweep({"ran": ok, "fell back": fell}), peak_gbs=PEAK_GBS)
    assert d.causes == [Cause.KERNEL_NOT_RUN] and d.verdict is Verdict.FINDINGS
    (finding,) = d.findings
    assert finding.run_ids == ("plugin02feedface",)
    assert "3600 layer call(s) fell back to SGLang's Triton backend (tokens: 3600)" in finding.evidence[0]
    check = next(c for c in d.checks if c.rule is Rule.PLUGIN_DISPATCH)
    assert check.evaluated and "1 of 2 specsweep_verify run(s)" in check.detail
    # no kernel call at all, and no counters recorded: both unproven
    idle = pc.run_metrics({("decode", "kernel", ""): 5.0}, {("decode", "kernel", ""): 5.0})
    d = diagnose(_plugin_sweep({"idle": idle, "unread": None}), peak_gbs=PEAK_GBS)
    (finding,) = d.findings
    assert "never called" in finding.evidence[0] and "no plugin counters were recorded" in finding.evidence[1]
    # only proven runs: healthy, the rule evaluated
    d = diagnose(_plugin_sweep({"a": ok, "b": ok}), peak_gbs=PEAK_GBS)
    assert d.verdict is Verdict.HEALTHY and "2 of 2" in next(
        c.detail for c in d.checks if c.rule is Rule.PLUGIN_DISPATCH)


def test_report_rows_know_plugin_runs_from_engine_and_backends():
    from types import SimpleNamespace

    from orchestrator.results.report.read_back import row_from_run

    def run(engine: str, **params: str):
        return SimpleNamespace(info=SimpleNamespace(run_id="r1", run_name="n"),
                               data=SimpleNamespace(params={"context_len": "1024", **params}, metrics={},
                                                    tags={"engine": engine}))

    assert row_from_run(run("sglang", **{"attention.backend": "specsweep_verify"})).plugin
    assert row_from_run(run("sglang", **{"attention.backend": "triton",
                                         "attention.decode_backend": "specsweep_verify"})).plugin
    assert not row_from_run(run("sglang", **{"attention.backend": "triton"})).plugin
    assert not row_from_run(run("reference", **{"attention.backend": "specsweep_verify"})).plugin
