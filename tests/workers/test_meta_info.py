"""SGLang metrics by version, on fixtures built from the documented formats (SGLang's `/generate` meta_info and `/metrics`, `sglang/srt/entrypoints/http_server.py`)."""

from __future__ import annotations

import pytest

from specsweep_common.sglang_facts import SGLANG_VERSIONS
from workers.log_patterns import LogPatterns, follow_log
from workers.engine_counters import accept_length_from_counters, parse_scrape
from workers.meta_info import spec_metrics_from_meta_info

# 64 tokens, 21 verify steps of 4 draft tokens (3 drafts each): 42 drafts accepted of 63.
META_0_5_23 = {"id": "r1", "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": 1024,
               "completion_tokens": 64, "cached_tokens": 0, "e2e_latency": 1.5, "spec_verify_ct": 21,
               "spec_accept_rate": 42 / 63, "spec_accept_length": 64 / 21, "spec_num_correct_drafts": 42,
               "spec_num_proposed_drafts": 63, "spec_correct_drafts_histogram": [3, 5, 6, 7]}
META_0_5_10 = {"id": "r1", "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": 1024,
               "completion_tokens": 64, "e2e_latency": 1.5, "spec_verify_ct": 21, "spec_accept_rate": 42 / 63,
               "spec_accept_length": 64 / 21, "spec_accept_token_num": 42, "spec_draft_token_num": 63,
               "spec_accept_histogram": [3, 5, 6, 7]}


@pytest.mark.parametrize("meta,version", [(META_0_5_23, "0.5.23"), (META_0_5_10, "0.5.10"),
                                          (META_0_5_23, None), (META_0_5_10, None)])
def test_meta_info_names_per_version(meta, version):
    out = spec_metrics_from_meta_info(meta, version)
    assert out.version == ("0.5.10" if meta is META_0_5_10 else "0.5.23")
    m = out.metrics
    assert m["verify_steps"] == 21 and m["commit_len_mean"] == pytest.approx(1 + 42 / 21)  # bonus + drafts a step
    assert m["emitted_per_verify"] == pytest.approx(63 / 21)  # prefill token excluded; no overshoot: the same
    assert m["engine_accept_length"] == pytest.approx(64 / 21)  # SGLang's own figure, prefill token included
    assert m["accept_rate"] == pytest.approx(42 / 63) and m["accepted_drafts"] == 42 and m["proposed_drafts"] == 63
    assert out.histogram == [3, 5, 6, 7] and sum(out.histogram) == 21


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_commit_len_counts_an_overshooting_last_step_whole(version):
    """An oracle committing 5 a step, max_new_tokens 32: SGLang counts 7 steps and 28 drafts (the last step whole,
    batch_result_processor.py:832-836) but sends 32 tokens (schedule_batch.py:2038-2042)."""
    names = SGLANG_VERSIONS[version].meta
    meta = {"completion_tokens": 32, names.verify_ct: 7, names.accepted: 28, names.proposed: 28,
            names.accept_length: 32 / 7, names.histogram: [0, 0, 0, 0, 7]}
    m = spec_metrics_from_meta_info(meta, version).metrics
    assert m["commit_len_mean"] == 5.0  # was (32 - 1) / 7 = 4.43: rule (a) fired on every SGLang oracle run
    assert m["emitted_per_verify"] == pytest.approx(31 / 7) and m["engine_accept_length"] == pytest.approx(32 / 7)
    assert m["accept_rate"] == 1.0


def test_wrong_version_names_give_no_spec_figures_beyond_verify_steps():
    out = spec_metrics_from_meta_info(META_0_5_10, "0.5.23")  # 0.5.23 dropped the old aliases
    assert "accept_rate" not in out.metrics and "commit_len_mean" not in out.metrics and out.histogram == []


