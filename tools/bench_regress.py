"""`make bench-regress`: does the regression check (orchestrator/results/regress) stay quiet on identical sweeps and
flag a real change on exactly the points it touches?

    python -m tools.bench_regress [--sweeps 10] [--gen-tokens 32]

Each "sweep" here is a parent run with one child per grid point in a fresh SQLite MLflow store, recorded by the real
`Tracker` from real probes (`workers.probe.run_probe`) of real stub-engine processes (workers/stub/server.py; its noise
is the machine's: sleep granularity, HTTP, the other processes), then judged by the report's own
`changes_section`. The grid: drafter ngram | oracle (one stub server each) x context 64 | 256 x probe predictable |
novel = 8 points.

1. False alarms: `--sweeps` identical sweeps in a row; every point and metric judged against the history so far.
2. Detection: one more sweep whose ngram server's stub runs with a slower token time than its RunSpec says (a change
   that is not part of the grid point): flagged must be exactly the 4 ngram points.
3. The reference engine on the real model (SmolLM2-135M, `--reference N`): N identical sweeps of ngram | oracle x
   predictable | novel at one context, then one with `SPECSWEEP_BENCH_NGRAM_MAX_STEPS=1` in the engine's
   environment (workers/reference/speculative.py: a worse n-gram matcher that no flag or grid point shows).
4. Smallest throughput drop detected on exactly the affected points, at N = 1, 3 and 5 repeats per point (N probes
   of the same kind with different seeds; the values go to the `<metric>.repeats` tag, as `probe.repeats` records
   them), against 5 baseline sweeps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.config.plan import Plan
from orchestrator.results.regress.compare import Comparison
from orchestrator.results.regress.section import changes_section
from orchestrator.results.tracking import Tracker
from specsweep_vocab.spec import (EngineKind, ProbeKind, ProbeSpec, RunResult, RunSpec, RunState, ServerGroup,
                                  stable_hash)
from tools.testing import stub_server
from workers.engine import EngineProcess
from workers.probe import run_probe

log = logging.getLogger("bench_regress")

TOKEN_S = 0.004
DROPS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.08, 0.12, 0.2, 0.3)
NOISY = ("decode_tok_s", "throughput_tok_s", "verify_step_ms")


def grid(gen_tokens: int) -> tuple[ServerGroup, ...]:
    groups = []
    job = 0
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


def _stub_argv(group: ServerGroup, slow: float):
    s = group.server
    token_s = TOKEN_S * slow  # the change under test: not in the RunSpec, so not in run_hash or point_key

    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", "workers.stub.server", "--port", str(port), "--stub-token-s", repr(token_s),
                "--stub-startup-s", "0.1", "--speculative-algorithm", s.drafter.algorithm.value.upper(),
                "--speculative-num-steps", str(s.drafter.num_steps)]
    return argv


def sweep(tracker: Tracker, groups: tuple[ServerGroup, ...], work: Path, *, repeats: int = 1,
          slow: dict[str, float] | None = None, regress: dict | None = None) -> tuple[str, Comparison | None]:
    plan = Plan(sweep_name=tracker.experiment, groups=groups, base_config={"regress": regress or {}})
    parent = tracker.begin_parent(plan, work_dir=work)
    for g in groups:
        factor = (slow or {}).get(g.server.drafter.name, 1.0)
        with EngineProcess(_stub_argv(g, factor), work / f"{g.server.key}.log", startup_timeout_s=60) as engine:
            url = f"http://127.0.0.1:{engine.port}"
            for spec in g.runs:
                t0 = time.time()
                values: dict[str, list[float]] = {}
                for r in range(repeats):
                    m = run_probe(url, dataclasses.replace(spec.probe, seed=r), EngineKind.STUB, expect_spec=True)
                    for k, v in m.metrics.items():
                        values.setdefault(k, []).append(v)
                tags = {f"{k}.repeats": json.dumps(vs) for k, vs in values.items() if repeats > 1 and k in NOISY}
                tracker.log_result(RunResult(run=spec, state=RunState.FINISHED, tags=tags, started_at=t0,
                                             ended_at=time.time(),
                                             metrics={k: statistics.fmean(vs) for k, vs in values.items()}))
    changes = changes_section(tracker.client, parent, work)
    tracker.end_parent(RunState.FINISHED)
    return parent, changes.comparison


def reference_sweep(tracker: Tracker, plan: Plan, work: Path, env: dict[str, str] | None = None
                    ) -> Comparison | None:
    parent = tracker.begin_parent(plan, work_dir=work)
    for g in plan.groups:
        with EngineProcess.for_server(g.server, work / f"ref-{g.server.key}.log", env=env or {}) as engine:
            url = f"http://127.0.0.1:{engine.port}"
            for spec in g.runs:
                t0 = time.time()
                m = run_probe(url, spec.probe, EngineKind.REFERENCE, expect_spec=True,
                              timeout_s=g.server.engine.request_timeout_s, model_path=g.server.model.path)
                tracker.log_result(RunResult(run=spec, state=RunState.FINISHED, metrics=m.metrics, started_at=t0,
                                             ended_at=time.time()))
    changes = changes_section(tracker.client, parent, work)
    tracker.end_parent(RunState.FINISHED)
    return changes.comparison


def reference_rows(uri: str, work: Path, sweeps: int) -> list[tuple[str, str, str]]:
    from orchestrator.config.jobs import expand_grid, plan_jobs
    from workers.reference.speculative import ENV_WORSE_NGRAM

    plan, _ = plan_jobs(expand_grid({"drafter": ["ngram", "oracle"], "probe": ["predictable", "novel"]},
                                    "context_len=512", "gen_tokens=32", "sweep_name=bench-ref"), cwd=str(work))
    tracker = Tracker(uri, "bench-ref")
    alarms, judged = [], 0
    for i in range(sweeps):
        c = reference_sweep(tracker, plan, work)
        alarms += [(i + 1, *f) for f in sorted(flagged(c))]
        judged += sum(1 for p in (c.points if c else ()) for v in p.verdicts if v.n_baseline > 0)
    c = reference_sweep(tracker, plan, work, env={ENV_WORSE_NGRAM: "1"})
    hit = sorted(flagged(c, ("commit_len_mean",)))
    notes = "; ".join(c.patterns + c.notes) if c else ""
    return [("false alarms: reference engine, SmolLM2-135M, identical sweeps", f"{sweeps} sweeps x 4 points",
             f"{len(alarms)} flagged of {judged} verdicts" + (f": {alarms[:4]}" if alarms else "")),
            ("detection: reference ngram matcher capped at 1 token (env, not in the point)",
             "expected: commit_len_mean on the ngram points whose commit was above 2",
             f"commit_len_mean flagged on {[n for n, _ in hit]}; {notes}")]


def flagged(c: Comparison | None, metrics=None) -> set[tuple[str, str]]:
    """(point name, metric) flagged (either direction)."""
    if c is None:
        return set()
    return {(p.run.name, v.metric) for p in c.points for v in p.flagged if metrics is None or v.metric in metrics}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--repeats", default="1,3,5", help="repeats to find the smallest drop at ('': skip)")
    ap.add_argument("--reference", type=int, default=0, help="identical reference-engine sweeps (0: skip)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    groups = grid(args.gen_tokens)
    ngram = {r.name for r in groups[0].runs}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-regress-") as tmp:
        work = Path(tmp)
        uri = f"sqlite:///{work}/mlflow.db"
        t0 = time.perf_counter()
        tracker = Tracker(uri, "bench-identical")
        alarms, judged = [], 0
        for i in range(args.sweeps):
            _, c = sweep(tracker, groups, work)
            alarms += [(i + 1, *f) for f in sorted(flagged(c))]
            judged += sum(1 for p in (c.points if c else ()) for v in p.verdicts if v.n_baseline > 0)
        rows.append(("false alarms: stub, identical sweeps", f"{args.sweeps} sweeps x 8 points",
                     f"{len(alarms)} flagged of {judged} verdicts" + (f": {alarms[:4]}" if alarms else "")))
        _, c = sweep(tracker, groups, work, slow={"ngram": 1.3})
        hit = {n for n, m in flagged(c, NOISY)}
        exact = flagged(c) - {(n, m) for n, m in flagged(c) if m in NOISY}
        rows.append(("detection: ngram stub token time x1.3 (not in the point)",
                     "expected: the 4 ngram points",
                     f"flagged {len(hit & ngram)}/4 ngram points, {len(hit - ngram)} other points, "
                     f"{len(exact)} exact-metric flags; regression tag: {c.tag() if c else '?'}"))
        log.warning("false alarms and detection took %.0f s", time.perf_counter() - t0)
        if args.reference:
            t1 = time.perf_counter()
            rows += reference_rows(uri, work, args.reference)
            log.warning("reference engine took %.0f s", time.perf_counter() - t1)
        for n in (int(x) for x in args.repeats.split(",") if x):
            for min_rel in (0.03, 0.0):  # the default floor, and none: what the noise alone allows
                t1 = time.perf_counter()
                tr = Tracker(uri, f"bench-repeats-{n}-{min_rel}")
                regress = {"min_rel_change": min_rel}
                for _ in range(5):
                    sweep(tr, groups, work, repeats=n, regress=regress)
                smallest = None
                for drop in DROPS:
                    parent, c = sweep(tr, groups, work, repeats=n, slow={"ngram": 1 / (1 - drop)}, regress=regress)
                    hit = {name for name, m in flagged(c, ("decode_tok_s",))}
                    tr.client.delete_run(parent)  # out of the next one's history
                    for p in (c.points if c else ()):
                        tr.client.delete_run(p.run.run_id)
                    if hit == ngram:
                        smallest = drop
                        break
                rows.append((f"smallest decode_tok_s drop detected, N={n} repeats, min_rel_change={min_rel:g}",
                             "on exactly the 4 ngram points, 5 baseline sweeps",
                             f"{smallest:.1%}" if smallest is not None else f"none up to {DROPS[-1]:.0%}"))
                log.warning("N=%d min_rel_change=%g took %.0f s", n, min_rel, time.perf_counter() - t1)
    print(f"bench-regress {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
          f"({platform.machine()}, {platform.processor() or 'cpu'}), stub token time {TOKEN_S * 1000:.0f} ms, "
          f"{args.gen_tokens} tokens per probe")
    print("| check | setup | result |\n|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
