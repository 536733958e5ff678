"""Orchestration overhead per run: (sweep wall time − Σ engine time) ÷ runs.

`python -m tools.bench_orchestrator [--runs 8 64] [--ray fresh running] [--repeat 3] [--breakdown]`
(`make bench-orchestrator`).

Each sample is one `execute_plan` call as a sweep makes it, in a fresh Python process as `make run` is one (the
driver's own imports, MLflow's and matplotlib's, count every time): a fresh embedded Ray (started and shut down),
a fresh MLflow SQLite store in a temp dir (parent + one child per run, the report), one reference-engine server
running N trivial probes. Engine time = engine start-up (to the first /health 200) + Σ per-run time inside
/generate. With `--ray running` (also in the default table) Ray is already up when the sweep starts, as on a
cluster (`cluster=ray`) or after a `ray start`. Everything else — Ray start/stop, actor scheduling, the engine's
stop, /flush_cache, result transfer, MLflow set-up and writes, the report — is overhead. Rows are interleaved
over `--repeat` rounds and the tables show medians. The table also shows the one-time part (Ray start/stop,
MLflow set-up; they overlap) and the marginal overhead of one more run (the slope between sizes);
`--breakdown` adds where the wall time went, phase by phase (`ExecutionStats`).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import ray
from rich.console import Console
from rich.table import Table

from orchestrator.execution.execute import execute_plan
from orchestrator.execution.local_ray import init_local_ray
from orchestrator.config.plan import Plan
from orchestrator.config.settings import ClusterSettings, ExecutionSettings, TrackingSettings
from orchestrator.execution.stats import ExecutionStats
from tools.testing import tiny_group, tiny_run, tiny_server
from specsweep_common.spec import ProbeKind, RunState

logger = logging.getLogger(__name__)


def bench_once(runs: int, context_len: int, gen_tokens: int, num_cpus: int, ray_mode: str) -> dict[str, float | str]:
    server = tiny_server("none", server_context_len=max(64, context_len + gen_tokens))
    specs = [tiny_run(server, i, ProbeKind.PREDICTABLE, context_len=context_len, gen_tokens=gen_tokens)
             for i in range(runs)]
    plan = Plan(sweep_name="bench", groups=(tiny_group(server, specs),), base_config={"runs": runs})
    with tempfile.TemporaryDirectory(prefix="specsweep-bench-") as tmp:
        settings = ExecutionSettings(sweep_name="bench", work_dir=tmp, progress=False,
                                     cluster=ClusterSettings(num_cpus=num_cpus),
                                     tracking=TrackingSettings(uri=f"sqlite:///{tmp}/mlflow.db"))
        stats = ExecutionStats()
        if ray_mode == "running":  # a Ray that is already up (cluster=ray, or `ray start` beforehand)
            init_local_ray(num_cpus=num_cpus, object_store_memory=80 * 2**20, include_dashboard=False,
                           log_to_driver=False)
        try:
            t0 = time.perf_counter()
            results = execute_plan(plan, settings, stats=stats)
            wall = time.perf_counter() - t0
        finally:
            if ray_mode == "running":
                ray.shutdown()
    bad = [r for r in results if r.state is not RunState.FINISHED]
    if bad:
        raise SystemExit(f"{len(bad)} run(s) did not finish: {bad[0].reason} {bad[0].message}")
    engine_start = sum(stats.engine_startup_s.values())
    probes = sum(r.engine_time_s for r in results)
    engine = engine_start + probes
    row: dict[str, float | str] = {"ray": ray_mode, "runs": runs, "wall_s": wall, "engine_s": engine,
           "overhead_per_run_s": (wall - engine) / runs,
           "fixed_s": stats.ready_s + stats.ray_shutdown_s,  # Ray start-up and MLflow set-up run concurrently
           "tracking_per_run_s": stats.tracking_s / runs}
    row.update(breakdown(stats, results, wall))
    return row


# Where a one-server sweep's wall time goes: the sequential phases (their sum + "other" = wall), then the
# background thread's work, which overlaps them.
BREAKDOWN = (("ray_start", "Ray start (ray.init)"),
             ("submit", "preflight, placement group, actor submitted"),
             ("actor", "actor up: worker lease, imports, init"),
             ("engine_start", "engine start to /health (engine time)"),
             ("runs", "runs: first start to last end"),
             ("engine_stop", "engine stop: SIGTERM to exit"),
             ("ray_stop", "Ray stop (ray.shutdown)"),
             ("close", "after Ray stop: report wait, parent closed"),
             ("other", "other: waits for MLflow, result handling"),
             ("probe_gap", "(runs outside /generate)"),
             ("bg_mlflow", "(thread) MLflow set-up, from the submission"),
             ("bg_report", "(thread) report"))


def breakdown(stats: ExecutionStats, results, wall: float) -> dict[str, float]:
    marks = collections.defaultdict(lambda: math.nan, stats.marks)
    slot = stats.slots[0]  # one server: submitted -> its engine start began -> its engine stopped
    first = min(r.started_at for r in results)
    last = max(r.ended_at for r in results)
    b = {"ray_start": stats.ray_init_s,
         "submit": marks["submitted"] - marks["ray_up"],
         "actor": slot.began_at - slot.submitted_at,
         "engine_start": sum(stats.engine_startup_s.values()),
         "runs": last - first,
         "engine_stop": sum(stats.engine_stop_s.values()),
         "ray_stop": stats.ray_shutdown_s,
         "close": marks["end"] - (marks["ray_down"] if "ray_down" in stats.marks else marks["loop_done"])}
    b["other"] = wall - sum(b.values())
    b["probe_gap"] = b["runs"] - sum(r.engine_time_s for r in results)
    b["bg_mlflow"] = stats.tracking_setup_s - marks["submitted"]
    b["bg_report"] = stats.report_s
    return {f"b_{k}": v for k, v in b.items()}


def _median_rows(samples: list[dict]) -> list[dict]:
    """One row per (Ray mode, runs) in first-seen order: the median of each number over the repeats."""
    keys = list(dict.fromkeys((s["ray"], s["runs"]) for s in samples))
    out = []
    for mode, n in keys:
        group = [s for s in samples if (s["ray"], s["runs"]) == (mode, n)]
        row = {"ray": mode, "runs": n, "repeats": len(group)}
        row.update({k: statistics.median(s[k] for s in group) for k in group[0] if k not in ("ray", "runs")})
        out.append(row)
    return out


def _sample(mode: str, runs: int, args: argparse.Namespace) -> dict:
    """One row measured in a fresh Python process, as `make run` is one: the driver pays its own imports (MLflow,
    matplotlib for the report) inside the sweep's wall time every time, not only in the first row."""
    cmd = [sys.executable, "-m", "tools.bench_orchestrator", "--one", mode, str(runs), "--context-len", str(args.context_len),
           "--gen-tokens", str(args.gen_tokens), "--num-cpus", str(args.num_cpus)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    lines = [line for line in out.stdout.splitlines() if line.startswith(ONE_PREFIX)]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(ONE_PREFIX):])


