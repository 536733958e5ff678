"""`make bench-regress`: does the regression check (orchestrator/results/regress) stay quiet on identical sweeps and
flag a real change on exactly the points it touches?

    python -m tools.bench_regress [--sweeps 10] [--reference 10] [--repeats 1,3,5] [--lock FILE]

Every sweep is a parent run with one child per grid point in a fresh SQLite MLflow store: each point run by the real
`workers.runners.GroupRunner` (engine process, probe.repeats prompts, /metrics counters, derived figures) and
recorded by the real `Tracker`, then judged by the report's own `changes_section`. `--lock FILE`: the sweeps run under an
flock on FILE, given back between sweeps every `--hold-s` seconds, so other jobs on a shared machine interleave.

1. Stub engine (workers/stub/server.py; its noise is the machine's: sleep granularity, HTTP, other processes),
   drafter ngram | oracle (one server each) x context 64 | 256 x probe predictable | novel = 8 points:
   `--sweeps` identical sweeps, every point and metric judged against the history so far (false alarms); then one
   sweep whose ngram server runs x1.3 slower (`SPECSWEEP_BENCH_STUB_SLOWDOWN`, a change no flag, config or grid
   point shows): flagged must be exactly the 4 ngram points.
2. Reference engine on the real model (SmolLM2-135M, the default `model`), ngram | oracle x predictable | novel at
   one context: `--reference` identical sweeps, then one with `SPECSWEEP_BENCH_NGRAM_MAX_STEPS=1` in the ngram
   engine's environment (workers/reference/speculative.py: a worse n-gram matcher no flag or grid point shows).
3. The smallest decode_tok_s drop detected on exactly the 4 stub ngram points, at probe.repeats N = 1, 3 and 5 (N
   prompts a point, each a different text of its kind: workers/prompts.py), with 5, 2 and 1 baseline sweeps (with 1
   there is no spread between sweeps: the noisy metrics are not judged), at the default 3 % `min_rel_change` and at
   0 (what the noise alone allows).

`--rejudge DB` judges a kept store's identical reference sweeps again (`--store DB` keeps one): flagged, not judged,
unconfirmed excursions and the largest |z| / limit, at several max_z.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import IO
from pathlib import Path

from orchestrator.config.plan import Plan
from orchestrator.config.settings import RegressSettings
from orchestrator.results.metric_catalogue import NOISY_WATCHED
from orchestrator.results.regress.baseline_compare import Comparison, compare
from orchestrator.results.regress.history import load_history, select_baseline
from orchestrator.results.regress.section import changes_section
from orchestrator.results.regress.verdict import EXCURSION, NO_SPREAD
from orchestrator.results.tracking import Tracker
from specsweep_common.spec import ProbeKind, ProbeSpec, RunSpec, RunState, ServerGroup, stable_hash
from tools.testing import stub_server
from workers.reference.speculative import ENV_WORSE_NGRAM
from workers.runners import GroupRunner
from workers.stub.server import ENV_BENCH_SLOWDOWN

log = logging.getLogger("bench_regress")

TOKEN_S = 0.004
DROPS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.08, 0.12, 0.2, 0.3)
NOISY = tuple(NOISY_WATCHED)  # decode_tok_s, throughput_tok_s, verify_step_ms
Env = dict[str, dict[str, str]]  # drafter name -> extra environment of its engine


def with_repeats(groups: tuple[ServerGroup, ...], repeats: int) -> tuple[ServerGroup, ...]:
    """The same grid with probe.repeats=`repeats` (another point_key when not 1, as in a real sweep)."""
    out = []
    for g in groups:
        runs = []
        for spec in g.runs:
            probe = dataclasses.replace(spec.probe, repeats=repeats)
            params = tuple(p for p in spec.params if p[0] != "probe.repeats") + (("probe.repeats", str(repeats)),)
            runs.append(dataclasses.replace(spec, probe=probe, run_hash=stable_hash(g.server, probe), params=params))
        out.append(ServerGroup(g.server, tuple(runs)))
    return tuple(out)


def stub_grid(gen_tokens: int) -> tuple[ServerGroup, ...]:
    groups, job = [], 0
    for drafter in ("ngram", "oracle"):
        server = stub_server(drafter=drafter, token_s=TOKEN_S, startup_s=0.1)
        runs = []
        for ctx in (64, 256):
            for kind in (ProbeKind.PREDICTABLE, ProbeKind.NOVEL):
                probe = ProbeSpec(kind=kind, context_len=ctx, gen_tokens=gen_tokens)
                params = (("context_len", str(ctx)), ("probe.kind", kind.value), ("drafter.name", drafter),
                          ("drafter.is_oracle", str(server.drafter.is_oracle)), ("attention.name", "torch"),
                          ("page_size", "16"))
                runs.append(RunSpec(job_index=job, server=server, probe=probe, run_hash=stable_hash(server, probe),
                                    name=f"ctx={ctx} probe={kind.value} drafter={drafter}", params=params))
                job += 1
        groups.append(ServerGroup(server, tuple(runs)))
    return tuple(groups)


def reference_grid(work: Path) -> tuple[ServerGroup, ...]:
    from orchestrator.config.jobs import expand_grid, plan_jobs

    plan, _ = plan_jobs(expand_grid({"drafter": ["ngram", "oracle"], "probe": ["predictable", "novel"]},
                                    "context_len=512", "gen_tokens=32", "sweep_name=bench-ref"), cwd=str(work))
    return plan.groups


class PieceLock:
    """An flock on a file, held in pieces: taken before a sweep, given back after the first sweep that ends more than
    `hold_s` after it was taken, so other jobs on a shared machine interleave (a lock queue costs minutes per
    acquisition there: a stub sweep of 3 s each behind its own acquisition would take hours). No file: no lock."""

    def __init__(self, path: str | None, hold_s: float):
        self.path, self.hold_s = path, hold_s
        self.f: IO[str] | None = None
        self.since = 0.0
        self.waited = 0.0

    @contextlib.contextmanager
    def sweep(self) -> Iterator[None]:
        if self.path is not None and self.f is None:
            t0 = time.monotonic()
            self.f = open(self.path, "a")
            fcntl.flock(self.f, fcntl.LOCK_EX)
            self.since = time.monotonic()
            self.waited += self.since - t0
        try:
            yield
        finally:
            if self.f is not None and time.monotonic() - self.since > self.hold_s:
                self.release()

    def release(self) -> None:
        if self.f is not None:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()
            self.f = None


@contextlib.contextmanager
def environment(extra: dict[str, str]) -> Iterator[None]:
    """`extra` in os.environ while an engine starts (EngineProcess passes the environment on), then as before."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sweep(tracker: Tracker, groups: tuple[ServerGroup, ...], work: Path, *, env: Env | None = None,
          regress: dict | None = None, lock: PieceLock | None = None) -> tuple[str, Comparison | None]:
    """One sweep of `groups`, each point by a real GroupRunner; `env`: the engine environment per drafter."""
    with (lock or PieceLock(None, 0.0)).sweep():
        plan = Plan(sweep_name=tracker.experiment, groups=groups, base_config={"regress": regress or {}})
        parent = tracker.begin_parent(plan, work_dir=work)
        for g in groups:
            with environment((env or {}).get(g.server.drafter.name, {})):
                runner = GroupRunner(g.server, work)
                runner.start()
            try:
                for spec in g.runs:
                    result = runner.run(spec)
                    if result.state is not RunState.FINISHED:
                        raise RuntimeError(f"{spec.name}: {result.state.value} {result.message}")
                    tracker.log_result(result)
            finally:
                runner.stop()
        changes = changes_section(tracker.client, parent, work)
        tracker.end_parent(RunState.FINISHED)
    return parent, changes.comparison