def test_no_speculation_or_no_verify_step():
    assert spec_metrics_from_meta_info({"completion_tokens": 1, "prompt_tokens": 3}).metrics == {}
    assert spec_metrics_from_meta_info({**META_0_5_23, "spec_verify_ct": 0}).metrics == {}
    with pytest.raises(ValueError, match="0.5.16"):
        spec_metrics_from_meta_info(META_0_5_23, "0.5.16")


METRICS_BEFORE = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen3-8B"} 1000.0
# HELP sglang:spec_verify_calls_total Number of speculative verify calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="Qwen/Qwen3-8B"} 400.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="Qwen/Qwen3-8B"} 2.5
sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="Qwen/Qwen3-8B"} 3.0
"""
METRICS_AFTER = METRICS_BEFORE.replace("} 1000.0", "} 1064.0").replace("} 400.0", "} 421.0")


def test_prometheus_counter_deltas_cross_check_meta_info():
    before, after = parse_scrape(METRICS_BEFORE), parse_scrape(METRICS_AFTER)
    assert before["sglang:generation_tokens_total"] == 1000 and before["sglang:spec_accept_length"] == 2.5
    # the interval's accept length equals the request's engine_accept_length (64 tokens / 21 verifies)
    assert accept_length_from_counters(before, after) == pytest.approx(
        spec_metrics_from_meta_info(META_0_5_23).metrics["engine_accept_length"])
    assert accept_length_from_counters(before, before) is None  # nothing finished in between


def test_prometheus_labels_summed_and_suffixless_counter():
    text = 'sglang:generation_tokens{dp="0"} 5\nsglang:generation_tokens{dp="1"} 7\nsglang:spec_verify_calls 4\n'
    s = parse_scrape(text)
    assert s["sglang:generation_tokens"] == 12
    assert accept_length_from_counters({"sglang:generation_tokens": 0, "sglang:spec_verify_calls": 0}, s) == 3


def test_prometheus_text_the_parser_refuses_raises():
    with pytest.raises(ValueError):
        parse_scrape("sglang:generation_tokens_total{model_name=\"x\" 5\n")  # unclosed label set


def test_log_patterns_become_per_step_series(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2026-11-30 00:10:23] Prefill batch. #new-seq: 1\n"
                   "[2026-11-30 00:10:24] spec step commit=4 depth=3 drafts=3 nodes=9\n"
                   "[2026-11-30 00:10:24] spec step commit=2 depth=3 drafts=3 nodes=9\n"
                   "[2026-11-30 00:10:24] spec step commit=")  # partial line: not read yet
    lines, offset = follow_log(log)
    assert len(lines) == 3
    p = LogPatterns([r"commit=(?P<commit_len>\d+) depth=(?P<tree_depth>\d+)", r"nodes=(?P<tree_nodes>\d+)"])
    p.feed_all(lines)
    assert p.series == {"commit_len": [4.0, 2.0], "tree_depth": [3.0, 3.0], "tree_nodes": [9.0, 9.0]}
    with open(log, "a") as f:
        f.write("5 depth=4 drafts=4 nodes=12\n")
    more, offset = follow_log(log, offset)
    p.feed_all(more)
    assert p.series["commit_len"] == [4.0, 2.0, 5.0] and offset == log.stat().st_size
    with pytest.raises(ValueError, match="named group"):
        LogPatterns([r"commit=\d+"])


def test_log_patterns_count_matches_and_keep_non_numbers_out():
    lines = ["step commit=4 phase=decode", "step commit=x phase=decode", "other line", "step commit=2 phase=verify"]
    p = LogPatterns([r"commit=(?P<commit_len>\S+)", r"phase=(?P<phase>\w+)", r"nothing=(?P<never>\d+)",
                     r"commit=(?P<commit_len>\d+) phase=verify"]).feed_all(lines)
    assert p.matches == [3, 3, 0, 1]
    # two patterns naming one group share its series, in line order
    assert p.series == {"commit_len": [4.0, 2.0, 2.0], "phase": [], "never": []}
    assert p.not_numbers == {"commit_len": (1, "x"), "phase": (3, "decode")}
