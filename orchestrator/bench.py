"""Orchestration overhead per run: (sweep wall time − Σ engine time) ÷ runs.

`python -m orchestrator.bench [--runs 8 64] [--context-len 16] [--gen-tokens 2]` (`make bench-orchestrator`).

Each size is one `run_plan` call as a sweep makes it: a fresh embedded Ray (started and shut down), a fresh
MLflow SQLite store in a temp dir (parent + one child per run), one reference-engine server running N
trivial probes. Engine time = engine start-up (to the first /health 200) + Σ per-run time inside /generate.
With `--ray running` (also in the default table) Ray is already up when the sweep starts, as on a
cluster (`cluster=ray`) or after a `ray start`. Everything else — Ray start/stop, actor scheduling, /flush_cache, result transfer, MLflow writes, progress —
is overhead. The table also shows the one-time part (Ray start/stop, MLflow set-up; they overlap) and the
marginal overhead of one more run (the slope between sizes).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time

import ray
from rich.console import Console
from rich.table import Table

from orchestrator.execute import ExecutionStats, run_plan
from orchestrator.plan import Plan
from orchestrator.spec import ClusterSettings, ExecutionSettings, ProbeKind, RunState, TrackingSettings
from workers.testing import tiny_group, tiny_run, tiny_server

logger = logging.getLogger(__name__)


def bench_once(runs: int, context_len: int, gen_tokens: int, num_cpus: int, ray_mode: str) -> dict[str, float]:
    server = tiny_server("none", context_length=max(64, context_len + gen_tokens))
    specs = [tiny_run(server, i, ProbeKind.PREDICTABLE, context_len=context_len, gen_tokens=gen_tokens)
             for i in range(runs)]
    plan = Plan(sweep_name="bench", groups=(tiny_group(server, specs),), base_config={"runs": runs})
    with tempfile.TemporaryDirectory(prefix="specsweep-bench-") as tmp:
        settings = ExecutionSettings(sweep_name="bench", work_dir=tmp, progress=False,
                                     cluster=ClusterSettings(num_cpus=num_cpus),
                                     tracking=TrackingSettings(uri=f"sqlite:///{tmp}/mlflow.db"))
        stats = ExecutionStats()
        if ray_mode == "running":  # a Ray that is already up (cluster=ray, or `ray start` beforehand)
            ray.init(num_cpus=num_cpus, object_store_memory=80 * 2**20, include_dashboard=False,
                     log_to_driver=False)
        try:
            t0 = time.perf_counter()
            results = run_plan(plan, settings, stats=stats)
            wall = time.perf_counter() - t0
        finally:
            if ray_mode == "running":
                ray.shutdown()
    bad = [r for r in results if r.state is not RunState.FINISHED]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) did not finish: {bad[0].reason} {bad[0].message}")
    engine = sum(stats.engine_startup_s.values()) + sum(r.engine_time_s for r in results)
    fixed = stats.ready_s + stats.ray_shutdown_s  # Ray start-up and MLflow set-up run concurrently
    return {"ray": ray_mode, "runs": runs, "wall_s": wall, "engine_s": engine, "overhead_per_run_s": (wall - engine) / runs,
            "fixed_s": fixed, "tracking_per_run_s": stats.tracking_s / runs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m orchestrator.bench", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, nargs="+", default=[8, 64])
    p.add_argument("--context-len", type=int, default=16)
    p.add_argument("--gen-tokens", type=int, default=2)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--ray", nargs="+", default=["fresh", "running"], choices=["fresh", "running"],
                   help="fresh: the sweep starts and stops an embedded Ray (make run); running: Ray is already up")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    rows = [bench_once(n, args.context_len, args.gen_tokens, args.num_cpus, mode) for mode in args.ray
            for n in args.runs]
    table = Table(title=f"orchestration overhead, {time.strftime('%Y-%m-%d')}, {platform.node()} "
                        f"({os.cpu_count()} CPUs), probe ctx={args.context_len} gen={args.gen_tokens}, 1 server",
                  title_justify="left")
    for col in ("Ray", "runs", "wall s", "engine s", "overhead / run s", "one-time s (Ray start+stop, MLflow set-up)",
                "marginal overhead / run s", "MLflow / run s"):
        table.add_column(col, justify="right")
    prev = None
    for r in rows:
        marginal = "-"
        if prev is not None and prev["ray"] == r["ray"] and r["runs"] != prev["runs"]:  # slope: what one more run costs beyond the engine
            marginal = f"{((r['wall_s'] - r['engine_s']) - (prev['wall_s'] - prev['engine_s'])) / (r['runs'] - prev['runs']):.3f}"
        table.add_row(r["ray"], str(r["runs"]), f"{r['wall_s']:.2f}", f"{r['engine_s']:.2f}", f"{r['overhead_per_run_s']:.3f}",
                      f"{r['fixed_s']:.2f}", marginal, f"{r['tracking_per_run_s']:.3f}")
        prev = r
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
