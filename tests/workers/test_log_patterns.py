"""`metrics.log_patterns` on the worker side: one run's engine log lines -> per-step series on its RunResult.
(Validation: test_validate.py; a real engine and MLflow: test_e2e_smoke.py.)"""

from __future__ import annotations

import threading
import time

from specsweep_common.spec import RunResult, RunState
from tools.testing import tiny_run, tiny_server
from workers.log_patterns import LOG_SETTLE_S, apply_log_patterns, follow_log, wait_quiet

FORK_LOG = [
    "[2026-11-30 00:10:23] Prefill batch. #new-seq: 1, #new-token: 1024",
    "[2026-11-30 00:10:24] spec step commit=4 depth=3 nodes=9",
    "[2026-11-30 00:10:24] spec step commit=2 depth=3 nodes=9",
    "[2026-11-30 00:10:24] Decode batch. #running-req: 1, gen throughput (token/s): 812.50",
    "[2026-11-30 00:10:25] spec step commit=5 depth=4 nodes=12",
]


def _result(**metrics) -> RunResult:
    return RunResult(run=tiny_run(tiny_server(), 0), state=RunState.FINISHED, metrics=dict(metrics))


def test_groups_become_series_in_match_order():
    r = _result()
    notes = apply_log_patterns([r"commit=(?P<commit_len>\d+) depth=(?P<tree_depth>\d+)",
                                r"gen throughput \(token/s\): (?P<gen_tok_s>[\d.]+)"], FORK_LOG, r)
    assert notes == []
    assert r.series == {"commit_len": [4.0, 2.0, 5.0], "tree_depth": [3.0, 3.0, 4.0], "gen_tok_s": [812.5]}


def test_names_the_probe_already_records_get_a_log_prefix():
    r = _result(decode_tok_s=100.0)
    r.series["commit_len"] = [5.0, 5.0]  # the engine's own per-step figures (meta_info.spec_steps) stay as they are
    apply_log_patterns([r"commit=(?P<commit_len>\d+)", r"\(token/s\): (?P<decode_tok_s>[\d.]+)"], FORK_LOG, r)
    assert r.series["commit_len"] == [5.0, 5.0] and r.series["log_commit_len"] == [4.0, 2.0, 5.0]
    assert r.metrics["decode_tok_s"] == 100.0 and r.series["log_decode_tok_s"] == [812.5]
    assert "decode_tok_s" not in r.series


def test_unmatched_patterns_and_non_numbers_are_notes_not_failures():
    r = _result()
    notes = apply_log_patterns([r"accept_len=(?P<accept_len>\d+)", r"(?P<batch>Prefill|Decode) batch",
                                r"nodes=(?P<tree_nodes>\d+)"], FORK_LOG, r)
    assert r.series == {"tree_nodes": [9.0, 9.0, 12.0]}  # empty series are not recorded
    assert notes[0] == "metrics.log_patterns[0] matched none of the run's 5 engine log line(s)"
    assert notes[1].startswith("metrics.log_patterns group 'batch' captured 2 value(s) that are not numbers "
                               "(e.g. 'Prefill')")
    assert len(notes) == 2


def test_wait_quiet_waits_for_lines_written_after_the_response(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("before\n")
    offset = log.stat().st_size

    def late_writer():  # an engine that logs its per-request summary lines just after answering
        for i in range(4):
            time.sleep(0.05)
            with open(log, "a") as f:
                f.write(f"spec step commit={i + 1}\n")

    writer = threading.Thread(target=late_writer)
    writer.start()
    t0 = time.monotonic()
    wait_quiet(log, quiet_s=0.5, max_s=10)  # a wide quiet window: a loaded machine may delay the writer
    writer.join()
    lines, _ = follow_log(log, offset)
    assert lines == [f"spec step commit={i}" for i in range(1, 5)]
    assert time.monotonic() - t0 >= 0.2
    t0 = time.monotonic()
    wait_quiet(log)  # a quiet log costs one settle interval
    assert time.monotonic() - t0 < 5 * LOG_SETTLE_S
