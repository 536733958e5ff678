"""The speculative-decoding counters the reference engine reports, kept with SGLang 0.5.23's semantics.

Per request (`meta_info`, `spec_meta_fields`): SGLang counts every verify step of a request, the last one too, with
all of that step's correct drafts (`sglang/srt/managers/scheduler_components/batch_result_processor.py:832-836`),
although `completion_tokens` is cut at the finish (`sglang/srt/managers/schedule_batch.py:2038-2042`, read as
`len(req.output_ids_through_stop)` at `sglang/srt/managers/scheduler_components/output_streamer.py:490,522-526`). The
finished request's fields are derived in `TokenizerManager._calculate_spec_decoding_metrics`
(`sglang/srt/managers/tokenizer_manager.py:3138-3210`):

    spec_verify_ct                  verify steps of the request
    spec_num_correct_drafts         drafts accepted over those steps (the bonus token excluded)
    spec_num_proposed_drafts        spec_verify_ct * (speculative_num_draft_tokens - 1): computed, not counted
                                    (`tokenizer_manager.py:3156-3158`); the reference engine's
                                    --speculative-num-draft-tokens is the same flag (tree nodes incl. the root)
    spec_accept_rate                spec_num_correct_drafts / spec_num_proposed_drafts (`tokenizer_manager.py:3164`)
    spec_accept_length              completion_tokens / spec_verify_ct (`tokenizer_manager.py:3166-3168`)
    spec_correct_drafts_histogram   index k: steps that accepted k drafts; as long as the largest k seen + 1
                                    (`Req.update_spec_correct_drafts_histogram`, `schedule_batch.py:1566-1572`)

Per server (`/server_info` `internal_states[].avg_spec_accept_length`, `AcceptLengthWindow`): SGLang's
`SchedulerMetricsReporter` adds each decode iteration's committed tokens (drafts + bonus, before any truncation) and
its batch size (`metrics_reporter.py:543-554`); every `--decode-log-interval` iterations (default 40,
`sglang/srt/arg_groups/fields/observability.py:136-139`) it folds that window into running totals and starts a new
window (`metrics_reporter.py:934`, `973`, `999-1004`). `avg_spec_accept_length` is the totals' ratio
(`scheduler_components/internal_state.py:119-125`, `243-253`): complete windows only, absent before the first one.
`/flush_cache` zeroes the window, the totals and the iteration count (`MetricsReporter.reset_metrics`,
`metrics_reporter.py:708-717`, called by `Scheduler.flush_cache`, `sglang/srt/managers/scheduler.py:5528`). The
gauge `sglang:spec_accept_length` is the last complete window's figure, 0 before the first one and kept across a
flush (`metrics_reporter.py:1093`, `sglang/srt/observability/metrics_collector.py:125`, `1674`).
"""
from __future__ import annotations

import threading

DEFAULT_DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default


def correct_drafts_histogram(correct_per_step: list[int]) -> list[int]:
    """Verify steps by drafts accepted (index k), grown as SGLang grows it: len = max(k) + 1."""
    hist: list[int] = []
    for k in correct_per_step:
        if len(hist) <= k:
            hist.extend([0] * (k + 1 - len(hist)))
        hist[k] += 1
    return hist


def spec_meta_fields(correct_per_step: list[int], completion_tokens: int, num_draft_tokens: int) -> dict:
    """SGLang 0.5.23's speculative `meta_info` fields of a finished request; {} where SGLang sends none (no verify
    step, or no draft per step)."""
    verify_ct = len(correct_per_step)
    proposed = verify_ct * (num_draft_tokens - 1)
    if verify_ct == 0 or proposed <= 0:
        return {}
    correct = sum(correct_per_step)
    return {"spec_verify_ct": verify_ct, "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed,
            "spec_accept_rate": correct / proposed, "spec_accept_length": completion_tokens / verify_ct,
            "spec_correct_drafts_histogram": correct_drafts_histogram(correct_per_step)}


class AcceptLengthWindow:
    """SGLang's scheduler-side accept length: windows of `interval` decode iterations, reset by /flush_cache."""

    def __init__(self, interval: int = DEFAULT_DECODE_LOG_INTERVAL):
        if interval < 1:
            raise ValueError(f"decode_log_interval must be >= 1, got {interval}")
        self.interval = interval
        self._lock = threading.Lock()  # the scheduler thread writes, HTTP handlers read
        self.last = 0.0  # the last complete window's accept length (the gauge; a flush keeps it)
        self.reset()

    def reset(self) -> None:
        """What /flush_cache does to SGLang's counters."""
        with self._lock:
            self.iterations = 0  # decode iterations since the last reset
            self.window_tokens = self.window_forwards = 0
            self.total_tokens = self.total_forwards = 0

    def decode_iteration(self, batch_size: int, committed_tokens: int) -> None:
        """One speculative decode iteration: `batch_size` requests verified, `committed_tokens` = their accepted
        drafts + one bonus token each, before truncation at a finish."""
        with self._lock:
            self.window_tokens += committed_tokens
            self.window_forwards += batch_size
            self.iterations += 1
            if self.iterations % self.interval == 0:
                if self.window_forwards:
                    self.last = self.window_tokens / self.window_forwards
                self.total_tokens += self.window_tokens
                self.total_forwards += self.window_forwards
                self.window_tokens = self.window_forwards = 0

    def average(self) -> float | None:
        """/server_info's avg_spec_accept_length: None (SGLang leaves the key out) before the first full window."""
        with self._lock:
            return self.total_tokens / self.total_forwards if self.total_forwards > 0 else None