def flagged(c: Comparison | None, metrics=None) -> set[tuple[str, str]]:
    """(point name, metric) flagged (either direction)."""
    if c is None:
        return set()
    return {(p.run.name, v.metric) for p in c.points for v in p.flagged if metrics is None or v.metric in metrics}


def identical(tracker: Tracker, groups, work: Path, n: int, lock: PieceLock) -> tuple[list, int, int, list]:
    alarms, judged, unjudged, excursions = [], 0, 0, []
    for i in range(n):
        _, c = sweep(tracker, groups, work, lock=lock)
        alarms += [(i + 1, *f) for f in sorted(flagged(c))]
        judged += sum(1 for p in (c.points if c else ()) for v in p.verdicts if v.n_baseline > 0)
        unjudged += sum(1 for p in (c.points if c else ()) for v in p.verdicts if v.status == NO_SPREAD)
        excursions += [(i + 1, p.run.name, v.metric, f"{v.rel_change:+.1%}") for p in (c.points if c else ())
                       for v in p.verdicts if v.status == EXCURSION]
        log.warning("%s sweep %d/%d: %d flagged so far", tracker.experiment, i + 1, n, len(alarms))
    return alarms, judged, unjudged, excursions


def rejudge(client, experiment: str, settings: RegressSettings,
            last: int | None = None) -> tuple[list, int, int, list, float]:
    """The experiment's sweeps judged again, each against the ones before it, with `settings` (no new sweep: what
    another min_rel_change or max_z would have said of the same measurements). `last`: leave out the last sweeps
    from this index on (a detection sweep). Also the closest call: the largest |z| / limit of a noisy verdict."""
    history = load_history(client, client.get_experiment_by_name(experiment).experiment_id)
    alarms, judged, unjudged, excursions, closest = [], 0, 0, [], 0.0
    for i, parent in enumerate(history.parents[:last]):
        c = compare(history, parent.run_id, select_baseline(client, history, parent.run_id, settings), settings)
        alarms += [(i + 1, *f) for f in sorted(flagged(c))]
        judged += sum(1 for p in c.points for v in p.verdicts if v.n_baseline > 0)
        unjudged += sum(1 for p in c.points for v in p.verdicts if v.status == NO_SPREAD)
        excursions += [(i + 1, p.run.name, v.metric, f"{v.rel_change:+.1%}") for p in c.points for v in p.verdicts
                       if v.status == EXCURSION]
        closest = max([closest] + [abs(v.z) / v.limit for p in c.points for v in p.verdicts
                                   if v.z is not None and v.limit])
    return alarms, judged, unjudged, excursions, closest


