"""SGLang's speculative-decoding `meta_info`, by version: the one place the project turns a finished /generate
request's fields into metrics, for SGLang and the reference engine alike (the reference engine reports SGLang's
names). Below the engine folders: workers/measurement.py reads every engine's answers through it.

    spec_metrics_from_meta_info(meta_info, version=None) -> SpecMetrics
        from the final /generate `meta_info` (the spec fields are on the finishing chunk only). version None:
        told apart by the field names (see the function for each formula and the SGLang lines behind it).
    Not read: `/server_info` internal_states[].avg_spec_accept_length. SGLang folds it in windows of
        --decode-log-interval (40) decode iterations and reports complete windows only, since the last /flush_cache
        (`scheduler_components/metrics_reporter.py:934,973,999-1004,708-717`, `internal_state.py:119-125,243-253`):
        absent for a run of under 40 iterations, the first 40k iterations of a longer one. commit_len_mean is the
        same quantity, exact, per request (workers/reference/spec_counters.py keeps the window as SGLang does).

The per-interval counters of `/metrics` (verify calls, generated tokens) are read by workers/engine_counters.py.
Names per version: `specsweep_common.sglang_facts.SGLANG_VERSIONS`; docs/sglang.md has the table and the tests behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from specsweep_common.sglang_facts import SGLANG_VERSIONS, SGLangFacts, sglang_facts



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
