"""The report's views, so the answer reads at a glance: the pivot, the faceted commit plot, `--compare`, the one-context drafter-quality
verdict, looping continuations, and params read back through the config schema."""

from __future__ import annotations


import pytest

from orchestrator.config.settings import Thresholds
from orchestrator.results.diagnosis import Cause, Rule, RunRow, diagnose
from orchestrator.results.report.tables import pivot
from tests.orchestrator.results.test_diagnosis import sweep


def _row(i, ctx, probe, drafter, commit, tok_s, page=16, **metrics) -> RunRow:
    return RunRow(run_id=f"{i:08d}cafe", name=f"ctx={ctx} probe={probe} drafter={drafter} page={page}",
                  context_len=ctx, probe=probe, drafter=drafter, attention="torch", page_size=page,
                  is_oracle=drafter == "oracle", num_steps=4, engine="reference",
                  metrics={"commit_len_mean": commit, "decode_tok_s": tok_s, **metrics})


def test_pivot_has_a_row_per_drafter_and_swept_axis_and_a_column_per_probe_and_context():
    rows = [_row(0, 1024, "predictable", "ngram", 4.2, 31.0, page=1), _row(1, 1024, "predictable", "ngram", 4.0, 30.0),
            _row(2, 8160, "novel", "ngram", 1.3, 12.0), _row(3, 1024, "predictable", "oracle", 5.0, 40.0)]
    header, body = pivot(rows)
    assert header == ["drafter", "page_size", "novel @ 8160", "predictable @ 1024"]  # page size: swept, so named
    assert ["ngram", "1", "", "4.20 / 31"] in body and ["ngram", "16", "1.30 / 12", "4.00 / 30"] in body
    assert ["oracle", "16", "", "5.00 / 40"] in body


