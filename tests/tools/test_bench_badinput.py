"""The bad-input battery's own checks: a refused input shows nothing started, and a run that does start Ray,
MLflow and an engine is seen as started (so a "yes" in the table is measured, not assumed)."""

from __future__ import annotations


from tools.bench_badinput import Case, format_cli_table, run_case


def test_refused_input_row():
    o = run_case(Case("typo'd key", ("contxt_len=2048",)))
    assert o.rc == 1 and o.started == []
    assert "contxt_len='2048'" in o.message and "did you mean context_len" in o.message
    row = format_cli_table([o]).splitlines()[-1]
    assert row.startswith("| typo'd key | `python -m orchestrator contxt_len=2048` | 1 |") and row.endswith("| yes |")


def test_a_real_run_is_seen_as_started():
    o = run_case(Case("a real stub run", ("engine=stub", "drafter=ngram", "context_len=16", "gen_tokens=2",
                                          "progress=false")))
    assert o.rc == 0, o.output_tail
    assert "mlflow.db created" in o.started and "r created" in o.started  # the store and Ray's temp dir
    assert any(s.startswith("process: ") and "raylet" in s for s in o.started), o.started
    assert any("workers.stub.server" in s for s in o.started), o.started
    assert not any(s.startswith("left running") for s in o.started)
