"""Validation benchmark: how long a grid takes from its overrides to a plan, before anything starts.

    python -m tools.bench_validate [--points 100 1000 8000] [--slow 100]     (`make bench-validate`)

Each grid is 2 drafters × 2 probes × 10 contexts × N seeds on the stub engine (`model=tiny`): 4 distinct choices of
config groups, the rest plain keys, as a long sweep is. It runs the launcher's path in this process: compose every
job (`orchestrator.config.jobs.compose_jobs`: Hydra once per choice of config groups, `orchestrator.config.grid`),
convert and validate every point (`convert_and_validate`: declared domains, rules, engine flags, sweep level), then
plan (`plan_sweep`: servers, run hashes). `--slow N` also times the old way on N points (Hydra composes every job in
full) for comparison. Prints one Markdown table with the date and the machine; wall seconds, one run each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from collections.abc import Sequence

CONTEXTS = tuple(range(256, 2816, 256))  # 10
AXES_GROUPS = {"drafter": ("ngram", "oracle"), "probe": ("predictable", "novel")}
FIXED = ("engine=stub", "model=tiny", "gen_tokens=32", "sweep_name=bench-validate")


def grid(points: int) -> list[list[str]]:
    from orchestrator.config.jobs import expand_grid

    per_seed = len(CONTEXTS) * 4
    seeds = max(1, points // per_seed)
    return expand_grid({**AXES_GROUPS, "context_len": CONTEXTS, "seed": range(seeds)}, *FIXED)[:points]


def measure(job_overrides: Sequence[Sequence[str]], *, fast: bool = True) -> dict[str, float]:
    from hydra import initialize_config_module

    from orchestrator.config.jobs import compose_jobs, convert_and_validate
    from orchestrator.config.plan import plan_sweep
    from orchestrator.config.schema import register_configs

    register_configs()
    t0 = time.perf_counter()
    with initialize_config_module("conf", version_base="1.3"):
        composed = compose_jobs(job_overrides, fast=fast)
    t1 = time.perf_counter()
    configs = convert_and_validate(list(zip(composed, job_overrides)), sweep=True, cwd=os.getcwd())
    t2 = time.perf_counter()
    plan = plan_sweep(configs[0].sweep_name, configs, base_config=composed[0])
    t3 = time.perf_counter()
    assert plan.num_runs == len(job_overrides), (plan.num_runs, len(job_overrides))
    return {"compose": t1 - t0, "validate": t2 - t1, "plan": t3 - t2, "total": t3 - t0}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, nargs="+", default=[100, 1000, 8000])
    parser.add_argument("--slow", type=int, default=100, help="also time full composition of every job on N points "
                        "(0: skip)")
    args = parser.parse_args(argv)
    measure(grid(40))  # imports, Hydra's plugin scan and the caches warm: not part of any row
    rows = [("fast", n, measure(grid(n))) for n in args.points]
    if args.slow:
        rows.append(("every job composed in full (before)", args.slow, measure(grid(args.slow), fast=False)))
    load = os.getloadavg()[0]
    print(f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPU(s) "
          f"({platform.processor() or platform.machine()}), Python {platform.python_version()}, load {load:.1f}\n")
    print("| path | points | compose s | validate s | plan s | seconds to validate | per point µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path, n, t in rows:
        print(f"| {path} | {n:,} | {t['compose']:.2f} | {t['validate']:.2f} | {t['plan']:.2f} | {t['total']:.2f} "
              f"| {t['total'] / n * 1e6:,.0f} |")


if __name__ == "__main__":
    main()
