"""End to end: `python -m orchestrator +sweep=smoke` as a real subprocess in a temp cwd — real Hydra launcher,
local Ray, reference engines, MLflow on SQLite there — then MLflow is read back with `mlflow.search_runs`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.testing import engines_under, pid_alive, wait_for_request


SMOKE_RUNS = 8  # 2 contexts x 2 probes x 2 drafters (conf/sweep/smoke.yaml)
# metrics.log_patterns over lines the reference engine really logs (uvicorn's access log), e.g.
#   INFO:     127.0.0.1:44092 - "POST /generate HTTP/1.1" 200 OK
# A run's lines are those of its probe.repeats prompts, each: the counters scrape before it (GET /metrics,
# workers/engine_counters.py), POST /flush_cache, POST /generate, the scrape after it; the engine's start-up (GET
# /health) and the other runs of its server write to the same log, so four `http_status` values per run (one repeat;
# five for a server's first run, whose prompt encoding reads GET /server_info once) and one `generate_status` prove
# the slicing.
# every request line but the health watch's polls (workers/health_watch.py: their number depends on the run's length)
LOG_PATTERNS = (r'"(?:GET|POST) /(?!health)\S* HTTP/1\.1" (?P<http_status>\d{3})',
                r'"POST /generate HTTP/1\.1" (?P<generate_status>\d{3})')
LOG_PATTERNS_OVERRIDE = "metrics.log_patterns=[" + ",".join(f"'{p}'" for p in LOG_PATTERNS) + "]"
METRICS = ("prompt_tokens", "completion_tokens", "ttft_s", "e2e_s", "decode_tok_s", "commit_len_mean",
           "verify_steps", "accept_rate", "tree_depth_mean", "tree_nodes_mean", "verify_step_ms")


def _env(**extra) -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", **extra}


def _sweep(cwd: Path, *overrides: str, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "+sweep=smoke", *overrides], cwd=cwd,
                          env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _runs(cwd: Path, experiment: str = "smoke"):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{cwd}/mlflow.db")
    df = mlflow.search_runs(experiment_names=[experiment])
    return df[df["tags.specsweep.role"] == "parent"], df[df["tags.specsweep.role"] == "child"]


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory):
    """One real smoke sweep shared by the checks below: (its cwd, the completed process)."""
    cwd = tmp_path_factory.mktemp("smoke")
    return cwd, _sweep(cwd, LOG_PATTERNS_OVERRIDE)


@pytest.mark.smoke  # the fast tier's one real Ray sweep: records into MLflow, then resumes
def test_smoke_sweep_records_every_point_then_resumes(smoke_sweep):
    tmp_path, out = smoke_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    parents, children = _runs(tmp_path)
    assert len(parents) == 1 and parents.iloc[0]["status"] == "FINISHED"
    assert len(children) == SMOKE_RUNS
    assert (children["status"] == "FINISHED").all()
    assert (children["tags.mlflow.parentRunId"] == parents.iloc[0]["run_id"]).all()
    assert children["tags.run_hash"].nunique() == SMOKE_RUNS
    for m in METRICS:
        assert children[f"metrics.{m}"].notna().all(), m
    assert (children["metrics.commit_len_mean"] >= 1).all()
    oracle = children[children["params.cfg.drafter.is_oracle"].str.lower() == "true"]
    assert len(oracle) == SMOKE_RUNS // 2
    steps = oracle["params.cfg.drafter.num_steps"].astype(int)
    assert (oracle["metrics.commit_len_mean"] == steps + 1).all(), oracle["metrics.commit_len_mean"].tolist()
    # exactly one engine start per distinct ServerSpec
    servers = children["tags.server_group"].nunique()
    assert servers == 2 and (children["tags.engine_start"] == "1").all()
    assert parents.iloc[0]["metrics.engine_starts"] == servers
    assert children.groupby("tags.server_group")["tags.engine_pid"].nunique().eq(1).all()
    assert (tmp_path / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()

    again = _sweep(tmp_path)  # without metrics.log_patterns: they are not part of a run's identity
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"skipping {SMOKE_RUNS} run(s)" in again.stdout + again.stderr
    _, children_after = _runs(tmp_path)
    assert len(children_after) == SMOKE_RUNS


def test_log_patterns_become_series_on_each_child_run(smoke_sweep):
    """A real engine's log, sliced per run: each named group is an MLflow metric with step = match index."""
    from mlflow import MlflowClient

    cwd, out = smoke_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    _, children = _runs(cwd)
    assert len(children) == SMOKE_RUNS
    for _, child in children.iterrows():
        status = client.get_metric_history(child["run_id"], "http_status")
        steps = [(m.step, m.value) for m in sorted(status, key=lambda m: m.step)]
        assert steps in ([(i, 200.0) for i in range(4)], [(i, 200.0) for i in range(5)]), child["tags.mlflow.runName"]
        generate = client.get_metric_history(child["run_id"], "generate_status")
        assert [(m.step, m.value) for m in generate] == [(0, 200.0)]
        message = child.get("tags.message")
        assert "metrics.log_patterns" not in (message if isinstance(message, str) else "")  # every pattern matched
        assert "metrics.log_patterns" not in child["tags.mlflow.runName"]  # not a result-changing key
    assert (children["params.cfg.metrics.log_patterns"] == json.dumps(list(LOG_PATTERNS))).all()  # JSON: config/params.py


