"""The regression check's pure parts: point identity, verdicts on synthetic histories, attribution, change points."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.settings import RegressSettings
from orchestrator.results.regress.attribution import GridPoint, differences, drafter_or_pipeline, grid_pattern
from orchestrator.results.regress.changepoints import change_points
from orchestrator.results.regress.verdict import (IMPROVEMENT, NO_BASELINE, NO_SPREAD, REGRESSION, UNCHANGED, Noise,
                                                  judge)
from specsweep_common.point_key import point_key
from specsweep_common.spec import ProbeKind, ProbeSpec, stable_hash
from specsweep_common.confidence_interval import interval
from tools.testing import tiny_server

S = RegressSettings()


def test_point_key_ignores_engine_version_and_bind_host_but_nothing_else():
    server = tiny_server("ngram")
    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=1024, gen_tokens=32)
    upgraded = dataclasses.replace(server, engine=dataclasses.replace(server.engine, version="0.2.0"), host="10.0.0.7")
    assert stable_hash(server, probe) != stable_hash(upgraded, probe)  # run_hash sees the upgrade ...
    assert point_key(server, probe) == point_key(upgraded, probe)  # ... the point is the same point
    assert point_key(server, probe) != point_key(server, dataclasses.replace(probe, context_len=2048))
    assert point_key(server, probe) != point_key(server, dataclasses.replace(probe, kind=ProbeKind.PREDICTABLE))
    steps = dataclasses.replace(server, drafter=dataclasses.replace(server.drafter, num_steps=5))
    assert point_key(server, probe) != point_key(steps, probe)
    assert point_key(server, probe) != point_key(dataclasses.replace(server, page_size=1), probe)


def test_exact_metric_any_change_is_real_and_reported_exactly():
    v = judge("commit_len_mean", [2.85, 2.85, 2.85], [2.84], S)
    assert v.status == REGRESSION and v.kind == "exact" and v.baseline == 2.85 and v.current == 2.84
    assert "2.85" in v.why and "2.84" in v.why
    assert judge("commit_len_mean", [2.85] * 4, [2.85], S).status == UNCHANGED
    assert judge("accept_rate", [0.5], [0.6], S).status == IMPROVEMENT  # one baseline run is enough when exact


def test_exact_metric_with_a_varying_baseline_is_judged_as_noisy():
    v = judge("commit_len_mean", [2.80, 2.90, 2.85, 2.82], [2.84], S)
    assert v.kind == "noisy" and v.status == UNCHANGED and "not constant" in v.why


def test_noisy_metric_inside_the_spread_is_not_flagged():
    base = [100.0, 104.0, 97.0, 101.0, 99.0]
    noise = Noise(sd=0.02, df=16, points=4)  # 2 % sd pooled over 4 points: limit 5.36 x 2 % x 1.095 = 11.7 %
    assert judge("decode_tok_s", base, [91.0], S, noise).status == UNCHANGED
    assert judge("decode_tok_s", base, [109.0], S, noise).status == UNCHANGED


def test_noisy_metric_beyond_the_prediction_limit_and_min_rel_is_flagged_with_its_direction():
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    noise = Noise(sd=0.01, df=16, points=4)
    fell = judge("decode_tok_s", base, [90.0], S, noise)
    assert fell.status == REGRESSION and fell.z is not None and fell.limit is not None and fell.z < -fell.limit
    assert fell.rel_change == pytest.approx(-0.1, abs=1e-4)
    assert judge("decode_tok_s", base, [110.0], S, noise).status == IMPROVEMENT
    assert judge("verify_step_ms", [10.0, 10.1, 9.9, 10.0], [11.0], S, noise).status == REGRESSION  # lower is better
    # far outside a tiny spread, but under min_rel_change: not flagged
    tight = [100.0, 100.01, 99.99, 100.0]
    assert judge("decode_tok_s", tight, [99.0], S, Noise(0.0001, 16, 4)).status == UNCHANGED
    assert judge("decode_tok_s", tight, [99.0], RegressSettings(min_rel_change=0.005),
                 Noise(0.0001, 16, 4)).status == REGRESSION


def test_without_a_spread_between_sweeps_a_noisy_metric_is_shown_not_judged_and_repeats_do_not_decide():
    v = judge("decode_tok_s", [100.0], [60.0], S)  # one earlier run, no pooled spread given: none to judge by
    assert v.status == NO_SPREAD and not v.flagged and v.rel_change == pytest.approx(-0.4) and "not judged" in v.why
    # this run's repeats are tight and far from the baseline: they bound the noise within the sweep, not the drift
    assert judge("decode_tok_s", [100.0], [80.0, 80.5, 79.5], S).status == NO_SPREAD
    assert judge("commit_len_mean", [4.0], [3.0], S).status == REGRESSION  # exact metrics need no spread
    assert judge("decode_tok_s", [], [90.0], S).status == NO_BASELINE


def test_interval_is_students_t():
    i = interval([1.0, 2.0, 3.0])  # sd 1, n 3, t(2) 4.303
    assert i.mean == 2.0 and i.half_width == pytest.approx(4.303 / 3 ** 0.5, rel=1e-4) and i.n == 3
    assert interval([5.0]).half_width == 0.0


def test_differences_list_each_changed_attribution_tag():
    base = [{"git_sha": "aaa", "engine_version": "0.5.22", "sglang.page_size": "1", "node_ip": "10.0.0.1",
             "run_hash": "x"}] * 2
    now = {"git_sha": "bbb", "engine_version": "0.5.23", "sglang.page_size": "1", "node_ip": "10.0.0.1",
           "run_hash": "y", "gpu_name": "NVIDIA H200"}
    assert differences(now, base) == ["engine_version: 0.5.22 → 0.5.23", "git_sha: aaa → bbb",
                                      "gpu_name: (none) → NVIDIA H200"]
    assert differences(base[0], base) == []


def _grid() -> list[GridPoint]:
    pts = []
    for ctx in (16384, 65536, 131072):
        for probe in ("predictable", "novel"):
            for drafter in ("ngram", "oracle"):
                node = "10.0.0.2" if drafter == "oracle" else "10.0.0.1"
                pts.append(GridPoint(f"{ctx}-{probe}-{drafter}", ctx, probe, drafter, "torch", 16, node,
                                     is_oracle=drafter == "oracle"))
    return pts


def test_grid_pattern_names_the_coordinates_that_select_exactly_the_flagged_points():
    pts = _grid()
    novel_long_ngram = {p.key for p in pts if p.probe == "novel" and p.context_len >= 65536 and p.drafter == "ngram"}
    assert grid_pattern(pts, novel_long_ngram) == ("only on node=10.0.0.1, probe=novel, drafter=ngram, "
                                                   "context_len ≥ 65536")
    on_node = {p.key for p in pts if p.node == "10.0.0.2"}
    assert grid_pattern([dataclasses.replace(p, drafter="ngram") for p in pts], on_node) == \
        "on every point of node 10.0.0.2"
    assert grid_pattern(pts, {p.key for p in pts}).startswith("on every point")
    assert grid_pattern(pts, {pts[0].key, pts[-1].key}).startswith("on 2 of 12 points")


def test_commit_drop_with_the_oracle_intact_is_the_drafter():
    pts = _grid()
    ngram = {p.key for p in pts if p.drafter == "ngram"}
    assert "the drafter changed, not the pipeline" in drafter_or_pipeline("commit_len_mean", ngram, pts)
    both = {p.key for p in pts}
    assert "the pipeline changed" in drafter_or_pipeline("commit_len_mean", both, pts)
    assert drafter_or_pipeline("decode_tok_s", ngram, pts) is None


def test_change_points_find_the_step():
    noisy = [100, 101, 99, 100.5, 99.5, 100, 90, 91, 89.5, 90.5, 90, 89]
    assert change_points(noisy) == [6]
    assert change_points([100, 101, 99, 100.5, 99.5, 100, 100.2, 99.8]) == []
    assert change_points([2.85, 2.85, 2.85, 2.40, 2.40]) == [3]  # exact values: where they change
