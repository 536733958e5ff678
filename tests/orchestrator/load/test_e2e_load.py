"""End to end: `specsweep +load=curve` as a real subprocess in a temp cwd (real Hydra sweeper, local Ray, the
reference engine on the built-in `tiny` model with n-gram drafting, SGLang 0.5.23's real bench_serving at two
concurrency levels, MLflow on SQLite there), then the store read back.
Beside a tune (`+tune=tiny +load=curve`): one curve per winner, nested under the tune's run, the Pareto chart there."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.load.curve import LATENCIES, level_figures, pareto_front
from orchestrator.load.settings import Limits
from specsweep_common.load import LoadLevel

ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *filter(None, [os.environ.get("PYTHONPATH")])])
LEVELS = (1, 2)
PROMPTS = 4
SMALL = ("model=tiny", "context_len=64", "gen_tokens=16", "cluster.num_cpus=2", "cluster.object_store_memory_mb=100",
         f"hydra.sweeper.load.concurrency=[{','.join(map(str, LEVELS))}]", "hydra.sweeper.load.input_len=32",
         f"hydra.sweeper.load.prompts={PROMPTS}")
PNG = b"\x89PNG\r\n\x1a\n"


def _specsweep(cwd: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", "PYTHONPATH": PYTHONPATH}
    return subprocess.run([sys.executable, "-m", "orchestrator", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _client(cwd: Path):
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{cwd}/mlflow.db")


def _runs(cwd: Path, role: str):
    client = _client(cwd)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("specsweep.role") == role]


def _artifact(cwd: Path, run_id: str, path: str) -> bytes:
    return Path(_client(cwd).download_artifacts(run_id, path, str(cwd / "dl" / run_id))).read_bytes()


@pytest.fixture(scope="module")
def curve(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("load")
    out = _specsweep(cwd, "+load=curve", "drafter=ngram", *SMALL, "hydra.sweeper.load.max_p99_tpot_ms=1000")
    return cwd, out


def test_a_load_curve_records_bench_servings_levels_metrics_table_and_charts(curve):
    cwd, out = curve
    assert out.returncode == 0, out.stderr[-4000:]
    (run,) = _runs(cwd, "load")
    rid = run.info.run_id
    assert run.info.status == "FINISHED" and run.data.tags["load.configuration"] == "drafter=ngram model=tiny"
    # the raw record: bench_serving's own file, one line per level, with its per-request details
    lines = [json.loads(ln) for ln in _artifact(cwd, rid, "load/bench_serving.jsonl").decode().splitlines()]
    assert [ln["max_concurrency"] for ln in lines] == list(LEVELS)
    requests = [json.loads(ln) for ln in _artifact(cwd, rid, "load/requests.jsonl").decode().splitlines()]
    for c, line in zip(LEVELS, lines):
        assert line["backend"] == "sglang" and line["completed"] == PROMPTS and line["errors"] == [""] * PROMPTS
        assert line["output_lens"] == [16] * PROMPTS and line["goodput_slos_ms"] == {"tpot": 1000.0}
        for name in LATENCIES:
            assert line[f"median_{name}_ms"] <= line[f"p90_{name}_ms"] <= line[f"p99_{name}_ms"], name
        # the engine's record of each timed request of the level (bench_serving's warm-up left out)
        mine = [r for r in requests if r["level"] == f"c{c}"]
        assert len(mine) == PROMPTS and all(r["completion_tokens"] == 16 and r["spec_verify_ct"] >= 1 for r in mine)
        m = run.data.metrics
        assert m[f"load.c{c}.output_tok_s"] == pytest.approx(line["output_throughput"])
        assert m[f"load.c{c}.p99_tpot_ms"] == pytest.approx(line["p99_tpot_ms"])
        assert m[f"load.c{c}.goodput_req_s"] == pytest.approx(line["request_goodput"])
        assert m[f"load.c{c}.within_limits"] == float(line["p99_tpot_ms"] <= 1000)
        assert 1 <= m[f"load.c{c}.accept_len_p10"] <= m[f"load.c{c}.accept_len_p90"] <= 5  # ngram, 4 steps
        assert m[f"load.c{c}.tok_s_per_user"] == pytest.approx(1000 / line["median_tpot_ms"])
    table = _artifact(cwd, rid, "load/table.md").decode()
    rows = [r for r in table.splitlines() if r.startswith("| concurrency ")]
    assert [r.split(" | ")[0] for r in rows] == [f"| concurrency {c}" for c in LEVELS]
    assert all(r.split(" | ")[1] == f"{PROMPTS}/{PROMPTS}" for r in rows)
    for png in ("load/load_curve.png", "load/pareto.png", "load/accept_length.png"):
        assert _artifact(cwd, rid, png)[:8] == PNG, png
    assert "| concurrency 1 |" in _artifact(cwd, rid, "load/report.md").decode()
    # the front drawn on the Pareto chart, from the recorded lines: no level beats a front level on both axes
    levels = [level_figures(ln, [], LoadLevel(ln["max_concurrency"]), 0, Limits()) for ln in lines]
    front = pareto_front(levels)
    assert front and all(math.isfinite(lv.tok_s_per_user) for lv in front)
    for a in front:
        assert not any(b.tok_s_per_user > a.tok_s_per_user and b.tok_s_per_gpu > a.tok_s_per_gpu for b in levels)
    assert "load curve (run" in out.stderr + out.stdout


def test_after_a_tune_each_winner_has_its_curve_under_the_tunes_run(tmp_path):
    out = _specsweep(tmp_path, "+tune=tiny", "+load=curve", *SMALL[4:], "hydra.sweeper.tune.max_tpot_ms=1000",
                     timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    (tune,) = _runs(tmp_path, "tune")
    curves = _runs(tmp_path, "load")
    winners = {ln.split("|")[3].strip() for ln in _artifact(tmp_path, tune.info.run_id, "tune/answer.md").decode()
               .splitlines() if ln.startswith("| 64 |")}
    assert {r.data.tags["load.configuration"] for r in curves} == winners and curves
    for r in curves:
        assert r.data.tags["mlflow.parentRunId"] == tune.info.run_id and r.info.status == "FINISHED"
        assert {f"load.c{c}.p99_tpot_ms" for c in LEVELS} <= set(r.data.metrics)
    report = _artifact(tmp_path, tune.info.run_id, "load/report.md").decode()
    assert "p99 limits (the tune's): TPOT <= 1000 ms" in report
    assert all(f"**{w}**" in report for w in winners)
    assert _artifact(tmp_path, tune.info.run_id, "load/pareto.png")[:8] == PNG
