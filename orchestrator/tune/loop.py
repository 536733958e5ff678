"""The search itself, free of engines and stores: Optuna's ask/tell over the conditioned space, and the leaders.

    search_loop(study, settings, candidates, refused, speculates, measure) -> {key: tok/s per point}
    choose_leaders(values, n_points, speculates, n) -> [[key, ...] per point]

`measure(keys, round)` is the one edge: the tune runs each round as a sweep (orchestrator/tune/search.py), the
benchmark replays recorded measurements (tools/bench_tune.py). Answered without a run: a refused candidate, one
asked twice in a round, a configuration measured before (its values told again), and a drafter setting that an
earlier trial showed committing at most `no_gain_commit_len` at the smallest batch (pruned, with the reason).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from orchestrator.tune.settings import SamplerKind, TuneSettings
from orchestrator.tune.space import Candidate, candidate_overrides, drafter_key
from orchestrator.tune.study import CANDIDATE_ATTR, CONSTRAINT_ATTR, MEASURED_ATTR, measured_trials, suggest

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

LATENCY_CONSTRAINT = "latency"  # > 0: over a latency limit (max_ttft_s, max_tpot_ms)


@dataclass(frozen=True)
class Measured:
    """One configuration measured at every workload point: tok/s per point, its latency constraint (> 0: over a
    limit) and its commit length at the first point (None: not speculating or not recorded)."""

    values: tuple[float, ...]
    violation: float = 0.0
    first_commit: float | None = None
    run_id: str = ""


def search_loop(study: "optuna.Study", settings: TuneSettings, candidates: Mapping[str, Candidate],
                refused: Mapping[str, object], speculates: Callable[[Mapping[str, Any]], bool],
                measure: Callable[[list[str], int], Mapping[str, Measured | None]],
                first_batch: int = 1, startup_of: int | None = None) -> dict[str, tuple[float, ...]]:
    """Ask, answer what needs no run, measure the rest a round at a time (`measure(keys, round)`), tell. Returns
    every measured configuration's tok/s per workload point, in the order they were measured (resumed ones first).
    The loop the tune runs on the engines, and the benchmark replays on recorded values (tools/bench_tune.py)."""
    import optuna

    s = settings
    values: dict[str, tuple[float, ...]] = {}
    no_gain: dict[str, str] = {}  # drafter key -> why
    for t in sorted(measured_trials(study), key=lambda t: t.number):
        values[t.user_attrs[CANDIDATE_ATTR]] = tuple(t.values)
        if t.user_attrs.get("no_gain"):
            no_gain[drafter_key(candidates[t.user_attrs[CANDIDATE_ATTR]])] = t.user_attrs["no_gain"]
    budget = min(s.trials, len(candidates))
    startup_of = budget if startup_of is None else startup_of  # the random start: a quarter of the budget
    per_point = s.sampler_kind is SamplerKind.TPE
    asks_left = 20 * (budget + s.per_round)  # proposals answered without a run never loop forever
    round_no = max((t.user_attrs.get("round", 0) for t in measured_trials(study)), default=0)
    batch: dict[str, optuna.trial.Trial] = {}

    def why_not(key: str) -> str | None:
        """Why `key` is answered without a run (None: it is measured)."""
        return ("measured before" if key in values else None) or (str(refused[key]) if key in refused else None) or \
            ("asked twice in one round" if key in batch else None) or \
            ("not in the space" if key not in candidates else None) or no_gain.get(drafter_key(candidates[key]))

    def a_fresh_one() -> dict[str, Any] | None:
        """A configuration not measured, refused or pruned, drawn at random (seeded): where the point's TPE keeps
        proposing what is known, an ask still measures something new."""
        fresh = sorted(k for k, c in candidates.items() if c.params and why_not(k) is None)
        return dict(candidates[random.Random(s.seed + len(study.trials)).choice(fresh)].params) if fresh else None

    while len(values) < budget and asks_left > 0:
        batch = {}
        while len(batch) < min(s.per_round, budget - len(values)) and asks_left > 0:
            asks_left -= 1
            trial = _ask(study, s, speculates, per_point, [*batch.values()], startup_of,
                         lambda p: why_not(_key(p, speculates)) is None, a_fresh_one)
            params = suggest(trial, s.space, speculates)
            key = _key(params, speculates)
            trial.set_user_attr(CANDIDATE_ATTR, key)
            if key in values:
                trial.set_user_attr(MEASURED_ATTR, False)
                study.tell(trial, list(values[key]))
                continue
            why = why_not(key)
            if why:
                trial.set_user_attr("pruned", str(why))
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                batch[key] = trial
        if not batch:
            break
        round_no += 1
        got = measure(list(batch), round_no)
        for key, trial in batch.items():
            trial.set_user_attr("round", round_no)
            m = got.get(key)
            if m is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            trial.set_user_attr(MEASURED_ATTR, True)
            trial.set_user_attr(CONSTRAINT_ATTR, [m.violation])
            trial.set_constraint(LATENCY_CONSTRAINT, m.violation)  # Optuna >= 5: the samplers read it
            c = candidates[key]
            if c.speculates and m.first_commit is not None and m.first_commit <= s.no_gain_commit_len:
                why = (f"{drafter_key(c)} committed {m.first_commit:.3f} tokens per step at batch {first_batch} "
                       f"(run {m.run_id[:8]}): speculation pays at no batch size")
                no_gain[drafter_key(c)] = why
                trial.set_user_attr("no_gain", why)
                log.info("pruned from now on: %s", why)
            study.tell(trial, list(m.values))
            values[key] = m.values
    return values


def _key(params: Mapping[str, Any], speculates: Callable[[Mapping[str, Any]], bool]) -> str:
    return " ".join(candidate_overrides(params, speculates(params)))


def _ask(study: "optuna.Study", settings: TuneSettings, speculates: Callable[[Mapping[str, Any]], bool],
         per_point: bool, pending: Sequence["optuna.trial.Trial"], startup_of: int,
         fresh: Callable[[Mapping[str, Any]], bool],
         fallback: Callable[[], Mapping[str, Any] | None]) -> "optuna.trial.Trial":
    """The next trial. `per_point` (sampler=tpe): proposed by a single-objective TPE over one workload point's
    values, the point taking turns with each proposal (the study's trial count modulo the points), then asked of
    `study` with those params. Every trial measures every point, so each point's TPE learns from all of them; a
    multi-objective TPE (sampler=motpe) splits good from bad by Pareto rank, which with few trials and several
    points calls most of them good. The point's TPE draws until `fresh(params)` (not measured, refused or pruned
    before): each draw stays RUNNING in the view, where Optuna's constant liar counts it as bad, so the next lands
    elsewhere; after `_DRAWS` draws, `fallback()` (a fresh configuration at random) instead. `pending`: this round's
    trials, not yet measured, counted as bad the same way so a round spreads out.
    """
    if not per_point:
        return study.ask()
    import optuna

    from orchestrator.tune.study import _sampler

    done = study.get_trials(deepcopy=False)
    target = len(done) % len(study.directions)
    view = optuna.create_study(direction="maximize",
                               sampler=_sampler(replace(settings, seed=settings.seed + len(done)), startup_of))
    pending_numbers = {t.number for t in pending}
    for t in done:
        if t.state is optuna.trial.TrialState.COMPLETE and t.user_attrs.get(MEASURED_ATTR):
            view.add_trial(optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                     value=t.values[target], constraints=t.constraints))
        elif t.state is optuna.trial.TrialState.PRUNED:
            view.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params=t.params,
                                                     distributions=t.distributions))
    for t in done:
        if t.number in pending_numbers:  # a lie the constant liar tells: running, so counted as bad
            view.enqueue_trial(dict(t.params))
            view.ask()
    for _ in range(_DRAWS):
        params: Mapping[str, Any] = suggest(view.ask(), settings.space, speculates)
        if fresh(params):
            break
    else:
        params = fallback() or params
    study.enqueue_trial(dict(params))
    return study.ask()


_DRAWS = 8  # proposals a point's TPE may make before a fresh configuration is drawn at random


def choose_leaders(values: Mapping[str, Sequence[float]], n_points: int, speculates: Callable[[str], bool],
                   n: int) -> list[list[str]]:
    """Per workload point, the `n` best by their search value and the best configuration without speculation
    (the margin over no speculation is confirmed like the winner)."""
    out = []
    for i in range(n_points):
        ranked = sorted(values, key=lambda k: -values[k][i])
        base = next((k for k in ranked if not speculates(k)), None)
        out.append(list(dict.fromkeys([*ranked[:n], *([base] if base else [])])))
    return out
