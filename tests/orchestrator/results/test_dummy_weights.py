"""Dummy weights are plumbing: a bare longctx-like sweep on `tiny` gets no drafter-quality or
pipeline verdict, and the report says what it did not judge and why; the same numbers on real weights still do."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from orchestrator.results.diagnosis import Cause, Rule, RunRow, Verdict, diagnose
from orchestrator.results.diagnosis_md import render_markdown
from orchestrator.results.report.build import write_report
from orchestrator.config.weights_scope import dummy_weights_reason

CONTEXTS = (1024, 4096, 16384)
# what random weights give (the bare longctx on tiny): n-gram "predicts" predictable text 1.52 vs novel 1.11
# at 1k and the other way round at 16k; the oracle misses on near-ties now and then
COMMIT = {("ngram", "predictable"): (1.52, 1.50, 1.40), ("ngram", "novel"): (1.11, 1.20, 1.60),
          ("oracle", "predictable"): (5.0, 4.91, 5.0), ("oracle", "novel"): (4.88, 5.0, 4.95)}
TINY_PARAMS = {"model.name": "tiny", "model.path": "tiny", "model.load_format": "dummy"}
REAL_PARAMS = {"model.name": "smollm2-135m", "model.path": "smollm2-135m", "model.load_format": "auto"}


def longctx_rows(reason: str) -> list[RunRow]:
    rows = []
    for (drafter, probe), ctx_i in itertools.product(COMMIT, range(len(CONTEXTS))):
        ctx = CONTEXTS[ctx_i]
        rows.append(RunRow(run_id=f"{len(rows):08d}cafe", name=f"ctx={ctx} probe={probe} drafter={drafter}",
                           context_len=ctx, probe=probe, drafter=drafter, attention="torch", page_size=16,
                           is_oracle=drafter == "oracle", num_steps=4, engine="reference", dummy_weights=reason,
                           metrics={"commit_len_mean": COMMIT[drafter, probe][ctx_i],
                                    "verify_step_ms": 2.0 * ctx / 1024}))
    return rows


def test_the_reason_comes_from_the_run_params():
    assert dummy_weights_reason(TINY_PARAMS) == "model.load_format=dummy"
    assert dummy_weights_reason({**TINY_PARAMS, "model.load_format": "auto"}) == \
        "model.path=tiny (random built-in weights)"
    assert dummy_weights_reason({"model.path": "Qwen/Qwen3-8B", "model.load_format": "dummy"}) == \
        "model.load_format=dummy"  # SGLang's uniform +-1e-3 init
    assert dummy_weights_reason({**REAL_PARAMS, "drafter.draft_model_path": "tiny-draft"}).startswith(
        "drafter.draft_model_path=tiny-draft")
    # `make run` (conf/sweep/probe.yaml): SmolLM2's real weights, its drafters too
    for draft in ("smollm2-135m", "None"):
        assert dummy_weights_reason({**REAL_PARAMS, "drafter.draft_model_path": draft}) == ""
    assert dummy_weights_reason({}) == ""  # runs recorded before these params: judged as before


def test_dummy_weight_runs_get_no_drafter_or_pipeline_verdict():
    d = diagnose(longctx_rows("model.load_format=dummy"))
    assert not {Cause.PIPELINE_BUG, Cause.DRAFTER_QUALITY, Cause.LONG_CONTEXT_DRAFTING_BUG} & set(d.causes)
    assert d.verdict is Verdict.INCOMPLETE
    skipped = {c.rule: c.detail for c in d.not_evaluated}
    assert {Rule.ORACLE, Rule.PREDICTABLE_COLLAPSE, Rule.DRAFTER_QUALITY} <= set(skipped)
    for detail in (skipped[r] for r in (Rule.ORACLE, Rule.PREDICTABLE_COLLAPSE, Rule.DRAFTER_QUALITY)):
        assert detail.startswith("12 run(s) ran on dummy weights (12 with model.load_format=dummy)")
    assert next(c for c in d.checks if c.rule is Rule.STEP_GROWTH).evaluated  # step time: still judged
    text = render_markdown(d, "longctx")
    assert "12 run(s) ran on dummy weights" in text and "rules (a) and (b), which judge the pipeline and the " \
        "drafter, do not examine them" in text
    assert "## drafter quality" not in text and "## pipeline bug" not in text and "## Not checked" in text


def test_the_same_numbers_on_real_weights_are_judged():
    causes = set(diagnose(longctx_rows("")).causes)
    assert {Cause.PIPELINE_BUG, Cause.DRAFTER_QUALITY} <= causes
    # a sweep mixing both: the real-weight runs are judged, the others are named as left out
    mixed = longctx_rows("") + [dataclasses.replace(r, run_id="d" + r.run_id, dummy_weights="model.load_format=dummy")
                                for r in longctx_rows("")]
    d = diagnose(mixed)
    assert Cause.PIPELINE_BUG in d.causes and all(not rid.startswith("d") for f in d.findings for rid in f.run_ids
                                                  if f.cause is Cause.PIPELINE_BUG)
    oracle = next(c for c in d.checks if c.rule is Rule.ORACLE)
    assert oracle.evaluated and "12 run(s) ran on dummy weights" in oracle.detail and "left out" in oracle.detail


def test_the_report_of_a_tiny_sweep_says_what_it_did_not_judge(tmp_path):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("longctx", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(exp, run_name="longctx")
    for r in longctx_rows(""):
        rid = client.create_run(exp, run_name=r.name, tags={"mlflow.parentRunId": parent.info.run_id,
                                                            "engine": "reference"}).info.run_id
        params = {**TINY_PARAMS, "context_len": r.context_len, "probe.kind": r.probe, "drafter.name": r.drafter,
                  "drafter.is_oracle": r.is_oracle, "drafter.num_steps": 4, "attention.name": "torch",
                  "page_size": 16}
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()],
                         metrics=[Metric(k, v, 0, 0) for k, v in r.metrics.items()])
        client.set_terminated(rid, "FINISHED")
    client.set_terminated(parent.info.run_id, "FINISHED")
    report = write_report(client, parent.info.run_id, print_summary=False)
    assert not {Cause.PIPELINE_BUG, Cause.DRAFTER_QUALITY} & {f.cause for f in report.findings}
    text = Path(client.download_artifacts(parent.info.run_id, "diagnosis.md", str(tmp_path / "dl"))).read_text()
    assert "12 run(s) ran on dummy weights (12 with model.load_format=dummy)" in text
    assert "- (b) predictable vs novel text (drafter quality): 12 run(s) ran on dummy weights" in text
