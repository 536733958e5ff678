"""Automatic diagnosis of a sweep: pipeline bug vs drafter quality vs kernel- or host-bound.

Pure functions over `RunRow`s (one per FINISHED child run); every finding cites the runs and numbers that
prove it, and every rule says whether the sweep let it be evaluated (a `Check`). The rules (thresholds in
`Thresholds`, set from the `report` config):

(a) the oracle drafter commits less than num_steps + 1 per verify step  -> pipeline bug (commit_len_mean =
    1 + spec_num_correct_drafts / spec_verify_ct on every engine: exact even when the last step overshoots
    max_new_tokens, which SGLang counts whole but truncates in completion_tokens; workers.meta_info);
(b) commit collapse with context (>= `collapse_drop` below the shortest context of the same
    drafter x page x attention) on predictable text -> drafting bug at long context; while the same drafter
    holds on predictable text, a collapse with context on novel text, or novel text committing
    >= `novel_gap` less than predictable text at the same context -> drafter quality, not infrastructure
    (without predictable text of the same drafter the two cannot be told apart: not evaluated). The gap needs
    one shared context only. A novel-text run whose continuation loops (`continuation_repeat_frac`, the share of
    its word trigrams seen earlier in it, >= `loop_repeat_frac`) is easy text, not novel: left out and named;
(c) verify-step time growing faster than linearly with context, or effective KV bandwidth under
    `min_bw_frac` of the device's peak at contexts >= `bw_min_context` (shorter prefixes are
    overhead-dominated) -> attention-kernel bound (names backend and page size);
(d) GPU utilisation under `max_gpu_util` while the step time is high -> launch- or host-bound;
(e) (only in sweeps with such runs) an SGLang run with the specsweep_verify plugin whose dispatch counters show a
    fallback, no kernel call, or are missing -> the run does not measure the kernel its label names;
(f) the lossless check: at temperature 0 a speculative run's output tokens equal those of the drafter=none run of the
    same point (`lossless_key`: same engine, model, dtype, attention, page size, seed, context, probe text and
    gen_tokens). At the first divergence k the none-run's two best logprobs must be a tie: the two tokens are its top
    two at k and their logprobs differ by at most `lossless_tie_gap` (float32 models) or `lossless_tie_gap_16bit`
    (bfloat16 / float16), so either is a correct greedy choice and the texts legitimately part there (the rest is
    not compared); anything else -> pipeline bug (spec counters can look healthy while the text is wrong).

Runs on the stub engine (`engine` = stub) are examined by no rule: their commits and timings are simulated.
Runs on dummy weights (`model.load_format=dummy`, the built-in random `tiny`) are left out of (a) and (b): random
logits say nothing about the drafter or the pipeline (orchestrator/config/weights_scope.py); (f) judges them (greedy
decoding must be lossless whatever the weights). The report is
`orchestrator.results.diagnosis_md.render_markdown`.
The verdict is "Healthy" only when every rule was evaluated and none fired; with 0 runs there is no verdict.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrator.config.settings import Thresholds
from orchestrator.config.weights_scope import scoped
from orchestrator.results.findings import Cause, Check, Diagnosis, Finding, Rule, RunRow, Verdict, cite, ctx
from orchestrator.results.lossless import find_lossless_breach
from specsweep_common.plugin_counters import unproven

__all__ = ["Cause", "Check", "Diagnosis", "Finding", "Rule", "RunRow", "Verdict", "diagnose", "find_commit_collapse",
           "find_host_bound", "find_kernel_bound", "find_lossless_breach", "find_oracle_shortfall",
           "find_plugin_fallback"]


def find_oracle_shortfall(rows: Sequence[RunRow], th: Thresholds) -> tuple[list[Finding], Check]:
    oracle = [r for r in rows if r.is_oracle and r.metric("commit_len_mean") is not None]
    if not oracle:
        why = ("the oracle runs carry no commit_len_mean" if any(r.is_oracle for r in rows) else
               "no oracle drafter in the sweep (add drafter=oracle to the grid)")
        return [], Check(Rule.ORACLE, False, why)
    bad = [r for r in oracle if r.need("commit_len_mean") < r.num_steps + 1 - th.oracle_tolerance]
    check = Check(Rule.ORACLE, True, f"{len(oracle) - len(bad)} of {len(oracle)} oracle run(s) commit "
                                     f"num_steps + 1 per verify step")
    if not bad:
        return [], check
    return [Finding(
        Cause.PIPELINE_BUG,
        f"The oracle drafter (the target drafting for itself) committed less than num_steps + 1 in "
        f"{len(bad)} run(s): every oracle draft must be accepted whatever the text, so the speculative "
        f"pipeline itself is broken (draft/verify positions, KV rollback, tree mask or acceptance).",
        tuple(f"{cite(r, 'commit_len_mean')}; expected {r.num_steps + 1}" for r in bad),
        tuple(r.run_id for r in bad),
    )], check


SeriesKey = tuple[str, str, int, int]  # (drafter, attention, page_size, concurrency)


def _series_key(r: RunRow) -> SeriesKey:
    return (r.drafter, r.attention, r.page_size, r.concurrency)


def _conc(concurrency: int) -> str:
    return f" concurrency={concurrency}" if concurrency != 1 else ""


def _series_name(key: SeriesKey) -> str:
    return f"drafter={key[0]} attn={key[1]} page={key[2]}{_conc(key[3])}"


@dataclass(frozen=True)
class _Series:
    """One probe x drafter x attention x page over context: testable, or why not; its collapses."""

    runs: tuple[RunRow, ...]  # by context
    problem: str = ""  # why it cannot show a collapse ("" when testable)
    collapses: tuple[tuple[RunRow, RunRow], ...] = ()  # (shortest-context run, collapsed longer run)


def _series(rows: Iterable[RunRow], th: Thresholds) -> dict[tuple[str, str, str, int, int], _Series]:
    """(probe, drafter, attention, page, concurrency) -> its series, over the non-oracle runs with a commit length."""
    by: dict[tuple[str, str, str, int, int], list[RunRow]] = defaultdict(list)
    for r in rows:
        if not r.is_oracle and r.metric("commit_len_mean") is not None:
            key = (r.probe, *_series_key(r))  # a name, not by[(...)]: mypy misreads that as 3.11's by[a, *b]
            by[key].append(r)
    out: dict[tuple[str, str, str, int, int], _Series] = {}
    for key, runs in by.items():
        runs.sort(key=lambda r: r.context_len)
        base = runs[0]
        if len({r.context_len for r in runs}) < 2:
            out[key] = _Series(tuple(runs), f"one context only ({ctx(base.context_len)})")
            continue
        # commit_len counts the bonus token (>= 1 always): a collapse is measured on the drafted part.
        base_gain = base.need("commit_len_mean") - 1.0
        if base_gain <= 0:
            out[key] = _Series(tuple(runs), f"nothing drafted is accepted even at the shortest context "
                                            f"({cite(base, 'commit_len_mean')})")
            continue
        hits = tuple((base, r) for r in runs[1:] if r.context_len > base.context_len
                     and (r.need("commit_len_mean") - 1.0) <= (1 - th.collapse_drop) * base_gain)
        out[key] = _Series(tuple(runs), "", hits)
    return out


def _collapse_finding(cause: Cause, pairs: Sequence[tuple[RunRow, RunRow]], summary: str) -> Finding:
    return Finding(cause, summary,
                   tuple(f"{cite(lo, 'commit_len_mean')} -> {cite(hi, 'commit_len_mean')} "
                         f"at ctx {ctx(lo.context_len)} -> {ctx(hi.context_len)}" for lo, hi in pairs),
                   tuple(r.run_id for p in pairs for r in p))


def _untestable(series: dict, probe: str) -> str:
    return "; ".join(f"{_series_name(k[1:])}: {s.problem}" for k, s in sorted(series.items())
                     if k[0] == probe and s.problem)


def _gain_frac(pred: RunRow, novel: RunRow) -> float:
    return (novel.need("commit_len_mean") - 1.0) / (pred.need("commit_len_mean") - 1.0)


def _gaps(pred: _Series, novel: _Series, th: Thresholds) -> list[tuple[RunRow, RunRow]]:
    """(predictable run, novel run) at the same context where the novel one drafts >= novel_gap less."""
    at = {r.context_len: r for r in novel.runs}
    return [(p, at[p.context_len]) for p in pred.runs if p.context_len in at
            and p.need("commit_len_mean") > 1.0 and _gain_frac(p, at[p.context_len]) <= 1 - th.novel_gap]


def _loops(r: RunRow, th: Thresholds) -> bool:
    return r.probe == "novel" and (r.metric("continuation_repeat_frac") or 0.0) >= th.loop_repeat_frac


def _looping_note(looping: Sequence[RunRow], th: Thresholds) -> str:
    if not looping:
        return ""
    return (f"; left out as easy text, not novel: {len(looping)} novel-text run(s) whose continuation loops "
            f"(continuation_repeat_frac >= report.loop_repeat_frac={th.loop_repeat_frac:g}: "
            + ", ".join(cite(r, "continuation_repeat_frac") for r in looping) + ")")


def find_commit_collapse(rows: Sequence[RunRow], th: Thresholds) -> tuple[list[Finding], list[Check]]:
    looping = [r for r in rows if _loops(r, th)]  # a continuation that repeats itself is easy text
    series = _series([r for r in rows if not _loops(r, th)], th)
    testable = {k: s for k, s in series.items() if not s.problem}
    pred = {k[1:]: s for k, s in testable.items() if k[0] == "predictable"}
    novel = {k[1:]: s for k, s in testable.items() if k[0] == "novel"}
    findings: list[Finding] = []

    # (b1) predictable text: any working drafter keeps committing at every context.
    if pred:
        broken = [p for s in pred.values() for p in s.collapses]
        check1 = Check(Rule.PREDICTABLE_COLLAPSE, True,
                       f"{len(pred)} drafter x attention x page series on predictable text, "
                       f"{len(pred) - sum(bool(s.collapses) for s in pred.values())} hold with context")
        if broken:
            findings.append(_collapse_finding(
                Cause.LONG_CONTEXT_DRAFTING_BUG, broken,
                "Commit length collapses with context on predictable text, which any working drafter keeps "
                "committing: drafting is broken at long context (suspect sliding-window attention, the KV "
                "cache, or RoPE/YaRN positions)."))
    else:
        why = _untestable(series, "predictable")
        check1 = Check(Rule.PREDICTABLE_COLLAPSE, False,
                       "no predictable-text series of a drafter other than the oracle over two or more contexts"
                       + (f" ({why})" if why else ""))

    # (b2) novel text below predictable text means drafter quality only where the same drafter holds on
    # predictable text; without that predictable series a pipeline bug and a weak drafter cannot be told apart.
    # The same-context gap needs one shared context only (a 1k-only probe is judged); a collapse needs two.
    paired = {k: s for k, s in novel.items() if k in pred}
    pred_any = {k[1:]: s for k, s in series.items() if k[0] == "predictable"}
    same_ctx = {k[1:]: s for k, s in series.items() if k[0] == "novel" and k[1:] in pred_any
                and {r.context_len for r in s.runs} & {r.context_len for r in pred_any[k[1:]].runs}}
    quality = [p for k, s in paired.items() if not pred[k].collapses for p in s.collapses]
    gaps = [gap for k, s in sorted(same_ctx.items()) if not pred_any[k].collapses for gap in _gaps(pred_any[k], s, th)]
    unpaired = sorted(k for k, s in novel.items() if k not in pred and s.collapses)
    if quality or gaps:
        f = _collapse_finding(
            Cause.DRAFTER_QUALITY, quality,
            "Novel text commits far less than predictable text of the same drafter (or collapses with context) "
            "while predictable text holds with context: the drafter cannot predict this text (drafter quality, "
            "not infrastructure; rule (a) is what vouches for the pipeline itself).")
        findings.append(Finding(f.cause, f.summary, f.evidence + tuple(
            f"{cite(p, 'commit_len_mean')} vs {cite(n, 'commit_len_mean')} at ctx {ctx(p.context_len)}: "
            f"novel text drafts {_gain_frac(p, n):.0%} of what predictable text does" for p, n in gaps),
            tuple(dict.fromkeys(f.run_ids + tuple(r.run_id for g in gaps for r in g)))))
    easy = _looping_note(looping, th)
    if unpaired:
        check2 = Check(Rule.DRAFTER_QUALITY, False,
                       "commit length collapses on novel text for " + ", ".join(map(_series_name, unpaired))
                       + " but the sweep has no predictable-text series of the same drafter to tell a pipeline "
                         "bug from drafter quality (add probe=predictable)" + easy)
    elif paired or same_ctx:
        check2 = Check(Rule.DRAFTER_QUALITY, True,
                       f"{len(set(paired) | set(same_ctx))} drafter x attention x page series ran on both "
                       f"predictable and novel text" + easy)
    else:
        missing = "predictable" if any(k[0] == "novel" for k in series) else "novel" if pred_any else "any"
        check2 = Check(Rule.DRAFTER_QUALITY, False, f"no predictable/novel pair: no {missing}-text run of the "
                       f"same drafter at a context the other text also ran at" + easy)
    return findings, [check1, check2]


def find_kernel_bound(rows: Sequence[RunRow], th: Thresholds,
                      peak_gbs: float | None) -> tuple[list[Finding], list[Check]]:
    evidence: list[str] = []
    ids: list[str] = []
    named: set[tuple[str, int, int]] = set()
    growth_tested, bw_tested = [], 0
    by: dict[tuple[str, int, int], list[RunRow]] = defaultdict(list)
    for r in rows:
        if r.metric("verify_step_ms") is not None:
            by[(r.attention, r.page_size, r.concurrency)].append(r)
    for (attn, page, conc), series in sorted(by.items()):
        # One point per context: the median step time over drafters/probes at that context.
        per_ctx: dict[int, list[float]] = defaultdict(list)
        for r in series:
            per_ctx[r.context_len].append(r.need("verify_step_ms"))
        ctxs = sorted(per_ctx)
        med = {c: sorted(v)[len(v) // 2] for c, v in per_ctx.items()}
        if len(ctxs) >= 2 and ctxs[-1] / ctxs[0] >= th.min_context_ratio and med[ctxs[0]] > 0:
            k = math.log(med[ctxs[-1]] / med[ctxs[0]]) / math.log(ctxs[-1] / ctxs[0])
            growth_tested.append(f"attn={attn} page={page}{_conc(conc)} context^{k:.2f} over {ctx(ctxs[0])}-{ctx(ctxs[-1])}")
            if k > th.superlinear_exponent:
                named.add((attn, page, conc))
                evidence.append(f"attn={attn} page={page}{_conc(conc)}: verify_step_ms {med[ctxs[0]]:.4g} at ctx "
                                f"{ctx(ctxs[0])} -> {med[ctxs[-1]]:.4g} at ctx {ctx(ctxs[-1])}, "
                                f"grows as context^{k:.2f} (> {th.superlinear_exponent})")
                ids += [r.run_id for r in series]
        for r in series:
            peak = r.metric("peak_bw_gbs") or peak_gbs
            bw = r.metric("kv_bw_gbs")
            if not peak or bw is None or r.context_len < th.bw_min_context:
                continue
            bw_tested += 1
            if bw < th.min_bw_frac * peak:
                named.add((attn, page, conc))
                evidence.append(f"{cite(r, 'kv_bw_gbs', 'verify_step_ms')}: {100 * bw / peak:.1f}% of "
                                f"the device's {peak:.0f} GB/s (< {100 * th.min_bw_frac:.0f}%)")
                ids.append(r.run_id)
    if growth_tested:
        growth = Check(Rule.STEP_GROWTH, True, "; ".join(growth_tested))
    else:
        growth = Check(Rule.STEP_GROWTH, False,
                       "no attention x page series with verify_step_ms at contexts "
                       f"{th.min_context_ratio:g}x apart" if by else "no run carries verify_step_ms")
    if bw_tested:
        bw_check = Check(Rule.KV_BANDWIDTH, True, f"{bw_tested} run(s) at contexts >= {ctx(th.bw_min_context)}")
    else:
        bw_check = Check(Rule.KV_BANDWIDTH, False,
                         f"no run at context >= {ctx(th.bw_min_context)} with kv_bw_gbs and a known device peak "
                         f"(peak_bw_gbs); shorter prefixes are overhead-dominated")
    checks = [growth, bw_check]
    if not named:
        return [], checks
    which = ", ".join(f"attn={a} page={p}{_conc(c)}" for a, p, c in sorted(named))
    return [Finding(
        Cause.KERNEL_BOUND,
        f"The verify pass is attention-kernel bound for {which}: step time far above what the KV "
        f"bytes need. Try another attention backend or page size, or this project's verify kernel.",
        tuple(evidence), tuple(dict.fromkeys(ids)),
    )], checks


def find_host_bound(rows: Sequence[RunRow], th: Thresholds) -> tuple[list[Finding], Check]:
    bad, tested = [], 0
    for r in rows:
        util = r.metric("gpu_util_mean")
        frac, step = r.metric("roofline_frac"), r.metric("verify_step_ms")
        if util is None or (frac is None and step is None):
            continue
        tested += 1
        high = (frac is not None and frac < th.max_roofline_frac_host) or \
               (frac is None and step is not None and step >= th.high_step_ms)
        if util < th.max_gpu_util and high:
            bad.append(r)
    if not tested:
        return [], Check(Rule.HOST_BOUND, False, "no run carries gpu_util_mean with a step time or roofline_frac "
                                                 "(no GPU telemetry)")
    check = Check(Rule.HOST_BOUND, True, f"{tested} run(s) with GPU utilisation and step time")
    if not bad:
        return [], check
    return [Finding(
        Cause.HOST_BOUND,
        f"GPU utilisation stays under {th.max_gpu_util:.0f}% while the step time is high in {len(bad)} "
        f"run(s): the GPU waits on the host (kernel launches, Python, scheduling). CUDA graphs or a "
        f"larger batch are the usual cures.",
        tuple(cite(r, "gpu_util_mean", "verify_step_ms", "roofline_frac") for r in bad),
        tuple(r.run_id for r in bad),
    )], check


def diagnose(rows: Sequence[RunRow], th: Thresholds = Thresholds(), peak_gbs: float | None = None) -> Diagnosis:
    real = [r for r in rows if not r.simulated]
    simulated = len(rows) - len(real)
    if not real:
        why = (f"all {simulated} run(s) ran on the stub engine, whose commits and timings are simulated"
               if simulated else "no run to examine")
        return Diagnosis(len(rows), simulated, (), tuple(Check(rule, False, why) for rule in Rule))
    judged = [r for r in real if not r.dummy_weights]  # (a), (b) judge the pipeline and drafter: real weights only
    dummy = tuple(r.dummy_weights for r in real if r.dummy_weights)
    oracle, c_oracle = find_oracle_shortfall(judged, th)
    collapse, c_collapse = find_commit_collapse(judged, th)
    if dummy:
        c_oracle, *c_collapse = (replace(c, detail=scoped(c.detail, c.evaluated, len(judged), dummy))
                                 for c in (c_oracle, *c_collapse))
    kernel, c_kernel = find_kernel_bound(real, th, peak_gbs)
    host, c_host = find_host_bound(real, th)
    plugin, c_plugin = find_plugin_fallback(real)
    lossless, c_lossless = find_lossless_breach(real, th)
    return Diagnosis(len(rows), simulated, (*lossless, *oracle, *collapse, *kernel, *host, *plugin),
                     (c_oracle, *c_collapse, *c_kernel, c_host, *c_plugin, *c_lossless), dummy_weights=dummy)


def find_plugin_fallback(rows: Sequence[RunRow]) -> tuple[list[Finding], list[Check]]:
    """(e), only where a run uses the plugin on SGLang: each must show kernel calls and no fallback (`unproven`)."""
    runs = [r for r in rows if r.plugin]
    if not runs:
        return [], []
    bad = [(r, why) for r in runs if (why := unproven(r.metrics))]
    check = Check(Rule.PLUGIN_DISPATCH, True, f"{len(runs) - len(bad)} of {len(runs)} specsweep_verify run(s) ran "
                                              "every verify / decode layer call on the kernel")
    if not bad:
        return [], [check]
    return [Finding(Cause.KERNEL_NOT_RUN, f"{len(bad)} run(s) labelled specsweep_verify cannot show that the kernel "
                    "ran their attention: what they measured is (partly) SGLang's Triton backend, or unknown.",
                    tuple(f"`{r.name}` (run {r.run_id[:8]}): {why}" for r, why in bad),
                    tuple(r.run_id for r, _ in bad))], [check]
