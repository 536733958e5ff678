"""The load curve's figures, Pareto front, goodput and limits, read from real SGLang bench_serving output.

The fixtures are one real run (2026-12-06): `specsweep +load=curve model=tiny drafter=ngram` at concurrency 1 and 2,
4 requests each (32 prompt tokens, 16 output tokens), `max_p99_tpot_ms=100` (bench_serving `--goodput tpot:100`):
`bench_serving_tiny_ngram.jsonl` is bench_serving 0.5.23's result file as the run attached it (one line per level,
with --output-details), `requests_tiny_ngram.jsonl` the reference engine's per-request records (SGLang's
--export-metrics-to-file format) with their level.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from orchestrator.load.curve import (LATENCIES, Level, accept_lengths, level_figures, level_metrics, pareto_front,
                                     quantile)
from orchestrator.load.render import accept_figure, load_curve_figure, pareto_figure, table_markdown
from orchestrator.load.settings import Limits, LoadSettings, limits, load_spec, settings_problems, to_load_settings
from specsweep_common.load import LoadLevel, LoadSpec
from workers.load_curve import bench_argv

FIXTURES = Path(__file__).with_name("fixtures")
RECORDS = [json.loads(ln) for ln in (FIXTURES / "bench_serving_tiny_ngram.jsonl").read_text().splitlines()]
REQUESTS = [json.loads(ln) for ln in (FIXTURES / "requests_tiny_ngram.jsonl").read_text().splitlines()]
LIMIT = Limits(p99_tpot_ms=100.0, source="load")


def _levels(lim: Limits = LIMIT, gpus: int = 0) -> list[Level]:
    out = []
    for rec in RECORDS:
        level = LoadLevel(concurrency=rec["max_concurrency"])
        reqs = [r for r in REQUESTS if r["level"] == level.label]
        out.append(level_figures(rec, reqs, level, gpus, lim))
    return out


def test_each_level_reads_bench_servings_own_figures():
    for rec, lv in zip(RECORDS, _levels()):
        assert lv.completed == rec["completed"] == 4 and lv.requests == 4 and not lv.errors
        assert lv.output_tok_s == rec["output_throughput"]
        assert lv.output_tok_s == pytest.approx(rec["total_output_tokens"] / rec["duration"])
        assert lv.request_per_s == pytest.approx(lv.completed / rec["duration"])
        for name in LATENCIES:
            stats = [lv.latency_ms[f"{s}_{name}_ms"] for s in ("median", "p90", "p95", "p99")]
            assert stats == sorted(stats) and all(math.isfinite(x) and x > 0 for x in stats), name
        # TPOT is per request, (latency - ttft) / (output - 1): never above the whole request's latency
        assert lv.latency_ms["p99_tpot_ms"] <= lv.latency_ms["p99_e2e_latency_ms"]
        assert lv.tok_s_per_user == pytest.approx(1000 / rec["median_tpot_ms"])
        assert lv.tok_s_per_gpu == lv.output_tok_s  # a CPU server: per server
        assert lv.x == rec["max_concurrency"]


def test_goodput_is_bench_servings_under_the_p99_limit():
    for rec, lv in zip(RECORDS, _levels()):
        assert rec["goodput_slos_ms"] == {"tpot": 100.0}
        assert lv.goodput_req_s == rec["request_goodput"] and lv.slo_attainment == rec["slo_attainment"]
        assert 0 <= lv.slo_attainment <= 1
        # every request met the TPOT limit: goodput is the whole request rate
        assert lv.slo_attainment == 1.0 and lv.goodput_req_s == pytest.approx(lv.request_per_s)
        assert lv.within_limits is (lv.latency_ms["p99_tpot_ms"] <= 100)
    tight = _levels(Limits(p99_tpot_ms=1.0, source="tune"))
    assert [lv.within_limits for lv in tight] == [False, False]
    assert all(lv.within_limits is None for lv in _levels(Limits()))


def test_per_request_accept_length_is_completion_tokens_over_verify_steps():
    acc = accept_lengths(REQUESTS)
    assert len(acc) == len(REQUESTS) == 8
    for a, r in zip(acc, REQUESTS):
        assert a == pytest.approx(r["completion_tokens"] / r["spec_verify_ct"])
        assert a == pytest.approx(r["spec_accept_length"])  # the engine's own field, SGLang's definition
        assert 1.0 <= a <= 1 + 4  # ngram drafter, 4 steps: at most num_steps + 1 per verify step
    assert accept_lengths([{"completion_tokens": 16}]) == ()  # no speculation: no verify step, no figure
    lv = _levels()[0]
    assert len(lv.accept_lens) == 4
    m = level_metrics(lv)
    assert m["load.c1.accept_len_p10"] <= m["load.c1.accept_len_p50"] <= m["load.c1.accept_len_p90"]
    assert m["load.c1.server_accept_len"] == RECORDS[0]["accept_length"]


def test_metric_names_per_level():
    m = level_metrics(_levels()[1])
    for name in ("output_tok_s", "request_per_s", "tok_s_per_user", "tok_s_per_gpu", "goodput_req_s",
                 "slo_attainment", "within_limits", "p99_tpot_ms", "median_ttft_ms", "p90_itl_ms",
                 "p99_e2e_latency_ms", "mean_tpot_ms", "accept_len_mean"):
        assert f"load.c2.{name}" in m, name
    assert all(k.startswith("load.c2.") and math.isfinite(v) for k, v in m.items())


def _lv(label: str, user: float, gpu: float) -> Level:
    return Level(LoadLevel(concurrency=int(label)), 1, 1, 1.0, gpu, 1.0, 1.0, {"median_tpot_ms": 1000 / user}, 0)


def test_the_pareto_front_holds_only_non_dominated_levels():
    pts = [_lv("1", 100, 50), _lv("2", 80, 90), _lv("4", 60, 120), _lv("8", 50, 110), _lv("16", 70, 80)]
    front = pareto_front(pts)
    assert [lv.level.concurrency for lv in front] == [4, 2, 1]  # sorted by tok/s per user
    for a in front:  # no point beats a front point on both axes
        assert not any(b.tok_s_per_user >= a.tok_s_per_user and b.tok_s_per_gpu >= a.tok_s_per_gpu
                       and (b.tok_s_per_user, b.tok_s_per_gpu) != (a.tok_s_per_user, a.tok_s_per_gpu) for b in pts)
    for a in [p for p in pts if all(p is not f for f in front)]:  # every other point is beaten by a front point
        assert any(b.tok_s_per_user >= a.tok_s_per_user and b.tok_s_per_gpu >= a.tok_s_per_gpu for b in front)
    real = _levels()
    front = pareto_front(real)
    assert front and all(not any(b.tok_s_per_user > a.tok_s_per_user and b.tok_s_per_gpu > a.tok_s_per_gpu
                                 for b in real) for a in front)


def test_quantile_is_numpys_linear_default():
    import numpy as np

    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.percentile(xs, q * 100)))
    assert math.isnan(quantile([], 0.5))


def test_table_and_figures():
    levels = _levels()
    table = table_markdown("drafter=ngram", levels, LIMIT)
    rows = [ln for ln in table.splitlines() if ln.startswith("| concurrency")]
    assert len(rows) == 2 and "goodput req/s" in table and "tok/s per server" in table
    assert rows[0].split(" | ")[1] == "4/4"
    no_limits = table_markdown("drafter=ngram", levels, Limits())
    assert "goodput" not in no_limits
    for fig in (load_curve_figure("drafter=ngram", levels), pareto_figure({"drafter=ngram": levels}),
                accept_figure({"drafter=ngram": levels})):
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    no_spec = [level_figures(RECORDS[0], [], LoadLevel(1), 0, Limits())]
    assert accept_figure({"drafter=none": no_spec}) is None


def test_bad_settings_name_the_key_the_value_and_what_is_allowed(tmp_path):
    def keys(values):
        return {(p.key, repr(p.value)): p.allowed for p in settings_problems(values)}

    got = keys({"concurrency": [1, -2, "abc", 2.5], "request_rates": [0]})
    assert set(got) == {("hydra.sweeper.load.concurrency[1]", "-2"), ("hydra.sweeper.load.concurrency[2]", "'abc'"),
                        ("hydra.sweeper.load.concurrency[3]", "2.5"), ("hydra.sweeper.load.request_rates[0]", "0")}
    assert got[("hydra.sweeper.load.concurrency[1]", "-2")] == "an integer in [1, 4096]"
    assert "at least one level" in keys({"concurrency": [], "request_rates": []})[
        ("hydra.sweeper.load.concurrency", "[]")]
    missing = keys({"concurrency": [1], "tokenizer": str(tmp_path / "nope")})
    assert list(missing) == [("hydra.sweeper.load.tokenizer", repr(str(tmp_path / "nope")))]
    assert keys({"concurrency": [1], "backend": "vllm"})[("hydra.sweeper.load.backend", "'vllm'")].startswith("one of")
    assert keys({"concurrency": [1, 1]}) == {("hydra.sweeper.load.concurrency", "[1, 1]"): "distinct levels"}
    assert not keys({"concurrency": [1, 4], "request_rates": [0.5], "tokenizer": str(tmp_path)})


def test_load_spec_levels_prompts_and_the_tunes_limits():
    s = to_load_settings({"concurrency": [1, 4], "request_rates": [2], "output_len": None})
    lim = limits(s, tune_tpot_ms=40.0, tune_ttft_s=None)
    assert lim == Limits(p99_tpot_ms=40.0, p99_ttft_s=None, source="tune")
    spec = load_spec(s, gen_tokens=32, lim=lim)
    assert [lv.label for lv in spec.levels] == ["c1", "c4", "r2"]
    assert spec.prompts == (8, 16, 16) and spec.output_len == 32 and spec.goodput_ms == (("tpot", 40.0),)
    own = limits(LoadSettings(max_p99_ttft_s=0.5), tune_tpot_ms=40.0)
    assert own.source == "load" and own.goodput_ms() == (("ttft", 500.0), ("tpot", 40.0))


def test_bench_argv_is_a_list_with_the_levels_flags():
    spec = LoadSpec(levels=(LoadLevel(4),), prompts=(16,), input_len=64, output_len=16, goodput_ms=(("tpot", 50.0),))
    argv = bench_argv("http://127.0.0.1:1", "/tok", LoadLevel(4), 16, spec, "/out.jsonl")
    assert argv[1:3] == ["-m", "workers.sglang.bench_serving"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--max-concurrency"] == "4" and flags["--request-rate"] == "inf"
    assert flags["--model"] == flags["--tokenizer"] == "/tok" and flags["--num-prompts"] == "16"
    assert argv[argv.index("--goodput") + 1] == "tpot:50" and "--output-details" in argv
    rate = bench_argv("u", "/tok", LoadLevel(request_rate=2.5), 8, spec, "/o")
    assert "--max-concurrency" not in rate and rate[rate.index("--request-rate") + 1] == "2.5"