def test_commit_plot_facets_per_probe_every_series_and_the_oracle_maximum(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orchestrator.results.report.plots import commit_lines, facet_plot

    rows = [_row(i, ctx, probe, d, c, 10.0, page=page) for i, (ctx, probe, d, c, page) in enumerate([
        (1024, "predictable", "ngram", 4.0, 1), (8160, "predictable", "ngram", 4.0, 1),  # same values as page 16:
        (1024, "predictable", "ngram", 4.0, 16), (8160, "predictable", "ngram", 4.0, 16),  # must not hide
        (1024, "novel", "oracle", 5.0, 16), (1024, "novel", "none", 1.0, 16)])]
    monkeypatch.setattr(plt, "close", lambda fig: None)  # keep the figure to read it back
    assert facet_plot(tmp_path / "c.png", rows, "commit_len_mean", "t", "y", commit_lines(rows))
    fig = plt.gcf()
    assert (tmp_path / "c.png").stat().st_size > 5000
    assert [ax.get_title() for ax in fig.axes] == ["probe=novel", "probe=predictable"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"drafter=ngram page_size=1", "drafter=ngram page_size=16"} <= set(legend)  # page size is not collapsed
    assert "drafter=none page_size=16 (no speculation)" in legend
    assert "oracle maximum (num_steps + 1 = 5)" in legend
    predictable = fig.axes[1]
    xs = sorted(round(x) for line in predictable.get_lines() if line.get_marker() not in ("None", None, "")
                for x in line.get_xdata())
    assert len(set(xs)) == 4  # the two equal series sit side by side, not on top of each other
    plt.close("all")


def test_drafter_quality_with_one_context_gets_a_verdict():
    def mutate(row, m):
        if row.probe == "novel" and row.drafter == "ngram":
            m["commit_len_mean"] = 1.4  # drafts 0.4 of predictable text's 3.6
    d = diagnose(sweep(mutate, contexts=(1024,)), Thresholds())
    check = next(c for c in d.checks if c.rule is Rule.DRAFTER_QUALITY)
    assert check.evaluated, check.detail
    assert Cause.DRAFTER_QUALITY in d.causes
    assert "novel text drafts 11% of what predictable text does" in d.findings[0].evidence[0]


def test_a_looping_novel_continuation_is_easy_text_not_novel():
    def mutate(row, m):
        if row.probe == "novel":
            m["continuation_repeat_frac"] = 0.7 if row.context_len == 1024 else 0.1
            if row.context_len == 1024 and row.drafter == "ngram":
                m["commit_len_mean"] = 4.6  # a loop: as easy as predictable text
    d = diagnose(sweep(mutate), Thresholds())
    check = next(c for c in d.checks if c.rule is Rule.DRAFTER_QUALITY)
    assert "left out as easy text, not novel: 2 novel-text run(s) whose continuation loops" in check.detail
    assert "report.loop_repeat_frac=0.5" in check.detail and "continuation_repeat_frac=0.7" in check.detail


def test_repeat_frac_measures_a_loop():
    from workers.derived import repeat_frac

    assert repeat_frac("to be able to be able to be able to") == pytest.approx(5 / 8)
    assert repeat_frac("the quick brown fox jumps over the lazy dog") == 0.0 and repeat_frac("") == 0.0


def test_params_round_trip_through_the_schema():
    from orchestrator.config.param_encoding import to_params
    from orchestrator.config.params import RunParams, decode

    params = to_params({"context_len": 8160, "probe": {"kind": "novel", "concurrency": 4},
                        "drafter": {"name": "ngram", "is_oracle": False, "num_steps": 4, "draft_model_path": None},
                        "attention": {"name": "torch", "backend": None}, "page_size": 16})
    assert params["drafter.is_oracle"] == "false" and params["drafter.draft_model_path"] == "null"
    p = RunParams.read(params)
    assert (p.context_len, p.probe, p.drafter, p.is_oracle, p.num_steps, p.concurrency, p.page_size, p.backends) \
        == (8160, "novel", "ngram", False, 4, 4, 16, ())
    assert decode("drafter.is_oracle", "True") is True and decode("page_size", "16") == 16  # older stores
    with pytest.raises(KeyError):
        decode("no.such.key", "1")


def test_loop_threshold_has_a_declared_domain():
    from orchestrator.config.config_error import ConfigError
    from tests.orchestrator.config.test_schema import run_config

    assert run_config("report.loop_repeat_frac=0.3").report.loop_repeat_frac == 0.3
    with pytest.raises(ConfigError, match=r"report.loop_repeat_frac=1.5: allowed a finite number in \[0, 1\]"):
        run_config("report.loop_repeat_frac=1.5")


def test_compare_two_sweeps_gives_deltas_per_matching_point_and_one_plot(tmp_path):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from orchestrator.report import main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    for name, tok_s, contexts in (("base", 100.0, (1024, 4096)), ("new", 125.0, (1024, 8192))):
        exp = client.create_experiment(name, artifact_location=str(tmp_path / name))
        parent = client.create_run(exp, run_name=name)
        for ctx in contexts:
            child = client.create_run(exp, run_name=f"ctx={ctx}", tags={"mlflow.parentRunId": parent.info.run_id})
            params = {"context_len": "%d" % ctx, "probe.kind": "novel", "drafter.name": "ngram",
                      "attention.name": "torch", "page_size": "16"}
            client.log_batch(child.info.run_id, params=[Param(k, v) for k, v in params.items()],
                             metrics=[Metric("commit_len_mean", 2.0, 0, 0), Metric("decode_tok_s", tok_s, 0, 0)])
            client.set_terminated(child.info.run_id, "FINISHED")
        client.set_terminated(parent.info.run_id, "FINISHED")
    out = tmp_path / "cmp"
    assert main(["--compare", "base", "new", "--out", str(out), "--tracking-uri", uri]) == 0
    md = (out / "compare.md").read_text()
    assert "1 matching point(s)" in md and "| 1024 | novel | ngram | torch | 16 | 1 | 2 | 2 | +0.0% | 100 | 125 | " \
        "+25.0% |" in md
    assert "Only in A: 4096 novel ngram torch 16 1" in md and "Only in B: 8192 novel ngram torch 16 1" in md
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--compare", "base", "missing", "--out", str(out), "--tracking-uri", uri]) == 2


