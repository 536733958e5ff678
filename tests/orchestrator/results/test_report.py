"""The report on a real MLflow SQLite store: table, plots and diagnosis land on the parent run."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from orchestrator.results.report.build import write_report
from orchestrator.results.report.read_back import ReportError, resolve_parent
from orchestrator.report import main


@pytest.fixture
def store(tmp_path):
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("synthetic", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(exp, run_name="synthetic sweep")
    for i, (ctx, drafter) in enumerate([(1024, "ngram"), (16384, "ngram"), (1024, "oracle"), (16384, "oracle")]):
        oracle = drafter == "oracle"
        commit = 5.0 if oracle else (3.0 if ctx == 1024 else 1.2)  # ngram collapses on predictable text
        child = client.create_run(exp, run_name=f"ctx={ctx // 1024}k probe=predictable drafter={drafter}",
                                  tags={"mlflow.parentRunId": parent.info.run_id})
        rid = child.info.run_id
        params = {"context_len": ctx, "probe.kind": "predictable", "drafter.name": drafter,
                  "drafter.is_oracle": oracle, "drafter.num_steps": 4, "attention.name": "torch", "page_size": 16}
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()],
                         metrics=[Metric("commit_len_mean", commit, 0, 0), Metric("decode_tok_s", 100.0 - i, 0, 0),
                                  Metric("verify_step_ms", 1.0 + ctx / 4096, 0, 0)]
                         + [Metric("commit_len", commit, 0, s) for s in range(5)],
                         tags=[RunTag("run_hash", f"h{i}")])
        client.set_terminated(rid, "FINISHED")
    failed = client.create_run(exp, run_name="ctx=4k probe=novel drafter=ngram",
                               tags={"mlflow.parentRunId": parent.info.run_id, "failure_reason": "engine_died"})
    client.set_terminated(failed.info.run_id, "FAILED")
    client.set_terminated(parent.info.run_id, "FINISHED")
    return uri, client, parent.info.run_id


def test_report_artifacts_and_diagnosis(store, tmp_path):
    uri, client, parent_id = store
    report = write_report(client, parent_id, print_summary=False)
    assert [f.cause.value for f in report.findings] == ["drafting bug at long context"]
    names = {a.path for a in client.list_artifacts(parent_id)} | \
        {a.path for a in client.list_artifacts(parent_id, "report")}
    for f in ("diagnosis.md", "report/summary.csv", "report/summary.md", "report/summary.html",
              "report/commit_len_vs_context.png", "report/decode_tok_s_vs_context.png",
              "report/verify_step_ms_vs_context.png", "report/accept_length_histogram.png"):
        assert f in names
    assert "report/throughput_vs_concurrency.png" not in names  # one concurrency: nothing to compare
    diag = (tmp_path / "dl").mkdir() or client.download_artifacts(parent_id, "diagnosis.md", str(tmp_path / "dl"))
    text = open(diag).read()
    assert "drafting bug at long context" in text and "commit_len_mean=1.2" in text
    table = client.download_artifacts(parent_id, "report/summary.csv", str(tmp_path / "dl"))
    rows = list(csv.DictReader(io.StringIO(open(table).read())))
    assert len(rows) == 5
    assert {r["status"] for r in rows} == {"FINISHED", "FAILED (engine_died)"}
    png = client.download_artifacts(parent_id, "report/commit_len_vs_context.png", str(tmp_path / "dl"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_concurrency_column_and_throughput_plot(tmp_path):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("conc", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(exp, run_name="conc sweep")
    for n, drafter, tok_s in [(1, "none", 300.0), (4, "none", 500.0), (1, "ngram", 320.0), (4, "ngram", 700.0)]:
        rid = client.create_run(exp, run_name=f"drafter={drafter} probe.concurrency={n}",
                                tags={"mlflow.parentRunId": parent.info.run_id}).info.run_id
        params = {"context_len": 256, "probe.kind": "predictable", "drafter.name": drafter, "page_size": 16,
                  "attention.name": "torch", "probe.concurrency": n}
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()],
                         metrics=[Metric("throughput_tok_s", tok_s, 0, 0), Metric("commit_len_mean", 1.5, 0, 0)])
        client.set_terminated(rid, "FINISHED")
    client.set_terminated(parent.info.run_id, "FINISHED")
    write_report(client, parent.info.run_id, print_summary=False)
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/throughput_vs_concurrency.png" in names
    table = client.download_artifacts(parent.info.run_id, "report/summary.csv", str(tmp_path / "dl"))
    rows = list(csv.DictReader(io.StringIO(open(table).read())))
    assert sorted((r["drafter"], r["concurrency"], r["throughput_tok_s"]) for r in rows) == [
        ("ngram", "1", "320"), ("ngram", "4", "700"), ("none", "1", "300"), ("none", "4", "500")]


def test_resolve_by_sweep_name_and_errors(store):
    uri, client, parent_id = store
    assert resolve_parent(client, "synthetic") == (parent_id, "synthetic")
    assert resolve_parent(client, parent_id) == (parent_id, "synthetic")
    with pytest.raises(ReportError, match="neither a run id nor a sweep name; sweeps here: .*synthetic"):
        resolve_parent(client, "nope")


def test_cli(store, caplog):
    uri, client, parent_id = store
    assert main(["synthetic", "--tracking-uri", uri]) == 0
    assert main(["missing-sweep", "--tracking-uri", uri]) == 2


def test_resumed_sweep_report_covers_every_finished_point(tmp_path):
    """A real sweep (launcher edge, local Ray, stub engines, MLflow SQLite in tmp_path) run twice with overlapping
    grids: the second parent's report covers its own new point and the point FINISHED by the first invocation
    (and not the first's point outside its grid); the stub sweep records into `<sweep_name>-stub`."""
    from mlflow.tracking import MlflowClient

    from orchestrator.session.sweep import sweep_plan
    from orchestrator.config.jobs import expand_grid, plan_jobs

    fixed = ("engine=stub", "engine.stub.token_s=0.001", "engine.stub.startup_s=0", "drafter=oracle",
             "sweep_name=resume", "gen_tokens=8", "progress=false", "cluster.num_cpus=2")

    def sweep(contexts):
        plan, settings = plan_jobs(expand_grid({"context_len": contexts}, *fixed), cwd=str(tmp_path))
        results, skipped, _ = sweep_plan(plan, settings)
        return plan, results, skipped

    _, first, _ = sweep([256, 512])
    assert [r.state.value for r in first] == ["FINISHED", "FINISHED"]
    plan, results, skipped = sweep([512, 1024])
    assert skipped == 1 and [r.run.probe.context_len for r in results] == [1024]

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_experiment_by_name("resume") is None
    exp = client.get_experiment_by_name("resume-stub")
    parents = client.search_runs([exp.experiment_id], "tags.`specsweep.role` = 'parent'",
                                 order_by=["attributes.start_time ASC"])
    assert len(parents) == 2
    earlier_id, parent_id = parents[0].info.run_id, parents[1].info.run_id
    assert parents[1].data.metrics["runs_resumed"] == 1 and parents[1].data.metrics["runs_planned"] == 1

    dl = tmp_path / "dl"
    dl.mkdir()
    def artifact(path: str) -> str:
        return Path(client.download_artifacts(parent_id, path, str(dl))).read_text()

    table = list(csv.DictReader(io.StringIO(artifact("report/summary.csv"))))
    assert sorted((r["context_len"], r["status"], r["invocation"]) for r in table) == \
        [("1024", "FINISHED", "this"), ("512", "FINISHED", f"earlier ({earlier_id[:8]})")]
    diagnosis = artifact("diagnosis.md")
    assert "2 run(s) examined (1 of them from earlier invocations of this sweep" in diagnosis
    assert "2 run(s) ran on the stub engine" in diagnosis and "**No verdict**" in diagnosis
    assert "pipeline bug" not in diagnosis and "Healthy" not in diagnosis

    # on demand (`python -m orchestrator.report resume-stub`): the grid comes from the parent's run_hashes.txt
    assert resolve_parent(client, "resume-stub") == (parent_id, "resume-stub")
    again = write_report(client, parent_id, print_summary=False)
    assert sorted(c.row.context_len for c in again.children) == [512, 1024]
    assert set(artifact("run_hashes.txt").split()) == {r.run_hash for r in plan.runs}


def test_report_takes_the_latest_finished_earlier_run_per_point_and_nothing_outside_the_grid(tmp_path):
    """Constructed store: point h0 FINISHED by two earlier invocations, h1 FAILED in this one but FINISHED earlier,
    h9 FINISHED earlier but not in this sweep's grid."""
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("grid", artifact_location=str(tmp_path / "artifacts"))

    def child(parent, h, ctx, status, t):
        run = client.create_run(exp, run_name=f"ctx={ctx} {h}", start_time=t,
                                tags={"mlflow.parentRunId": parent, "run_hash": h, "engine": "reference"})
        client.log_batch(run.info.run_id, params=[Param("context_len", str(ctx)), Param("drafter.name", "ngram")],
                         tags=[RunTag("specsweep.role", "child")])
        client.set_terminated(run.info.run_id, status)
        return run.info.run_id

    old, mid, now = (client.create_run(exp, start_time=t).info.run_id for t in (1000, 2000, 3000))
    child(old, "h0", 256, "FINISHED", 1001)
    latest_h0 = child(mid, "h0", 256, "FINISHED", 2001)
    earlier_h1 = child(mid, "h1", 512, "FINISHED", 2002)
    child(mid, "h9", 4096, "FINISHED", 2003)
    child(now, "h1", 512, "FAILED", 3001)
    this_h2 = child(now, "h2", 1024, "FINISHED", 3002)
    client.log_text(now, "h0\nh1\nh2\n", "run_hashes.txt")

    report = write_report(client, now, print_summary=False)  # the grid from the parent's run_hashes.txt
    got = sorted((c.row.run_id, c.status, c.invocation) for c in report.children)
    assert len(got) == 4 and (latest_h0, "FINISHED", f"earlier ({mid[:8]})") in got
    assert (earlier_h1, "FINISHED", f"earlier ({mid[:8]})") in got and (this_h2, "FINISHED", "this") in got
    assert sum(c.status == "FAILED" for c in report.children) == 1  # this invocation's failure stays in the table
    assert "3 run(s) examined (2 of them from earlier invocations" in report.diagnosis_md
