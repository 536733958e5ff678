"""`make bench-tune`: how many runs the tune needs to find the full grid's winner at each batch size.

1. The full grid, measured once on the reference engine: `specsweep +tune=bench hydra.sweeper.tune.sampler=grid` with
   `probe.repeats=3` (every configuration at every batch size, 3 prompts each), in `--work-dir`. Skipped when that
   directory already holds the grid's tune run (`--reuse`).
2. The grid's winner per batch size: `orchestrator.tune.robust.pick` over every configuration's 3 values.
3. The search, replayed on those measurements for each sampler (`--samplers`) and seed: the tune's own loop
   (`orchestrator.tune.loop.search_loop`) with an in-memory Optuna study and the budget a user would give it
   (`--budget` of the grid's runs, the leaders' runs included), where measuring a configuration draws one of its 3
   recorded values per batch size (seeded), so a replay sees the noise a real run would. The leaders are then judged
   on their recorded repeats, as the tune does. Past the budget the search goes on until every point's winner has
   been measured, to say when that happened.

Printed per sampler and batch size: the configurations measured until the grid's winner was first measured, and
until one that the grid's own repeats cannot separate from it was (median and worst of the seeds, and as a fraction
of the grid), and the search's pick at the budget: the grid's winner, one inseparable from it, or one separably
worse.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from orchestrator.results.store_layout import ROLE_TAG

log = logging.getLogger("bench_tune")
ROOT = Path(__file__).resolve().parents[1]


def run_grid(work_dir: Path, extra: list[str]) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "orchestrator", "+tune=bench", "hydra.sweeper.tune.sampler=grid",
           "hydra.sweeper.tune.trials=100000", "probe.repeats=3", "progress=false", *extra]
    log.info("the full grid: %s (in %s)", " ".join(cmd), work_dir)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, cwd=work_dir, env=env, check=True)


def load_grid(work_dir: Path) -> dict[str, Any]:
    import mlflow

    if not (work_dir / "mlflow.db").exists() and (work_dir / "measurements.json").exists():
        return json.loads((work_dir / "measurements.json").read_text())  # a grid kept without its store
    client = mlflow.MlflowClient(f"sqlite:///{work_dir.resolve()}/mlflow.db")
    exp = client.get_experiment_by_name("tune-bench")
    if exp is None:
        raise SystemExit(f"no tune-bench experiment in {work_dir}/mlflow.db: run without --reuse first")
    runs = client.search_runs([exp.experiment_id], f"tags.`{ROLE_TAG}` = 'tune'", order_by=["start_time DESC"])
    path = client.download_artifacts(runs[0].info.run_id, "tune/measurements.json", str(work_dir))
    return json.loads(Path(path).read_text())


def replay(grid: dict[str, Any], sampler: str, seed: int, budget_configs: int, leaders: int,
           per_round: int = 2) -> dict[str, Any]:
    """One search over the recorded grid: when each point's grid winner was first measured, and the pick."""
    import optuna

    from orchestrator.tune.robust import Entry, pick
    from orchestrator.tune.loop import Measured, choose_leaders, search_loop
    from orchestrator.tune.settings import TuneSettings
    from orchestrator.tune.space import NUM_DRAFT_TOKENS, TOPK, Candidate

    confs, points = grid["configurations"], grid["points"]
    def asked(values: dict[str, str]) -> dict[str, str]:  # a chain's num_draft_tokens is num_steps + 1, not asked
        return {k: v for k, v in values.items() if k != NUM_DRAFT_TOKENS or values.get(TOPK, "1") != "1"}

    cands = {k: Candidate(tuple(k.split()), c["speculates"]) for k, c in confs.items()}
    cands = {k: replace(c, params=tuple(asked(c.values).items())) for k, c in cands.items()}
    space: dict[str, list[Any]] = {}
    for c in cands.values():
        for key, v in c.params:
            space.setdefault(key, [])
            if v not in space[key]:
                space[key].append(v)
    drafters = {c.values.get("drafter"): c.speculates for c in cands.values()}
    speculates = lambda params: drafters.get(str(params.get("drafter")), True)  # noqa: E731
    # the search's own budget, as a user's tune would set it: Optuna's TPE draws its first quarter at random
    settings = TuneSettings(space={k: tuple(v) for k, v in space.items()}, trials=budget_configs,
                            per_round=per_round, sampler=sampler, seed=seed)
    rng = random.Random(seed)
    order: list[str] = []
    drawn: dict[str, tuple[float, ...]] = {}
    truth = grid_winners(grid)

    def measure(keys: list[str], _round: int) -> dict[str, Measured | None]:
        out: dict[str, Measured | None] = {}
        for k in keys:
            order.append(k)
            drawn[k] = tuple(rng.choice(confs[k][p]["throughput_tok_s"]) for p in points)
            out[k] = Measured(drawn[k], 0.0, confs[k][points[0]].get("commit_len_mean"), "replay")
        if len(order) >= budget_configs and all(w in drawn for w, _ in truth.values()):
            raise _AllFound  # past the budget the search runs only to say when each winner was first measured
        return out

    from orchestrator.tune.study import _sampler

    study = optuna.create_study(directions=["maximize"] * len(points), sampler=_sampler(settings, len(cands)))
    settings = replace(settings, trials=len(cands))  # search on past the budget: when was the winner first measured
    try:
        search_loop(study, settings, cands, {}, speculates, measure, startup_of=budget_configs)
    except _AllFound:
        pass
    out: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(points):
        winner = truth[p][0]
        near = [n for n, k in enumerate(order, 1) if k == winner or _inseparable(grid, p, k, winner)]
        seen = {k: drawn[k] for k in order[:budget_configs]}
        chosen = choose_leaders(seen, len(points), lambda k: cands[k].speculates, leaders)[i]
        entries = [Entry(k, k, cands[k].draft_tokens, tuple(confs[k][p]["throughput_tok_s"])) for k in chosen]
        got = pick(entries, settings.tie_frac).winner.key
        out[p] = {"winner_at": order.index(winner) + 1 if winner in order else None,
                  "near_at": near[0] if near else None, "leader_runs": len(chosen),
                  "pick": "winner" if got == winner else "inseparable" if _inseparable(grid, p, got, winner)
                  else "worse"}
    return out