def test_smoke_parent_carries_report_and_diagnosis(smoke_sweep):
    from mlflow import MlflowClient

    cwd, out = smoke_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    parents, children = _runs(cwd)
    parent_id = parents.sort_values("start_time").iloc[0]["run_id"]
    top = {a.path for a in client.list_artifacts(parent_id)}
    report = {a.path for a in client.list_artifacts(parent_id, "report")}
    assert "diagnosis.md" in top
    assert {"report/summary.csv", "report/summary.md", "report/summary.html", "report/commit_len_vs_context.png",
            "report/decode_tok_s_vs_context.png", "report/verify_step_ms_vs_context.png",
            "report/accept_length_histogram.png"} <= report
    diagnosis = Path(client.download_artifacts(parent_id, "diagnosis.md", str(cwd / "dl"))).read_text()
    # "Changes since <baseline>" (orchestrator/results/regress) opens it; then the diagnosis
    assert diagnosis.startswith("# Changes since ") and "regression check failed" not in diagnosis
    assert "\n# Diagnosis: smoke" in diagnosis and f"{SMOKE_RUNS} run(s) examined" in diagnosis
    # tiny's weights are random: rules (a) and (b) leave its runs out and say so (orchestrator/config/weights_scope.py)
    assert "## pipeline bug" not in diagnosis and "## drafter quality" not in diagnosis
    assert f"{SMOKE_RUNS} run(s) ran on dummy weights ({SMOKE_RUNS} with model.load_format=dummy)" in diagnosis
    table = Path(client.download_artifacts(parent_id, "report/summary.csv", str(cwd / "dl"))).read_text()
    assert all(name in table for name in children["tags.mlflow.runName"])
    assert "Diagnosis: smoke" in out.stdout + out.stderr  # printed at the end of the sweep