def rejudge_rows(client, experiment: str, what: str, last: int | None) -> list[tuple[str, str, str]]:
    rows = []
    for min_rel, max_z in ((0.03, 3.0), (0.03, 3.5), (0.03, 4.0), (0.1, 4.0)):
        alarms, judged, unjudged, excursions, closest = rejudge(
            client, experiment, RegressSettings(min_rel_change=min_rel, max_z=max_z), last)
        rows.append((f"false alarms: {what}, the same sweeps re-judged", f"min_rel_change={min_rel:g}, "
                     f"max_z={max_z:g}", alarm_text(alarms, judged, unjudged, excursions) + f"; largest |z|/limit "
                     f"{closest:.2f}"))
    return rows


def alarm_text(alarms: list, judged: int, unjudged: int = 0, excursions: list | None = None) -> str:
    return (f"{len(alarms)} flagged of {judged} verdicts" + (f" ({unjudged} noisy ones not judged: no spread between "
            "sweeps yet)" if unjudged else "") + (f": {alarms[:4]}" if alarms else "")
            + (f"; {len(excursions)} unconfirmed excursion(s), not flagged: {excursions[:4]}" if excursions else ""))


def detection_text(c: Comparison | None, expected: set[str]) -> str:
    points = {n for n, _ in flagged(c)}
    by_point = {}
    for p in (c.points if c else ()):
        vs = [f"{v.metric} {v.change_text()}" for v in p.flagged]
        if vs:
            by_point[p.run.name] = ", ".join(vs)
    verdict = "exactly the expected points" if points == expected else \
        f"MISSED {sorted(expected - points)}, EXTRA {sorted(points - expected)}"
    return (f"flagged {len(points & expected)}/{len(expected)} expected points, {len(points - expected)} other "
            f"points ({verdict}); " + "; ".join(f"{k}: {v}" for k, v in sorted(by_point.items())))


def stub_rows(uri: str, work: Path, sweeps: int, gen_tokens: int, lock: PieceLock) -> list[tuple[str, str, str]]:
    groups = stub_grid(gen_tokens)
    ngram = {r.name for r in groups[0].runs}
    tracker = Tracker(uri, "bench-identical")
    alarms, judged, unjudged, excursions = identical(tracker, groups, work, sweeps, lock)
    _, c = sweep(tracker, groups, work, env={"ngram": {ENV_BENCH_SLOWDOWN: "1.3"}}, lock=lock)
    return [("false alarms: stub, identical sweeps", f"{sweeps} sweeps x 8 points",
             alarm_text(alarms, judged, unjudged, excursions)),
            ("detection: ngram stub token time x1.3 (env, not in the point)", "expected: the 4 ngram points",
             detection_text(c, ngram) + f"; regression tag: {c.tag() if c else '?'}")]


def reference_rows(uri: str, work: Path, sweeps: int, lock: PieceLock) -> list[tuple[str, str, str]]:
    groups = reference_grid(work)
    ngram = {r.name for g in groups for r in g.runs if g.server.drafter.name == "ngram"}
    tracker = Tracker(uri, "bench-ref")
    alarms, judged, unjudged, excursions = identical(tracker, groups, work, sweeps, lock)
    _, c = sweep(tracker, groups, work, env={"ngram": {ENV_WORSE_NGRAM: "1"}}, lock=lock)
    return [("false alarms: reference engine, SmolLM2-135M, identical sweeps",
             f"{sweeps} sweeps x 4 points (ctx 512, 32 tokens)", alarm_text(alarms, judged, unjudged, excursions)),
            ("detection: reference ngram matcher capped at 1 draft token (env, not in the point)",
             "expected: the 2 ngram points", detection_text(c, ngram) + f"; regression tag: {c.tag() if c else '?'}"),
            *rejudge_rows(tracker.client, tracker.experiment, "reference engine", last=sweeps)]


