"""The conditioned space: drafter knobs only where the drafter speculates, num_draft_tokens only with topk > 1."""

from __future__ import annotations

from orchestrator.tune.settings import settings_problems, to_tune_settings
from orchestrator.tune.space import Candidate, candidate_overrides, drafter_key, enumerate_space, job_overrides, workload

ALGO = {"none": False, "ngram": True, "draft_model": True}


def spec(params):
    return ALGO[params.get("drafter", "ngram")]


def test_no_speculation_collapses_every_drafter_knob():
    space = {"drafter": ["none", "ngram"], "drafter.num_steps": [1, 2, 4], "page_size": [1, 16]}
    cands = enumerate_space(space, spec)
    keys = {c.key for c in cands}
    assert len(cands) == 2 + 2 * 3  # none x 2 pages, ngram x 3 steps x 2 pages
    assert "drafter=none page_size=1" in keys
    assert "drafter=ngram drafter.num_draft_tokens=3 drafter.num_steps=2 page_size=16" in keys


def test_num_draft_tokens_is_searched_only_with_topk_above_one():
    space = {"drafter": ["draft_model"], "drafter.num_steps": [2, 4], "drafter.topk": [1, 2],
             "drafter.num_draft_tokens": [4, 8]}
    cands = enumerate_space(space, spec)
    chains = [c for c in cands if c.values["drafter.topk"] == "1"]
    trees = [c for c in cands if c.values["drafter.topk"] == "2"]
    assert len(chains) == 2 and {c.draft_tokens for c in chains} == {3, 5}  # num_steps + 1
    assert len(trees) == 2 * 2 and {c.draft_tokens for c in trees} == {4, 8}


def test_candidate_overrides_are_sorted_and_labelled():
    c = Candidate(candidate_overrides({"page_size": 16, "drafter": "ngram", "drafter.num_steps": 4}, True), True)
    assert c.overrides == ("drafter=ngram", "drafter.num_draft_tokens=5", "drafter.num_steps=4", "page_size=16")
    assert c.label == "ngram tokens=5 steps=4 page=16"
    assert drafter_key(c) == "drafter=ngram drafter.num_draft_tokens=5 drafter.num_steps=4"
    assert Candidate(candidate_overrides({"drafter": "none", "drafter.num_steps": 4}, False), False).draft_tokens == 0


def test_workload_and_job_overrides():
    pts = workload([4, 1], (), 256)
    assert pts == [(256, 1), (256, 4)]
    c = Candidate(("drafter=ngram",), True)
    assert job_overrides(c, (256, 4), ["+tune=x"], repeats=3) == [
        "+tune=x", "drafter=ngram", "context_len=256", "probe.concurrency=4", "probe.repeats=3"]


def test_settings_problems_name_the_key_the_value_and_what_is_allowed():
    ok = {"space": {"drafter": ["none", "ngram"]}, "batch_sizes": [1, 4], "sampler": "tpe", "trials": 4}
    assert settings_problems(ok) == []
    s = to_tune_settings(ok)
    assert s.batch_sizes == (1, 4) and s.space == {"drafter": ("none", "ngram")}
    bad = {"space": {"probe.concurrency": [1, 2], "page_size": []}, "batch_sizes": [0], "sampler": "annealing",
           "repeats": 2}
    text = "\n".join(map(str, settings_problems(bad)))
    assert "hydra.sweeper.tune.space.probe.concurrency=[1, 2]: allowed no probe.concurrency in the space" in text
    assert "hydra.sweeper.tune.space.page_size=[]: allowed a non-empty list of distinct values" in text
    assert "hydra.sweeper.tune.sampler='annealing': allowed one of tpe, motpe, random, grid" in text
    assert "hydra.sweeper.tune.repeats=2" in text and "hydra.sweeper.tune.batch_sizes=[0]" in text
