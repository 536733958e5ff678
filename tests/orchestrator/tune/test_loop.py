"""The ask/tell loop on its own: the budget, what is answered without a run, and resume from the study."""

from __future__ import annotations

import optuna

from orchestrator.tune.loop import Measured, choose_leaders, search_loop
from orchestrator.tune.settings import TuneSettings
from orchestrator.tune.space import drafter_key, enumerate_space
from orchestrator.tune.study import open_study

SPACE = {"drafter": ("none", "ngram"), "drafter.num_steps": (1, 2, 4), "page_size": (1, 16)}


def spec(params):
    return params.get("drafter") != "none"


def _setup(trials, sampler="random"):
    cands = {c.key: c for c in enumerate_space(SPACE, spec)}
    settings = TuneSettings(space=SPACE, trials=trials, per_round=2, sampler=sampler, seed=3)
    return cands, settings


def test_a_drafter_that_commits_one_at_batch_one_is_never_measured_again():
    cands, settings = _setup(trials=8)
    refused = {"drafter=ngram drafter.num_draft_tokens=5 drafter.num_steps=4 page_size=16": "page_size=16: refused"}
    measured: list[str] = []

    def measure(keys, _round):
        measured.extend(keys)
        return {k: Measured((100.0 + i, 50.0), 0.0, 1.0 if "num_steps=1 " in k else 3.0, "r")
                for i, k in enumerate(keys)}

    study = open_study(settings, "t", 2, None, len(cands))  # in memory
    values = search_loop(study, settings, cands, refused, spec, measure)
    assert len(measured) == len(set(measured)) == len(values)  # each configuration measured once
    assert not set(measured) & set(refused)
    no_gain = [k for k in measured if "num_steps=1 " in k]
    # the first steps=1 configuration ran; its drafter setting under the other page size was pruned, not run
    assert len(no_gain) <= 1
    pruned = [t for t in study.trials if t.state is optuna.trial.TrialState.PRUNED]
    if no_gain:
        key = drafter_key(cands[no_gain[0]])
        assert all(key not in m or m == no_gain[0] for m in measured)
    assert all(t.user_attrs.get("pruned") for t in pruned)
    assert len(values) <= len(cands) - len(refused)


def test_the_study_resumes_with_its_measured_trials(tmp_path):
    cands, settings = _setup(trials=3)
    storage = f"sqlite:///{tmp_path}/o.db"
    runs: list[str] = []

    def measure(keys, _round):
        runs.extend(keys)
        return {k: Measured((float(len(k)), 1.0)) for k in keys}

    first = search_loop(open_study(settings, "t", 2, storage, len(cands)), settings, cands, {}, spec, measure)
    assert len(first) == 3
    more = TuneSettings(space=SPACE, trials=5, per_round=2, sampler="random", seed=3)
    second = search_loop(open_study(more, "t", 2, storage, len(cands)), more, cands, {}, spec, measure)
    assert len(second) == 5 and list(second)[:3] == list(first)  # the first three read back, not run again
    assert len(runs) == 5


def test_leaders_are_the_best_per_point_plus_the_best_without_speculation():
    values = {"a": (10.0, 1.0), "b": (9.0, 3.0), "c": (1.0, 2.0), "none": (5.0, 0.5)}
    got = choose_leaders(values, 2, lambda k: k != "none", 2)
    assert got == [["a", "b", "none"], ["b", "c", "none"]]


def test_an_enqueued_configuration_is_asked_back_with_its_values():
    """The grid and the per-point proposals enqueue a configuration's params; `suggest` hands them back."""
    from orchestrator.tune.study import suggest

    space = {"drafter": ("none", "ngram"), "drafter.num_steps": (1, 2, 4, 8), "page_size": (1, 16, 64)}
    study = optuna.create_study(directions=["maximize", "maximize"])
    want = {"drafter": "ngram", "page_size": 64, "drafter.num_steps": 4}
    study.enqueue_trial(want)
    assert suggest(study.ask(), space, spec) == want


def test_per_point_proposals_measure_each_configuration_once_and_resume(tmp_path):
    """Per-point mode: a TPE over one point's values proposes, the study records; nothing is measured twice, the
    refused are never run, and a second run of the loop continues the persisted study."""
    cands, _ = _setup(trials=6)
    settings = TuneSettings(space=SPACE, trials=6, per_round=2, sampler="tpe", seed=1)
    refused = {"drafter=ngram drafter.num_draft_tokens=3 drafter.num_steps=2 page_size=16": "refused"}
    runs: list[str] = []

    def measure(keys, _round):
        runs.extend(keys)
        return {k: Measured((float(len(k)), -float(len(k))), 0.0, 3.0) for k in keys}

    storage = f"sqlite:///{tmp_path}/o.db"
    first = search_loop(open_study(settings, "p", 2, storage, len(cands)), settings, cands, refused, spec, measure)
    assert len(first) == 6 and len(runs) == 6 == len(set(runs)) and not set(runs) & set(refused)
    more = TuneSettings(space=SPACE, trials=9, per_round=2, sampler="tpe", seed=1)
    study = open_study(more, "p", 2, storage, len(cands))
    second = search_loop(study, more, cands, refused, spec, measure)
    assert list(second)[:6] == list(first) and len(runs) == len(set(runs)) == len(second)
    assert len(second) == min(9, len(cands) - len(refused))