def test_mlflow_ui_shows_the_sweep_in_a_real_browser(smoke_sweep, browser, mlflow_ui, test_artifacts):
    """Headless Chromium (driven over DevTools, tools/browser.py) against `mlflow server` on the sweep's store, the
    DOM read as the page shows it: the experiment's runs page shows the parent expanded with its 8 points under it;
    the saved view lists the points, its columns are the answering metrics and the axes, and every point's
    commit_len_mean / decode_tok_s cell shows MLflow's value; the parent's report renders in MLflow's artifact view
    with its pivot. Screenshots of both pages go to test-artifacts/ (`make screenshots` makes docs/img/'s)."""
    from tools.ui_pages import quiet_assistant, report_text, runs_table

    cwd, out = smoke_sweep
    assert out.returncode == 0, out.stderr[-3000:]
    parents, children = _runs(cwd)
    parent = parents.sort_values("start_time").iloc[0]
    exp_id, total = parents.iloc[0]["experiment_id"], len(parents) + len(children)
    points = children[children["tags.mlflow.parentRunId"] == parent["run_id"]].set_index("run_id")
    with mlflow_ui(f"sqlite:///{cwd}/mlflow.db", cwd / "mlartifacts") as url:
        quiet_assistant(browser, url)
        page = runs_table(browser, url, exp_id, saved_view=False, rows=total)  # a first visit: parents expanded
        assert "Training runs" in browser.text()  # the runs view (mlflow.experimentKind), not GenAI mode
        nested = [r for r in page.rows if r.indent == 48]
        top = next(r for r in page.rows if r.run_id == parent["run_id"])
        assert top.has_toggle and top.indent == 24 and {r.run_id for r in nested} == set(points.index), page.rows
        at = page.rows.index(top)  # its points right under it, one level in
        assert {r.run_id for r in page.rows[at + 1:at + 1 + len(points)]} == set(points.index)
        browser.screenshot(test_artifacts / "mlflow-runs-nested.png")
        table = runs_table(browser, url, exp_id, rows=len(points))  # the saved view: a row per point
        assert {r.run_id for r in table.rows} == set(points.index), table.rows
        shot = browser.screenshot(test_artifacts / "mlflow-runs-table.png")
        answer = ["metrics.`commit_len_mean`", "metrics.`decode_tok_s`", "metrics.`verify_step_ms`"]
        axes = ["tags.`axis.context_len`", "tags.`axis.probe`", "tags.`axis.drafter`"]
        assert set(answer + axes) <= set(table.columns), table.columns
        for row in table.rows:
            point = points.loc[row.run_id]
            for metric in ("commit_len_mean", "decode_tok_s"):
                assert float(row.value(metric)) == pytest.approx(point[f"metrics.{metric}"]), (row.cells, metric)
            assert [row.cells[c] for c in axes] == [point[f"tags.{c[6:-1]}"] for c in axes]
        report = report_text(browser, url, exp_id, parent["run_id"])
        report_shot = browser.screenshot(test_artifacts / "mlflow-report.png")
    assert "At a glance" in report and "Every run" in report and "Plots" in report
    pivot = report.split("At a glance")[1].split("Plots")[0]
    assert all(d in pivot for d in ("ngram", "oracle")) and "predictable @ 256" in pivot and "novel @ 1024" in pivot
    for png in (shot, report_shot):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_engine_killed_mid_probe_fails_only_that_run(tmp_path):
    from mlflow import MlflowClient

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "+sweep=smoke", "gen_tokens=200",
                             "hydra.sweeper.params.context_len=256"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the first run of its server: the engine restarts for the rest
        engine_pid = wait_for_request(proc.pid, finished=0, timeout_s=240)
        time.sleep(0.2)
        os.kill(engine_pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, output[-3000:]
    parents, children = _runs(tmp_path)
    assert len(children) == 4 and parents.iloc[0]["status"] == "FINISHED"
    victim = children[children["tags.engine_pid"] == str(engine_pid)].iloc[0]
    rest = children[children["run_id"] != victim["run_id"]]
    assert victim["status"] == "FAILED" and victim["tags.failure_reason"] == "engine_died"
    assert (rest["status"] == "FINISHED").all()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    tail = client.download_artifacts(victim["run_id"], "engine_log_tail.txt", str(tmp_path))
    assert "workers.reference" in Path(tail).read_text()
    same_server = rest[rest["tags.server_group"] == victim["tags.server_group"]]
    assert (same_server["tags.engine_start"] == "2").all()


@pytest.mark.parametrize("sig, returncode", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_interrupt_kills_engines_and_records_killed_runs(tmp_path, sig, returncode):
    """Ctrl-C exits by SIGINT as Python does (130 in a shell); SIGTERM exits 143, not as SIGINT."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "+sweep=smoke", "gen_tokens=2000",
                             "hydra.sweeper.params.context_len=256", "sweep_name=interrupted"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_request(proc.pid, timeout_s=240)  # a run is in flight
        engine_pids = list(engines_under(proc.pid))
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == returncode, output[-3000:]
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for p in engine_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in engine_pids), "an engine outlived the interrupted sweep"
    parents, children = _runs(tmp_path, "interrupted")
    assert len(parents) == 1 and parents.iloc[0]["status"] == "KILLED", output[-3000:]
    assert len(children) == 4 and (children["status"] == "KILLED").any()
    assert set(children["status"]) <= {"KILLED", "FINISHED"}


def test_stub_engine_sweep_through_the_orchestrator(tmp_path):
    """`+sweep=smoke engine=stub`: conf/engine/stub.yaml through the real entry point, launcher, Ray and MLflow;
    its timing knobs reach the stub's argv and show in the recorded times. Its runs go to their own experiment,
    `smoke-stub`, and the diagnosis gives no verdict on them (simulated commits)."""
    import mlflow

    token_s = 0.01
    out = _sweep(tmp_path, "engine=stub", f"engine.stub.token_s={token_s}")
    assert out.returncode == 0, out.stderr[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    assert mlflow.get_experiment_by_name("smoke") is None
    parents, children = _runs(tmp_path, "smoke-stub")
    assert len(parents) == 1 and parents.iloc[0]["status"] == "FINISHED"
    assert len(children) == SMOKE_RUNS and (children["status"] == "FINISHED").all(), children["tags.message"]
    assert (children["tags.engine"] == "stub").all()
    assert (children["params.cfg.engine.kind"] == "stub").all() and (children["params.cfg.engine.stub.token_s"] == "0.01").all()
    assert children["tags.run_hash"].nunique() == SMOKE_RUNS
    assert all("engine=stub" in name and f"engine.stub.token_s={token_s}" in name
               for name in children["tags.mlflow.runName"])
    # one stub per (drafter) server, started once, speaking the seam: exact prompt, every requested token
    assert children["tags.server_group"].nunique() == 2 and (children["tags.engine_start"] == "1").all()
    assert (children["metrics.prompt_tokens"] == children["params.cfg.context_len"].astype(float)).all()
    assert (children["metrics.completion_tokens"] == 32).all()
    # with speculation every verify step commits num_steps + 1 (the last one what is left)
    steps = children["params.cfg.drafter.num_steps"].astype(int)
    assert (children["metrics.verify_steps"] == -(-31 // (steps + 1))).all()
    # 32 tokens at token_s each: the knob reached the engine
    assert (children["metrics.e2e_s"] >= 32 * token_s).all(), children["metrics.e2e_s"].tolist()
    diagnosis = out.stdout + out.stderr
    assert f"{SMOKE_RUNS} run(s) ran on the stub engine" in diagnosis and "pipeline bug" not in diagnosis
    logs = list((tmp_path / "logs" / "engines").glob("smoke-*/engine-*.log"))
    assert len(logs) == 2
    for log in logs:
        argv = log.read_text().splitlines()[0]
        assert "-m workers.stub.server" in argv and f"--stub-token-s {token_s}" in argv