def smallest_drop(uri: str, work: Path, gen_tokens: int, repeats: int, history: int, min_rel: float,
                  lock: PieceLock) -> str:
    """The smallest ngram slowdown whose decode_tok_s drop is flagged on exactly the 4 ngram points."""
    groups = with_repeats(stub_grid(gen_tokens), repeats)
    ngram = {r.name for r in groups[0].runs}
    tr = Tracker(uri, f"bench-drop-n{repeats}-h{history}-m{min_rel:g}")
    regress = {"min_rel_change": min_rel}
    for _ in range(history):
        sweep(tr, groups, work, regress=regress, lock=lock)
    for drop in DROPS:
        parent, c = sweep(tr, groups, work, env={"ngram": {ENV_BENCH_SLOWDOWN: repr(1 / (1 - drop))}},
                          regress=regress, lock=lock)
        hit = {name for name, _ in flagged(c, ("decode_tok_s",))}
        tr.client.delete_run(parent)  # out of the next one's history
        for p in (c.points if c else ()):
            tr.client.delete_run(p.run.run_id)
        if hit == ngram:
            return f"{drop:.1%}"
        log.warning("N=%d history=%d min_rel=%g: %.1f%% not detected exactly (flagged %d points, %d ngram)",
                    repeats, history, min_rel, 100 * drop, len(hit), len(hit & ngram))
    return f"none up to {DROPS[-1]:.0%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=10, help="identical stub sweeps (0: skip the stub rows)")
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--repeats", default="1,3,5", help="probe.repeats to find the smallest drop at ('': skip)")
    ap.add_argument("--histories", default="5,2,1", help="baseline sweeps for the smallest drop")
    ap.add_argument("--reference", type=int, default=0, help="identical reference-engine sweeps (0: skip)")
    ap.add_argument("--lock", default=None, help="flock this file around the sweeps, in pieces (a shared machine)")
    ap.add_argument("--hold-s", type=float, default=60.0, help="give the lock back after a sweep past this long")
    ap.add_argument("--store", default=None, metavar="DB",
                    help="record in this sqlite file (kept; --rejudge it later) instead of a temporary one")
    ap.add_argument("--rejudge", default=None, metavar="DB",
                    help="only re-judge the identical reference sweeps of a saved store (sqlite file)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.rejudge:
        tracker = Tracker(f"sqlite:///{args.rejudge}", "bench-ref")
        for r in rejudge_rows(tracker.client, "bench-ref", "reference engine", last=args.reference or None):
            print("| " + " | ".join(r) + " |")
        return 0
    rows = []
    lock = PieceLock(args.lock, args.hold_s)
    with tempfile.TemporaryDirectory(prefix="bench-regress-") as tmp:
        work = Path(tmp)
        uri = f"sqlite:///{os.path.abspath(args.store) if args.store else work / 'mlflow.db'}"
        if args.sweeps:
            t0 = time.perf_counter()
            rows += stub_rows(uri, work, args.sweeps, args.gen_tokens, lock)
            log.warning("stub false alarms and detection took %.0f s", time.perf_counter() - t0)
        if args.reference:
            t0 = time.perf_counter()
            rows += reference_rows(uri, work, args.reference, lock)
            log.warning("reference engine took %.0f s", time.perf_counter() - t0)
        for history in (int(h) for h in args.histories.split(",") if h):
            for min_rel in (0.03, 0.0):  # the default floor, and none: what the noise alone allows
                for n in (int(x) for x in args.repeats.split(",") if x):
                    t0 = time.perf_counter()
                    found = smallest_drop(uri, work, args.gen_tokens, n, history, min_rel, lock)
                    rows.append((f"smallest decode_tok_s drop detected, probe.repeats={n}, {history} baseline "
                                 f"sweep(s), min_rel_change={min_rel:g}", "on exactly the 4 stub ngram points", found))
                    log.warning("%s (%.0f s)", rows[-1], time.perf_counter() - t0)
    lock.release()
    log.warning("waited %.0f s for the lock in all", lock.waited)
    print(f"bench-regress {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
          f"({platform.machine()}, {os.cpu_count()} cpus), stub token time {TOKEN_S * 1000:.0f} ms, "
          f"{args.gen_tokens} tokens per probe")
    print("| check | setup | result |\n|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