ONE_PREFIX = "BENCH_ROW "


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench_orchestrator", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, nargs="+", default=[8, 64])
    p.add_argument("--context-len", type=int, default=16)
    p.add_argument("--gen-tokens", type=int, default=2)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--ray", nargs="+", default=["fresh", "running"], choices=["fresh", "running"],
                   help="fresh: the sweep starts and stops an embedded Ray (make run); running: Ray is already up")
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds over every (Ray, runs) row, interleaved, each row in a fresh process; medians shown")
    p.add_argument("--breakdown", action="store_true", help="also print where the seconds went (medians)")
    p.add_argument("--one", nargs=2, metavar=("RAY", "RUNS"), help=argparse.SUPPRESS)  # one row, in this process
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.one:
        row = bench_once(int(args.one[1]), args.context_len, args.gen_tokens, args.num_cpus, args.one[0])
        print(ONE_PREFIX + json.dumps(row), flush=True)
        return
    load0 = os.getloadavg()
    samples = [_sample(mode, n, args) for _ in range(args.repeat) for mode in args.ray for n in args.runs]
    load1 = os.getloadavg()
    rows = _median_rows(samples)
    load = f"load avg 1 min {load0[0]:.2f} at start, {load1[0]:.2f} at end"
    table = Table(title=f"orchestration overhead, {time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.node()} "
                        f"({os.cpu_count()} CPUs, {load}), probe ctx={args.context_len} gen={args.gen_tokens}, "
                        f"1 server, median of {args.repeat}", title_justify="left")
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
    console = Console(width=160)
    console.print(table)
    if args.breakdown:
        bt = Table(title="where the wall time goes (seconds, median of each phase; in each sample the phases above "
                         "the wall add up to it)", title_justify="left")
        bt.add_column("phase")
        for r in rows:
            bt.add_column(f"{r['ray']} {r['runs']}", justify="right")
        for key, label in BREAKDOWN:
            bt.add_row(label, *(f"{r['b_' + key]:.2f}" for r in rows))
            if key == "other":
                bt.add_row("wall", *(f"{r['wall_s']:.2f}" for r in rows), end_section=True)
        console.print(bt)


if __name__ == "__main__":
    main()
