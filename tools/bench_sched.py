"""Scheduling benchmark: a 48-run sweep of mixed run lengths on a simulated Ray cluster.

    python -m tools.bench_sched [--groups 12] [--runs-per-group 4] [--tp 8] [--seed 0]

A `ray.cluster_utils.Cluster` (a CPU head and 3 nodes × 8 logical GPUs) runs the real execution path
(preflight, placement groups, Ray actors, EngineProcess, HTTP probes, MLflow on SQLite in a temp dir) with the
stub engine (workers/stub/server.py), whose run time is prefill (s per prompt token) + decode (s per token):
mixed prompt lengths give mixed run lengths. It prints one table:

- makespan: first placement group requested → last server stopped;
- lower bound: max(Σ group work ÷ concurrent slots, the longest group), group work = engine start → stop
  as measured for each server (so the bound is what a perfect scheduler with zero overhead would need);
- ratio = makespan ÷ lower bound (target ≤ 1.2);
- engine starts against distinct ServerSpecs (target: equal).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.config.plan import Plan
from orchestrator.config.settings import ClusterKind, ClusterSettings, ExecutionSettings, TrackingSettings
from specsweep_common.spec import RunState
from tools.testing import stub_server, tiny_group, tiny_run

log = logging.getLogger(__name__)

NODES = 3
GPUS_PER_NODE = 8
NODE_OBJECT_STORE_MB = 80
PREFILL_S = 0.002  # stub: seconds per prompt token (a 4000-token prompt takes 8 s)
TOKEN_S = 0.01  # stub: seconds per generated token
GEN_TOKENS = 20
CONTEXTS = (500, 1000, 1500, 2000, 3000, 4000)


def build_plan(groups: int, runs_per_group: int, tp: int, seed: int) -> Plan:
    rng = random.Random(seed)
    out, job = [], 0
    for g in range(groups):
        server = stub_server(tp_size=tp, token_s=TOKEN_S, prefill_s=PREFILL_S, seed=g)
        runs = [tiny_run(server, job + i, context_len=rng.choice(CONTEXTS), gen_tokens=GEN_TOKENS)
                for i in range(runs_per_group)]
        job += runs_per_group
        out.append(tiny_group(server, runs))
    return Plan(sweep_name="bench-sched", groups=tuple(out), base_config={"bench": "sched"})


def concurrent_slots(tp: int, max_concurrent: int | None) -> int:
    slots = NODES * (GPUS_PER_NODE // tp)
    return min(slots, max_concurrent) if max_concurrent else slots


def run(groups: int, runs_per_group: int, tp: int, seed: int, max_concurrent: int | None) -> dict[str, float]:
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    plan = build_plan(groups, runs_per_group, tp, seed)
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, num_gpus=0, include_dashboard=False,
                                                                object_store_memory=NODE_OBJECT_STORE_MB * 2**20))
    try:
        for _ in range(NODES):
            cluster.add_node(num_cpus=4, num_gpus=GPUS_PER_NODE, object_store_memory=NODE_OBJECT_STORE_MB * 2**20,
                             labels={"gpu-arch": "sm_120"})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster_up_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(prefix="bench-sched-") as work:
            settings = ExecutionSettings(
                sweep_name=plan.sweep_name, work_dir=work, progress=False,
                tracking=TrackingSettings(uri=f"sqlite:///{Path(work) / 'mlflow.db'}"),
                cluster=ClusterSettings(kind=ClusterKind.RAY, accelerator="sm_120",
                                        max_concurrent_servers=max_concurrent))
            stats = ExecutionStats()
            results = execute_plan(plan, settings, stats=stats)
    finally:
        ray.shutdown()
        cluster.shutdown()
    finished = sum(r.state is RunState.FINISHED for r in results)
    work_s = [s.ended_at - s.began_at for s in stats.slots]
    slots = concurrent_slots(tp, max_concurrent)
    makespan = max(s.ended_at for s in stats.slots) - min(s.submitted_at for s in stats.slots)
    bound = max(sum(work_s) / slots, max(work_s))
    run_s = [r.ended_at - r.started_at for r in results]
    return {"runs": len(results), "finished": finished, "servers": len(plan.groups),
            "engine_starts": stats.total_engine_starts, "slots": slots, "cluster_up_s": cluster_up_s,
            "run_s_min": min(run_s), "run_s_median": statistics.median(run_s), "run_s_max": max(run_s),
            "group_work_s_min": min(work_s), "group_work_s_max": max(work_s), "group_work_s_sum": sum(work_s),
            "makespan_s": makespan, "lower_bound_s": bound, "ratio": makespan / bound, "wall_s": stats.wall_s}


def format_table(m: dict[str, float], tp: int) -> str:
    rows = [
        ("cluster", f"{NODES} nodes × {GPUS_PER_NODE} logical GPUs (+ CPU head), up in {m['cluster_up_s']:.1f} s"),
        ("sweep", f"{m['runs']:.0f} runs on {m['servers']:.0f} servers of TP={tp}, {m['finished']:.0f} FINISHED"),
        ("run length (s)", f"min {m['run_s_min']:.2f} / median {m['run_s_median']:.2f} / max {m['run_s_max']:.2f}"),
        ("group work (s)", f"min {m['group_work_s_min']:.1f} / max {m['group_work_s_max']:.1f} / "
                           f"Σ {m['group_work_s_sum']:.1f}"),
        ("concurrent slots", f"{m['slots']:.0f}"),
        ("lower bound (s)", f"{m['lower_bound_s']:.1f}"),
        ("makespan (s)", f"{m['makespan_s']:.1f}"),
        ("makespan ÷ lower bound", f"{m['ratio']:.3f} (target ≤ 1.2)"),
        ("engine starts / distinct ServerSpecs", f"{m['engine_starts']:.0f} / {m['servers']:.0f}"),
        ("execute_plan wall (s, MLflow included)", f"{m['wall_s']:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'quantity'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--runs-per-group", type=int, default=4)
    p.add_argument("--tp", type=int, default=8, choices=(1, 2, 4, 8))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-concurrent-servers", type=int, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    m = run(args.groups, args.runs_per_group, args.tp, args.seed, args.max_concurrent_servers)
    print(format_table(m, args.tp))
    ok = m["ratio"] <= 1.2 and m["engine_starts"] == m["servers"] and m["finished"] == m["runs"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
