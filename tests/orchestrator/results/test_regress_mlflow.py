"""The regression check on a real MLflow store: history by point_key, the report's section and tags, a pinned
baseline, `specsweep-report --history`, and the on_regression command (argv, no shell, once)."""

from __future__ import annotations

import dataclasses
import sys
import time

import pytest

from orchestrator.config.plan import Plan
from orchestrator.results.regress.alert import REGRESSION_MARK, alert_on_regression, argv_problem
from orchestrator.results.report.build import write_report
from orchestrator.results.tracking import Tracker
from orchestrator.schedule import EXIT_REGRESSION, regression_exit
from orchestrator.schedules.definition import ScheduleError, parse_schedule
from specsweep_common.point_key import point_key
from specsweep_common.spec import ProbeKind, ProbeSpec, RunResult, RunSpec, RunState, ServerGroup, stable_hash
from tools.testing import tiny_server

BASE = {"commit_len_mean": 4.5, "decode_tok_s": 100.0, "verify_step_ms": 10.0}


def grid(version: str = "0.1.0") -> tuple[ServerGroup, ...]:
    groups, job = [], 0
    for drafter in ("ngram", "oracle"):
        server = tiny_server(drafter)
        server = dataclasses.replace(server, engine=dataclasses.replace(server.engine, version=version))
        runs = []
        for ctx in (64, 256):
            probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=ctx, gen_tokens=8)
            params = (("context_len", str(ctx)), ("probe.kind", "novel"), ("drafter.name", drafter),
                      ("drafter.is_oracle", str(drafter == "oracle")), ("attention.name", "torch"), ("page_size", "16"))
            runs.append(RunSpec(job, server, probe, stable_hash(server, probe), f"ctx={ctx} drafter={drafter}", params))
            job += 1
        groups.append(ServerGroup(server, tuple(runs)))
    return tuple(groups)


def record(tracker: Tracker, groups, metrics_of, *, base_config=None, tags=None, finish=True) -> str:
    plan = Plan(sweep_name="nightly", groups=groups, base_config=base_config)
    parent = tracker.begin_parent(plan, tags=tags)
    for g in groups:
        for spec in g.runs:
            tracker.log_result(RunResult(run=spec, state=RunState.FINISHED, metrics=metrics_of(spec)))
    if finish:
        tracker.end_parent(RunState.FINISHED)
    time.sleep(0.01)  # distinct start times
    return parent


def jitter(i: int):
    return lambda spec: {**BASE, "decode_tok_s": 100.0 + (i % 3) * 0.5 - 0.5}


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return uri, Tracker(uri, "nightly")


def test_children_carry_point_key_and_an_engine_upgrade_keeps_the_history(store):
    uri, tracker = store
    old = record(tracker, grid("0.1.0"), jitter(0))
    new = record(tracker, grid("0.2.0"), jitter(1))
    c = tracker.client
    keys = {p: {r.data.tags["point_key"] for r in c.search_runs([tracker.experiment_id],
                                                                   f"tags.`mlflow.parentRunId` = '{p}'")}
            for p in (old, new)}
    assert keys[old] == keys[new] and len(keys[old]) == 4
    spec = grid()[0].runs[0]
    assert point_key(spec.server, spec.probe) in keys[old]


