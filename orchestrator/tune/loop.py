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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from orchestrator.tune.settings import TuneSettings
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
                first_batch: int = 1) -> dict[str, tuple[float, ...]]:
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
    asks_left = 20 * (budget + s.per_round)  # proposals answered without a run never loop forever
    round_no = max((t.user_attrs.get("round", 0) for t in measured_trials(study)), default=0)
    while len(values) < budget and asks_left > 0:
        batch: dict[str, optuna.trial.Trial] = {}
        while len(batch) < min(s.per_round, budget - len(values)) and asks_left > 0:
            asks_left -= 1
            trial = study.ask()
            params = suggest(trial, s.space, speculates)
            key = " ".join(candidate_overrides(params, speculates(params)))
            trial.set_user_attr(CANDIDATE_ATTR, key)
            if key in values:
                trial.set_user_attr(MEASURED_ATTR, False)
                study.tell(trial, list(values[key]))
                continue
            why = (refused.get(key) or ("asked twice in one round" if key in batch else None)
                   or ("not in the space" if key not in candidates else None)
                   or no_gain.get(drafter_key(candidates[key])))
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
