"""The tune: validate the whole space, search it in rounds, confirm the leaders, record the answer.

    tune(request) -> TuneResult

1. **Every candidate checked first.** The conditioned space (space.py) times the workload (batch sizes x contexts)
   is composed and validated as a sweep would be, before Ray or MLflow start. A candidate the engine's rules refuse
   at any of its workload points is left out of the space (never tried); a value that no candidate can take, or a
   space with no valid candidate, refuses the tune with every problem named.
2. **The sentinel.** With real weights on a real engine, the oracle runs first at the smallest batch: a commit
   length below num_steps + 1 is a pipeline bug (diagnosis rule (a)) and ends the tune with that finding.
3. **The search.** Optuna asks `per_round` configurations at a time; a round is one sweep (rounds.py: one server
   per configuration, all its workload points on it). Proposals answered without a run: a refused candidate, a
   drafter setting that committed <= `no_gain_commit_len` at the smallest batch in an earlier trial (it pays at no
   batch size), a configuration already measured (its values told again). Until `trials` configurations are
   measured or the space is spent.
4. **The leaders.** Per workload point the `leaders` best by their search value, and the best no-speculation
   configuration, run again with `probe.repeats = repeats` prompts; robust.py picks the winner.
5. **The answer** (answer.py) on the tune's MLflow run and in the log: the table, the load curves, SGLang's
   adaptive config where it applies and the launch commands.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from orchestrator.config.jobs import build_settings, convert_and_validate
from orchestrator.config.config_error import ConfigError, Problem
from orchestrator.config.settings import ExecutionSettings
from orchestrator.tune import answer as answers
from orchestrator.tune.robust import Entry, pick
from orchestrator.tune.rounds import Record, TuneRun
from orchestrator.tune.settings import KEY_PREFIX, SamplerKind, TuneSettings, settings_problems
from orchestrator.tune.space import (DRAFTER, Candidate, candidate_overrides, enumerate_space,
                                     fmt_value, job_overrides, workload)
from orchestrator.tune.loop import Measured, choose_leaders, search_loop
from orchestrator.tune.study import open_study, storage_url
from specsweep_common.spec import Algorithm, RunState

if TYPE_CHECKING:

    from orchestrator.config.run_config import RunConfig

log = logging.getLogger(__name__)

OBJECTIVE = "throughput_tok_s"  # output tok/s of a run: all requests' completion tokens / wall time (workers.measurement)
Point = tuple[int, int]  # (context_len, batch size)


class PipelineBug(Exception):
    """The sentinel oracle committed less than num_steps + 1: the tune stops with the finding."""


@dataclass(frozen=True)
class TuneRequest:
    settings_values: Mapping[str, Any]  # the sweeper's composed `hydra.sweeper` section
    base_overrides: tuple[str, ...]  # every run's own overrides (the command line's, the tune file's)
    compose: Callable[[Sequence[Sequence[str]]], list[dict[str, Any]]]  # job overrides -> resolved configs
    cwd: str


@dataclass
class TuneResult:
    study: str
    rows: list[answers.AnswerRow] = field(default_factory=list)
    measured: int = 0  # configurations measured by the search
    runs: int = 0  # child runs the tune ran or read back (search + leaders)
    table: str = ""


@dataclass
class _Space:
    settings: TuneSettings
    candidates: dict[str, Candidate]  # valid ones, by key
    configs: dict[str, dict[Point, RunConfig]]  # candidate key -> its run at each workload point
    refused: dict[str, Problem]  # candidate key -> the first problem
    points: list[Point]
    algorithm: dict[str, str]  # candidate key -> its drafter's algorithm
    speculates: Callable[[Mapping[str, Any]], bool]
    base_drafter: str
    req: TuneRequest

    def leader_configs(self, pairs: Sequence[tuple[str, Point]]) -> list[RunConfig]:
        """The runs of (candidate, point) with `probe.repeats` prompts, composed and validated like the others (their
        recorded params say repeats=R)."""
        jobs = [job_overrides(self.candidates[k], p, self.req.base_overrides, repeats=self.settings.repeats)
                for k, p in pairs]
        return convert_and_validate(list(zip(self.req.compose(jobs), jobs)), sweep=True, cwd=self.req.cwd) if jobs \
            else []


def _check(req: TuneRequest) -> TuneSettings:
    from orchestrator.tune.settings import to_tune_settings

    if problems := settings_problems(req.settings_values):
        raise ConfigError(problems)
    return to_tune_settings(req.settings_values)


def _drafter_algorithms(req: TuneRequest, settings: TuneSettings) -> tuple[dict[str, str], str]:
    base = req.compose([list(req.base_overrides)])[0]
    names = [str(d) for d in settings.space.get(DRAFTER, ())]
    composed = req.compose([[*req.base_overrides, f"{DRAFTER}={d}"] for d in names]) if names else []
    algos = {d: str(c["drafter"]["algorithm"]) for d, c in zip(names, composed)}
    algos[str(base["drafter"]["name"])] = str(base["drafter"]["algorithm"])
    return algos, str(base["drafter"]["name"])


def build_space(req: TuneRequest, settings: TuneSettings) -> _Space:
    """Every candidate composed and validated at every workload point, before anything starts."""
    algos, base_drafter = _drafter_algorithms(req, settings)
    speculates = lambda params: algos.get(str(params.get(DRAFTER, base_drafter))) != Algorithm.NONE.value  # noqa: E731
    cands = enumerate_space(settings.space, speculates)
    if not any(not c.speculates for c in cands) and "none" not in algos:  # the baseline: no speculation
        algos["none"] = Algorithm.NONE.value
        first = {k: v[0] for k, v in settings.space.items() if not k.startswith(DRAFTER)}
        cands.append(Candidate(candidate_overrides({**first, DRAFTER: "none"}, False), False, (), extra=True))
    base = req.compose([list(req.base_overrides)])[0]
    points = workload(settings.batch_sizes, settings.context_lens, int(base["context_len"]))
    jobs = [job_overrides(c, p, req.base_overrides) for c in cands for p in points]
    composed = req.compose(jobs)
    space = _Space(settings, {}, {}, {}, points, {}, speculates, base_drafter, req)
    n = len(points)
    for i, c in enumerate(cands):
        mine = list(zip(composed[i * n:(i + 1) * n], jobs[i * n:(i + 1) * n]))
        try:
            configs = convert_and_validate(mine, sweep=True, cwd=req.cwd)
        except ConfigError as e:
            space.refused[c.key] = next(iter(e.problems))
            continue
        space.candidates[c.key] = c
        space.configs[c.key] = dict(zip(points, configs))
        space.algorithm[c.key] = algos.get(c.values.get(DRAFTER, base_drafter), "")
    _refuse_dead_values(space)
    log.info("tune space: %d candidate configuration(s) x %d workload point(s); %d refused by the validation "
             "(never tried)", len(space.candidates), n, len(space.refused))
    return space


def _refuse_dead_values(space: _Space) -> None:
    """A value no valid candidate takes is bad input, not a pruned combination: refuse the tune, naming it."""
    problems: list[Problem] = []
    valid = [c.values for c in space.candidates.values()]
    for key, values in space.settings.space.items():
        for v in values:
            if not any(c.get(key) == fmt_value(v) for c in valid):
                example = next((p for k, p in space.refused.items() if f"{key}={v}" in k.split()), None)
                if example is None and not key.startswith(DRAFTER + "."):
                    continue
                why = f"a value some candidate can run ({example})" if example else \
                    "a value some speculating drafter of the space can run"
                problems.append(Problem(f"{KEY_PREFIX}space.{key}", v, why))
    if not space.candidates:
        problems += list(space.refused.values())[:10]
    if problems:
        raise ConfigError(problems)


def study_name(settings: TuneSettings, sweep_name: str, space: _Space, base: Sequence[str]) -> str:
    blob = json.dumps([sorted(space.candidates), space.points, list(base), settings.sampler, settings.seed])
    return f"{settings.name or sweep_name}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def _measured(space: _Space, key: str, records: Mapping[str, Record]) -> Measured | None:
    """A candidate's tok/s at each workload point, its constraint (> 0: over a latency limit) and its commit length
    at the first point, from its FINISHED runs; None if any run is missing (FAILED)."""
    s, values, violation = space.settings, [], 0.0
    first: Record | None = None
    for p in space.points:
        rec = records.get(_run_hash(space, key, p))
        if rec is None or OBJECTIVE not in rec.metrics:
            return None
        first = first or rec
        values.append(float(rec.metrics[OBJECTIVE]))
        m = rec.metrics
        if s.max_ttft_s is not None and "ttft_s" in m:
            violation = max(violation, m["ttft_s"] / s.max_ttft_s - 1)
        if s.max_tpot_ms is not None and m.get("decode_tok_s"):
            violation = max(violation, 1000.0 / m["decode_tok_s"] / s.max_tpot_ms - 1)
    assert first is not None
    return Measured(tuple(values), violation, first.metrics.get("commit_len_mean"), first.run_id)


def _run_hash(space: _Space, key: str, point: Point) -> str:
    from orchestrator.config.plan import build_run

    return build_run(space.configs[key][point], 0).run_hash


def _sentinel(req: TuneRequest, space: _Space, run: TuneRun) -> None:
    from orchestrator.config.weights_scope import dummy_weights_reason
    from orchestrator.results.diagnosis import RunRow, find_oracle_shortfall

    first = next(iter(space.configs.values()))[space.points[0]]
    if first.engine.kind.simulated:
        log.info("sentinel not run: the stub engine's commits are simulated")
        return
    ctx, batch = space.points[0]
    jobs = [[*req.base_overrides, f"{DRAFTER}=oracle", f"context_len={ctx}", f"probe.concurrency={batch}"]]
    try:
        (oracle,) = convert_and_validate(list(zip(req.compose(jobs), jobs)), sweep=True, cwd=req.cwd)
    except ConfigError as e:
        log.info("sentinel not run: the oracle is refused here (%s)", e)
        return
    if why := dummy_weights_reason(dict(oracle.params)):
        log.info("sentinel not run: %s (random logits say nothing about the pipeline)", why)
        return
    (rec,) = run.run_round([oracle], "sentinel").values() or (None,)
    if rec is None:
        log.warning("sentinel: the oracle run did not finish; the search goes on unchecked")
        return
    row = RunRow(rec.run_id, "sentinel oracle", ctx, oracle.probe.kind.value, "oracle", oracle.attention.name,
                 oracle.page_size, is_oracle=True, num_steps=oracle.drafter.num_steps, metrics=dict(rec.metrics),
                 engine=oracle.engine.kind.value, concurrency=batch)
    findings, check = find_oracle_shortfall([row], oracle.report)
    log.info("sentinel: %s", check.detail)
    if findings:
        f = findings[0]
        run.log_answer({"finding.md": f"# {f.cause.value}\n\n{f.summary}\n\n" + "\n".join(f"- {e}" for e in f.evidence)},
                       {}, {"tune.stopped": f.cause.value})
        raise PipelineBug(f"{f.cause.value}: {f.summary} ({'; '.join(f.evidence)})")


def tune(req: TuneRequest) -> TuneResult:
    settings = _check(req)
    space = build_space(req, settings)
    some = next(iter(space.configs.values()))[space.points[0]]
    exec_settings = build_settings(some, req.cwd)
    name = study_name(settings, some.sweep_name, space, req.base_overrides)
    from orchestrator.config.plan import plan_sweep
    from orchestrator.execution.preflight import PreflightError
    from orchestrator.execution.ray_connection import RayStartFailed, ray_connection
    from orchestrator.session.sweep import ClusterCannotFit, RayDidNotStart, preflight_before_start

    every = plan_sweep(some.sweep_name, [cfg for by_point in space.configs.values() for cfg in by_point.values()])
    preflight_before_start(every, exec_settings, dry_run=False)  # the whole space, before anything starts
    try:  # one Ray for every round (each round's sweep reuses it), placement checked for every candidate's server
        with ray_connection(exec_settings.cluster, every.groups):
            return _tune_in_ray(req, space, settings, exec_settings, name, some)
    except PreflightError as e:
        raise ClusterCannotFit(str(e)) from None
    except RayStartFailed as e:
        raise RayDidNotStart(str(e)) from None


def _tune_in_ray(req: TuneRequest, space: _Space, settings: TuneSettings, exec_settings: ExecutionSettings,
                 name: str, some: RunConfig) -> TuneResult:
    from orchestrator.config.plan import plan_sweep

    storage = storage_url(settings, exec_settings.tracking_uri, req.cwd)
    log.info("tune: study %r in %s", name, storage)
    run = TuneRun(exec_settings, plan_sweep(some.sweep_name, [some]), name,
                  params={"tune.study": name, "tune.storage": storage, "tune.space": json.dumps(
                      {k: list(v) for k, v in settings.space.items()}), "tune.points": json.dumps(space.points)})
    state = RunState.FAILED
    try:
        if settings.sentinel:
            _sentinel(req, space, run)
        result = _search_and_answer(space, run, name, storage)
        state = RunState.FINISHED
        return result
    except KeyboardInterrupt:
        state = RunState.KILLED
        raise
    finally:
        run.end(state)


def _search_and_answer(space: _Space, run: TuneRun, name: str, storage: str) -> TuneResult:
    s = space.settings
    grid = [dict(c.params) for c in space.candidates.values()] if s.sampler_kind is SamplerKind.GRID else ()
    study = open_study(s, name, len(space.points), storage, len(space.candidates), grid)
    result = TuneResult(name)

    def measure(keys: list[str], round_no: int) -> dict[str, Measured | None]:
        configs = [space.configs[k][p] for k in keys for p in space.points]
        records = run.run_round(configs, f"search {round_no}")
        return {k: _measured(space, k, records) for k in keys}

    searched = {k: c for k, c in space.candidates.items() if not c.extra}
    values = search_loop(study, s, searched, space.refused, space.speculates, measure, space.points[0][1])
    for key in set(space.candidates) - set(searched):  # the baseline the space lacks: measured beside the search
        got = measure([key], 0)[key]
        if got is not None:
            values[key] = got.values
    result.measured = len(values)
    log.info("tune search: %d configuration(s) measured of %d valid (%d child runs)", len(values),
             len(space.candidates), len(values) * len(space.points))
    return _confirm_and_answer(space, run, result, values)


def _confirm_and_answer(space: _Space, run: TuneRun, result: TuneResult,
                        values: Mapping[str, Sequence[float]]) -> TuneResult:
    s = space.settings
    chosen = choose_leaders(values, len(space.points), lambda k: space.candidates[k].speculates, s.leaders)
    leaders: dict[Point, list[str]] = dict(zip(space.points, chosen))
    pairs = [(k, p) for p, ks in leaders.items() for k in ks]
    configs = space.leader_configs(pairs)
    records = run.run_round(configs, "leaders") if configs else {}
    from orchestrator.config.plan import build_run

    hashes = {pair: build_run(rc, 0).run_hash for pair, rc in zip(pairs, configs)}
    rows = []
    for p, ks in leaders.items():
        entries = []
        for k in ks:
            rec = records.get(hashes[(k, p)])
            vals = rec.repeats(OBJECTIVE) if rec else []
            if len(vals) >= 3 and all(math.isfinite(v) for v in vals):
                c = space.candidates[k]
                entries.append(Entry(k, c.label if c.speculates else "", c.draft_tokens, tuple(vals)))
        if entries:
            rows.append(answers.AnswerRow(p[0], p[1], pick(entries, s.tie_frac), space.algorithm,
                                          {k: space.candidates[k].values for k in ks}))
    result.rows = rows
    result.runs = len(values) * len(space.points) + len(configs)
    _record(space, run, result, values, _measurements(space, run, values))
    return result


def _measurements(space: _Space, run: TuneRun, values: Mapping[str, Sequence[float]]) -> dict[str, dict[str, Any]]:
    """Every measured configuration's search runs, read back: per workload point the run id, tok/s over its repeats
    and the commit length (`measurements.json`, what tools/bench_tune.py replays)."""
    hashes = {(k, p): _run_hash(space, k, p) for k in values for p in space.points}
    records = run.records(list(hashes.values()))
    out: dict[str, dict[str, Any]] = {}
    for (k, p), h in hashes.items():
        rec = records.get(h)
        if rec is not None:
            out.setdefault(k, {"speculates": space.candidates[k].speculates,
                               "draft_tokens": space.candidates[k].draft_tokens,
                               "label": space.candidates[k].label})[f"{p[0]}x{p[1]}"] = {
                "run_id": rec.run_id, OBJECTIVE: rec.repeats(OBJECTIVE),
                "commit_len_mean": rec.metrics.get("commit_len_mean")}
    return out


def _record(space: _Space, run: TuneRun, result: TuneResult, values: Mapping[str, Sequence[float]],
            measurements: Mapping[str, Any]) -> None:
    table = answers.answer_markdown(result.rows)
    result.table = table
    model = next(iter(space.configs.values()))[space.points[0]].model.path
    cfg, why = answers.adaptive_config(result.rows)
    files = {"answer.md": f"# Tune {result.study}\n\n{table}\n", "answer.csv": answers.answer_csv(result.rows),
             "launch.sh": answers.launch_commands(result.rows, model),
             "measurements.json": json.dumps({"points": [f"{c}x{b}" for c, b in space.points],
                                              "configurations": measurements}, indent=1),
             "refused.json": json.dumps({k: str(p) for k, p in space.refused.items()}, indent=1)}
    if cfg is not None:
        files["sglang_adaptive_config.json"] = json.dumps(cfg, indent=2) + "\n"
    files["answer.md"] += f"\nSGLang --speculative-adaptive-config: {'written' if cfg else 'not written'} ({why}).\n"
    metrics = {"tune.measured": float(result.measured), "tune.runs": float(result.runs),
               "tune.space": float(len(space.candidates))}
    for r in result.rows:
        tag = f"ctx{r.context_len}.bs{r.batch}"
        metrics[f"winner_tok_s.{tag}"] = r.pick.winner.score
        if r.pick.over_baseline:
            metrics[f"over_baseline.{tag}"] = r.pick.over_baseline.rel
    run.log_answer(files, metrics, {"tune.answer": table})
    for ctx in dict.fromkeys(p[0] for p in space.points):
        idx = [i for i, p in enumerate(space.points) if p[0] == ctx]
        shown = {k for r in result.rows if r.context_len == ctx for k in (e.key for e in r.pick.ranked)}
        series = {space.candidates[k].label: {space.points[i][1]: values[k][i] for i in idx}
                  for k in shown if k in values}
        if series:
            run.log_figure(answers.load_curves(series, ctx), f"load_curves_ctx{ctx}.png")
    log.info("tune %s: the answer per batch size (%d configuration(s) measured of %d, %d runs)\n%s\n%s",
             result.study, result.measured, len(space.candidates), result.runs, table,
             f"SGLang adaptive config: {why}" + (f"\n{json.dumps(cfg)}" if cfg else ""))