class _AllFound(Exception):
    pass


def _inseparable(grid: dict[str, Any], point: str, a: str, b: str) -> bool:
    """Whether the grid's own repeats cannot tell configurations a and b apart at `point` (the spread pooled over
    every configuration of the grid there)."""
    from orchestrator.results.regress.verdict import pooled_noise
    from orchestrator.tune.robust import Entry, separable

    confs = grid["configurations"]
    noise = pooled_noise([c[point]["throughput_tok_s"] for c in confs.values() if point in c])
    ea, eb = (Entry(k, k, confs[k]["draft_tokens"], tuple(confs[k][point]["throughput_tok_s"])) for k in (a, b))
    return not separable(ea, eb, noise).separable


def grid_winners(grid: dict[str, Any]) -> dict[str, tuple[str, float]]:
    from orchestrator.tune.robust import Entry, pick

    out = {}
    for p in grid["points"]:
        entries = [Entry(k, c["label"], c["draft_tokens"], tuple(c[p]["throughput_tok_s"]))
                   for k, c in grid["configurations"].items() if p in c and len(c[p]["throughput_tok_s"]) >= 3]
        got = pick(entries, 0.01)
        out[p] = (got.winner.key, got.winner.score)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work-dir", default="bench-tune", type=Path)
    ap.add_argument("--reuse", action="store_true", help="replay the grid already measured in --work-dir")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="fraction of the grid's runs the search may use")
    ap.add_argument("--leaders", type=int, default=3)
    ap.add_argument("--samplers", default="tpe,motpe,random")
    ap.add_argument("--per-round", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="extra overrides for the grid run")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.time()
    if not args.reuse:
        run_grid(args.work_dir, args.overrides)
    grid = load_grid(args.work_dir)
    n, points = len(grid["configurations"]), grid["points"]
    truth = grid_winners(grid)
    grid_runs = n * len(points)
    # the budget counts search runs (configurations x points) and the leaders' runs (one per leader and point)
    leader_runs = (args.leaders + 1) * len(points)
    budget_configs = max(1, int((args.budget * grid_runs - leader_runs) // len(points)))
    print(f"\ngrid: {n} configurations x {len(points)} workload points = {grid_runs} runs (3 repeats each); "
          f"budget {args.budget:.0%} of the grid = {budget_configs} configurations searched + up to {leader_runs} "
          f"leader runs; {args.seeds} seeds; grid measured + replayed in {time.time() - t0:.0f} s")
    print("\n| sampler | context x batch | grid winner | configurations measured until the winner was: median / "
          "worst of the seeds | until one the noise cannot separate from it was | pick at the budget: the winner / "
          "inseparable / separably worse |")
    print("|---|---|---|---|---|---|")
    for sampler in args.samplers.split(","):
        results = [replay(grid, sampler, seed, budget_configs, args.leaders, args.per_round)
                   for seed in range(args.seeds)]
        for p in points:
            label = grid["configurations"][truth[p][0]]["label"] or "no speculation"
            cols = []
            for what in ("winner_at", "near_at"):
                at = [r[p][what] or n for r in results]  # never measured: the whole space
                cols.append(f"{statistics.median(at):.0f} / {max(at)} of {n} "
                            f"({statistics.median(at) / n:.0%} / {max(at) / n:.0%})")
            picks = [r[p]["pick"] for r in results]
            print(f"| {sampler} | {p} | {label} ({truth[p][1]:.1f} tok/s) | {cols[0]} | {cols[1]} | "
                  f"{picks.count('winner')} / {picks.count('inseparable')} / {picks.count('worse')} |")

if __name__ == "__main__":
    main()