def test_report_section_flags_exactly_the_slower_points_with_tags_plot_and_attribution(store, tmp_path):
    uri, tracker = store
    for i in range(5):
        record(tracker, grid(), jitter(i))
    tracker.git_sha = "x"
    slow = lambda spec: {**BASE, "decode_tok_s": 80.0 if spec.server.drafter.name == "ngram" else 100.0,  # noqa: E731
                         "commit_len_mean": 4.5}
    parent = record(tracker, grid("0.2.0"), slow, finish=False)  # the report runs before the parent ends
    report = write_report(tracker.client, parent, print_summary=False)
    md = report.diagnosis_md
    assert md.startswith("# Changes since the last 5 FINISHED run(s) of this sweep")
    assert "2 regression(s)" in md and "decode_tok_s worsened only on drafter=ngram" in md
    assert "engine_version: 0.1.0 → 0.2.0" in md
    assert "report/changes_decode_tok_s.png" in report.artifact_files
    run = tracker.client.get_run(parent)
    assert run.data.tags["regression"] == "decode_tok_s on 2 point(s)"
    children = tracker.client.search_runs([tracker.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(r.data.tags["regression"] for r in children) == ["decode_tok_s", "decode_tok_s", "none", "none"]


def test_identical_history_flags_nothing_and_tags_none(store):
    uri, tracker = store
    for i in range(6):
        parent = record(tracker, grid(), jitter(i), finish=False)
        write_report(tracker.client, parent, print_summary=False)
        tracker.end_parent(RunState.FINISHED)
        assert tracker.client.get_run(parent).data.tags["regression"] == "none"


def test_pinned_baseline_by_tag_and_a_bad_one_is_named(store):
    uri, tracker = store
    record(tracker, grid(), lambda s: {**BASE, "commit_len_mean": 3.0}, tags={"release": "v1"})
    record(tracker, grid(), lambda s: BASE)
    parent = record(tracker, grid(), lambda s: BASE, base_config={"regress": {"baseline": "release:v1"}},
                    finish=False)
    md = write_report(tracker.client, parent, print_summary=False).diagnosis_md
    assert "the latest tagged release=v1" in md and "commit_len_mean" in md and "improvement" in md
    tracker.end_parent(RunState.FINISHED)
    bad = record(tracker, grid(), lambda s: BASE, base_config={"regress": {"baseline": "release:v9"}}, finish=False)
    md = write_report(tracker.client, bad, print_summary=False).diagnosis_md
    assert "regress.baseline='release:v9'" in md and "allowed: a parent run id" in md


def test_history_command_prints_each_metric_over_time(store, capsys):
    from orchestrator.report import main

    uri, tracker = store
    for i in range(4):
        record(tracker, grid(), jitter(i))
    record(tracker, grid(), lambda s: {**BASE, "commit_len_mean": 3.5})
    assert main(["--history", "nightly", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert out.count("## ctx=") == 4 and "| commit_len_mean |" in out.replace("decode_tok_s | ", "")
    assert "3.5 *" in out  # the change point
    assert main(["--history", "nosuch", "--tracking-uri", uri]) == 2


def test_on_regression_runs_the_argv_once_with_the_reports_path(store, tmp_path, caplog):
    uri, tracker = store
    record(tracker, grid(), lambda s: BASE)
    parent = record(tracker, grid(), lambda s: {**BASE, "commit_len_mean": 4.0}, finish=False)
    write_report(tracker.client, parent, print_summary=False)
    out = tmp_path / "called.txt"
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(repr(sys.argv[2:]) + '\\n')", str(out)]
    env = {"SPECSWEEP_ON_REGRESSION": __import__("json").dumps(argv + ["; touch pwned"])}
    assert alert_on_regression(tracker.client, parent, env) is True
    (line,) = out.read_text().splitlines()
    args = eval(line)  # noqa: S307 - our own repr
    assert args[0] == "; touch pwned" and args[1].endswith("diagnosis.md")  # passed as an argument, no shell
    assert not (tmp_path / "pwned").exists()
    from pathlib import Path

    assert Path(args[1]).read_text().startswith("# Changes since")
    assert REGRESSION_MARK in caplog.text
    assert regression_exit(caplog.text) == EXIT_REGRESSION and regression_exit("all fine") == 0


def test_on_regression_must_be_an_argv_list_in_the_schedule_file():
    assert argv_problem("notify-send regression") is not None and argv_problem(["notify-send"]) is None
    with pytest.raises(ScheduleError) as e:
        parse_schedule({"cron": "0 2 * * *", "overrides": ["+sweep=smoke"], "on_regression": "mail -s x me"},
                       source="n.yaml", sweeps=["smoke"])
    assert "on_regression='mail -s x me'" in str(e.value) and "never a shell string" in str(e.value)
    with pytest.raises(ScheduleError, match="containing 'resume=false'"):  # else it re-measures nothing
        parse_schedule({"cron": "0 2 * * *", "overrides": ["+sweep=smoke"], "on_regression": ["notify", "x"]},
                       source="n.yaml", sweeps=["smoke"])
    s = parse_schedule({"cron": "0 2 * * *", "overrides": ["+sweep=smoke", "resume=false"],
                        "on_regression": ["notify", "x"]}, source="n.yaml", sweeps=["smoke"])
    assert s.on_regression == ("notify", "x")


def record_old_layout(tracker: Tracker, groups, metrics_of, base_config) -> str:
    """A sweep as recorded until 2026-12-03: params as plain schema keys (no `cfg.` prefix, no `axis.*`)."""
    from mlflow.entities import Metric, Param

    from orchestrator.config.param_encoding import to_params

    c, now = tracker.client, int(time.time() * 1000)
    parent = c.create_run(tracker.experiment_id, run_name="old", tags={"specsweep.role": "parent"}).info.run_id
    c.log_batch(parent, params=[Param(k, v) for k, v in to_params(base_config).items()])
    for g in groups:
        for spec in g.runs:
            rid = c.create_run(tracker.experiment_id, run_name=spec.name, tags={
                "specsweep.role": "child", "mlflow.parentRunId": parent, "run_hash": spec.run_hash,
                "point_key": point_key(spec.server, spec.probe), "host": tracker.host}).info.run_id
            c.log_batch(rid, params=[Param(k, v) for k, v in spec.params],
                        metrics=[Metric(k, v, now, 0) for k, v in metrics_of(spec).items()])
            c.set_terminated(rid, "FINISHED")
    c.set_terminated(parent, "FINISHED")
    time.sleep(0.01)
    return parent


def test_a_run_recorded_before_the_cfg_prefix_is_the_same_point_with_the_same_settings(store):
    """The regression history spans the layout change: an old run (plain param keys) and a new one (`cfg.` keys)
    of one grid point share its point_key, read back as the same grid point, and the parents' `regress.*` settings
    read the same."""
    from orchestrator.results.regress.baseline_compare import grid_point
    from orchestrator.results.regress.history import load_history, select_baseline, settings_of

    uri, tracker = store
    base = {"regress": {"min_rel_change": 0.07, "history": 3}}
    old = record_old_layout(tracker, grid(), jitter(0), base)
    new = record(tracker, grid(), jitter(1), base_config=base)
    params = {p: tracker.client.get_run(p).data.params for p in (old, new)}
    assert "regress.min_rel_change" in params[old] and "cfg.regress.min_rel_change" in params[new]
    settings = settings_of(dict(params[new]))
    assert settings == settings_of(dict(params[old])) and (settings.min_rel_change, settings.history) == (0.07, 3)
    history = load_history(tracker.client, tracker.experiment_id)
    by_parent = {p.run_id: {c.point_key: c for c in p.children} for p in history.parents}
    assert set(by_parent[old]) == set(by_parent[new]) and len(by_parent[new]) == 4
    for key, run in by_parent[new].items():
        assert grid_point(run) == grid_point(by_parent[old][key])
        assert grid_point(run).context_len in (64, 256) and grid_point(run).drafter in ("ngram", "oracle")
    baseline = select_baseline(tracker.client, history, new, settings)
    assert [p.run_id for p in baseline.parents] == [old]
    assert all(baseline.runs_of(key) for key in by_parent[new])


def test_default_baseline_is_the_last_history_finished_parents_of_the_sweep(store, tmp_path):
    from orchestrator.results.regress.section import changes_section

    uri, tracker = store
    record(tracker, grid(), lambda s: {**BASE, "commit_len_mean": 3.0})  # older than the last 2
    kept = [record(tracker, grid(), lambda s: BASE) for _ in range(2)]
    failed = record(tracker, grid(), lambda s: {**BASE, "commit_len_mean": 9.9}, finish=False)
    tracker.end_parent(RunState.FAILED)  # never a baseline
    time.sleep(0.01)
    parent = record(tracker, grid(), lambda s: BASE, base_config={"regress": {"history": 2}}, finish=False)
    c = changes_section(tracker.client, parent, tmp_path).comparison
    assert c is not None and [p.run_id for p in c.baseline.parents] == kept and failed not in kept
    assert c.baseline.label.startswith("the last 2 FINISHED run(s) of this sweep")
    assert c.tag() == "none" and all(v.n_baseline == 2 for p in c.points for v in p.verdicts)
    tracker.end_parent(RunState.FINISHED)
    pinned = record(tracker, grid(), lambda s: BASE, base_config={"regress": {"baseline": kept[0]}}, finish=False)
    c = changes_section(tracker.client, pinned, tmp_path).comparison  # pinned by parent run id
    assert c is not None and [p.run_id for p in c.baseline.parents] == kept[:1]
