"""SGLang speculative-decoding metrics, by version: per request from `meta_info`, per interval from `/metrics`.

Public API:

    spec_metrics_from_meta_info(meta_info, version=None) -> SpecMetrics
        from the final /generate `meta_info` (the spec fields are on the finishing chunk only). version None:
        told apart by the field names. The one place the project turns those fields into metrics, for SGLang and
        the reference engine alike (see the function for each formula and the SGLang lines behind it).
    parse_prometheus(text) -> dict[str, float]          sample values summed over labels, per sample name
                                                        (prometheus_client's parser)
    accept_length_from_counters(before, after) -> float | None
        Δ sglang:generation_tokens_total / Δ sglang:spec_verify_calls_total between two scrapes of one run
        (Prometheus counters are never reset; both move when a request finishes, by its truncated completion_tokens
        and its spec_verify_ct: `sglang/srt/observability/metrics_collector.py:2110-2112`), so it cross-checks
        engine_accept_length, not commit_len_mean
    Not read: `/server_info` internal_states[].avg_spec_accept_length. SGLang folds it in windows of
        --decode-log-interval (40) decode iterations and reports complete windows only, since the last /flush_cache
        (`scheduler_components/metrics_reporter.py:934,973,999-1004,708-717`, `internal_state.py:119-125,243-253`):
        absent for a run of under 40 iterations, the first 40k iterations of a longer one. commit_len_mean is the
        same quantity, exact, per request (workers/reference/spec_counters.py keeps the window as SGLang does).

Names per version: `specsweep_vocab.sglang_facts.SGLANG_VERSIONS`; docs/sglang.md has the table and the tests behind it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from prometheus_client.parser import text_string_to_metric_families

from specsweep_vocab.sglang_facts import SGLANG_VERSIONS, SGLangFacts, sglang_facts


GENERATION_TOKENS = "sglang:generation_tokens_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"


@dataclass
class SpecMetrics:
    metrics: dict[str, float] = field(default_factory=dict)
    histogram: list[float] = field(default_factory=list)  # correct drafts per verify step: counts by k
    version: str | None = None  # the name set found


def _facts_for(meta: Mapping[str, Any], version: str | None) -> SGLangFacts | None:
    if version is not None:
        return sglang_facts(version)
    for facts in reversed(list(SGLANG_VERSIONS.values())):  # newest first: 0.5.16-0.5.20 carry both sets
        if facts.meta.accepted in meta:
            return facts
    return SGLANG_VERSIONS["0.5.23"] if "spec_verify_ct" in meta else None


def _num(meta: Mapping[str, Any], key: str) -> float | None:
    v = meta.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def spec_metrics_from_meta_info(meta_info: Mapping[str, Any], version: str | None = None) -> SpecMetrics:
    """Per-request speculation figures; empty when the request carried none (no speculation, or 0 verify steps).

    SGLang (0.5.23 names; 0.5.10's in `MetaNames`) counts every verify step of a request and all its correct
    drafts, the last step's too (`sglang/srt/managers/scheduler_components/batch_result_processor.py:832-836`;
    0.5.10 `scheduler_output_processor_mixin.py:354-358`), but cuts completion_tokens at the finish
    (`sglang/srt/managers/schedule_batch.py:2038-2042`, `scheduler_components/output_streamer.py:490,522-526`): a
    last step that overshoots max_new_tokens is counted whole while its surplus tokens are not sent.

        verify_steps          spec_verify_ct
        commit_len_mean       1 + spec_num_correct_drafts / spec_verify_ct: tokens committed per verify step, the
                              bonus token included, exact on every step (the diagnosis rules read this)
        emitted_per_verify    (completion_tokens - 1) / spec_verify_ct: tokens the client received per verify step
                              (the prefill's first token left out). Throughput-side only: it reads low when the
                              last step overshoots (an oracle committing 5 a step gives 31 / 7 = 4.43 at 32 tokens)
        engine_accept_length  spec_accept_length = completion_tokens / spec_verify_ct, SGLang's own figure
                              (`sglang/srt/managers/tokenizer_manager.py:3166-3168`)
        accept_rate           spec_num_correct_drafts / spec_num_proposed_drafts, where SGLang computes proposed =
                              spec_verify_ct * (speculative_num_draft_tokens - 1) (`tokenizer_manager.py:3156-3158`)
        histogram             spec_correct_drafts_histogram: index k = steps that accepted k drafts, as long as the
                              largest k seen + 1 (`schedule_batch.py:1566-1572`)
    """
    facts = _facts_for(meta_info, version)
    out = SpecMetrics(version=facts.version if facts else None)
    if facts is None:
        return out
    names = facts.meta
    verify_ct = _num(meta_info, names.verify_ct)
    if not verify_ct:
        return out
    m = out.metrics
    m["verify_steps"] = verify_ct
    accepted, proposed = _num(meta_info, names.accepted), _num(meta_info, names.proposed)
    if accepted is not None:
        m["accepted_drafts"] = accepted
        m["commit_len_mean"] = 1.0 + accepted / verify_ct
    completion = _num(meta_info, "completion_tokens")
    if completion is not None:
        m["emitted_per_verify"] = (completion - 1.0) / verify_ct  # the first token is the prefill's
    engine_len = _num(meta_info, names.accept_length)
    if engine_len is not None:
        m["engine_accept_length"] = engine_len
    if proposed:
        m["proposed_drafts"] = proposed
        if accepted is not None:
            m["accept_rate"] = accepted / proposed
    hist = meta_info.get(names.histogram)
    if isinstance(hist, list) and all(isinstance(x, (int, float)) for x in hist):
        out.histogram = [float(x) for x in hist]
    return out


# ---------------------------------------------------------------- /metrics (Prometheus text format)


def parse_prometheus(text: str) -> dict[str, float]:
    """{sample name: sum over label sets} of every sample (histogram buckets keep their own names). A text the
    Prometheus parser refuses raises ValueError."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not math.isnan(sample.value):
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def _counter(samples: Mapping[str, float], name: str) -> float | None:
    if name in samples:
        return samples[name]
    bare = name.removesuffix("_total")  # exposition without the suffix
    return samples.get(bare)


def accept_length_from_counters(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Tokens generated per verify call between two scrapes (both counters move when a request finishes)."""
    gen_b, calls_b, gen_a, calls_a = [_counter(s, n) for s in (before, after)
                                      for n in (GENERATION_TOKENS, VERIFY_CALLS)]
    if gen_b is None or calls_b is None or gen_a is None or calls_a is None:
        return None
    calls = calls_a - calls_b
    return (gen_a - gen_b) / calls if calls > 0 else None
