"""`probe.repeats` end to end below Ray: the real stub engine probed by GroupRunner, recorded by the real Tracker in
a real MLflow store, read back by the report (mean ± 95 % interval in its tables, numbers in the CSV) and by the
regression check (with one baseline run there is no spread between sweeps: the noisy metrics are shown, not judged,
however tight this run's own interval over its repeats)."""

from __future__ import annotations

import csv
import io
import json

from orchestrator.config.plan import Plan
from orchestrator.results.regress.section import changes_section
from orchestrator.results.regress.verdict import NO_SPREAD
from orchestrator.results.report.build import write_report
from orchestrator.results.tracking import Tracker
from specsweep_common.spec import ProbeKind, ProbeSpec, RunSpec, RunState, ServerGroup, stable_hash
from tools.testing import stub_server
from workers.runners import GroupRunner


def _group() -> ServerGroup:
    server = stub_server(drafter="ngram", token_s=0.002, startup_s=0.1)
    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=64, gen_tokens=16, repeats=3)
    params = (("context_len", "64"), ("probe.kind", "novel"), ("drafter.name", "ngram"),
              ("drafter.is_oracle", "False"), ("attention.name", "torch"), ("page_size", "16"),
              ("probe.repeats", "3"))
    spec = RunSpec(0, server, probe, stable_hash(server, probe), "ctx=64 probe=novel drafter=ngram probe.repeats=3",
                   params)
    return ServerGroup(server, (spec,))


def _sweep(tracker: Tracker, group: ServerGroup, tmp_path, finish: bool = True) -> str:
    parent = tracker.begin_parent(Plan(sweep_name="rep", groups=(group,)), work_dir=tmp_path)
    runner = GroupRunner(group.server, tmp_path)
    try:
        result = runner.run(group.runs[0])
    finally:
        runner.stop()
    assert result.state is RunState.FINISHED, result.message
    tracker.log_result(result)
    if finish:
        tracker.end_parent(RunState.FINISHED)
    return parent


def test_repeats_reach_mlflow_the_report_tables_and_the_verdicts(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "rep")
    group = _group()
    _sweep(tracker, group, tmp_path)
    parent = _sweep(tracker, group, tmp_path, finish=False)
    client = tracker.client
    (child,) = client.search_runs([tracker.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    m, tags = child.data.metrics, child.data.tags
    values = json.loads(tags["decode_tok_s.repeats"])
    assert len(values) == 3 and m["decode_tok_s.n"] == 3.0
    assert m["decode_tok_s.ci95_lo"] <= m["decode_tok_s"] <= m["decode_tok_s.ci95_hi"]

    changes = changes_section(client, parent, tmp_path)
    assert changes.comparison is not None
    (point,) = changes.comparison.points
    verdict = next(v for v in point.verdicts if v.metric == "decode_tok_s")
    assert verdict.n_baseline == 1 and verdict.status == NO_SPREAD and "repeats bound the noise within one sweep" \
        in verdict.why

    report = write_report(client, parent, print_summary=False)
    summary = (tmp_path / "dl").mkdir() or client.download_artifacts(parent, "report/summary.md", str(tmp_path / "dl"))
    every_run = open(summary).read().split("## Every run")[1]
    half = (m["decode_tok_s.ci95_hi"] - m["decode_tok_s.ci95_lo"]) / 2
    assert f"{m['decode_tok_s']:.4g} ± {half:.2g}" in every_run
    table = client.download_artifacts(parent, "report/summary.csv", str(tmp_path / "dl"))
    (row,) = list(csv.DictReader(io.StringIO(open(table).read())))
    assert float(row["decode_tok_s"]) == float(f"{m['decode_tok_s']:.4g}")  # the CSV keeps numbers
    assert "| 64 |" in every_run  # a metric equal on every repeat (prompt_tokens) shows no interval
    assert report.diagnosis_md.startswith("# Changes since the last 1 FINISHED run(s) of this sweep")
    assert "decode_tok_s" in report.diagnosis_md.split("Not judged: ")[1].splitlines()[0]
