"""Cluster scheduling on a simulated multi-node Ray cluster (`ray.cluster_utils.Cluster`): a CPU head and three
nodes of 8 logical GPUs, two labelled gpu-arch=sm_120 and one sm_90 (also advertising the custom resources
`accelerator_<arch>` of the fallback). Engines are the stub engine (workers/stub/server.py) started by the real
EngineProcess in Ray actors placed by placement groups, probed over HTTP, recorded in MLflow where asked.

Also runnable as a driver for the interrupt test: `python tests/orchestrator/execution/test_cluster.py ADDRESS WORK_DIR`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.config.plan import Plan
from orchestrator.config.settings import (AcceleratorMatch, ClusterKind, ClusterSettings, ExecutionSettings,
                                          TrackingSettings)
from specsweep_common.spec import FailureReason, RunState
from tools.testing import pid_alive, proc_env, stub_server, stub_starts, tiny_group, tiny_run, wait_for_request
from tools.ray_testing import ray_cluster


ROOT = Path(__file__).resolve().parents[3]
NODE_MB = 80
ARCHS = ("sm_120", "sm_120", "sm_90")


def _node_args(arch: str) -> dict:
    return dict(num_cpus=4, num_gpus=8, object_store_memory=NODE_MB * 2**20, labels={"gpu-arch": arch},
                resources={f"accelerator_{arch}": 1})


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """(cluster, [node, ...] in ARCHS order); the driver is connected to it."""
    pytest.importorskip("ray")
    with ray_cluster([_node_args(arch) for arch in ARCHS], object_store_mb=NODE_MB) as (cluster, nodes):
        yield cluster, nodes


def _settings(tmp_path, sweep: str = "t", **cluster) -> ExecutionSettings:
    return ExecutionSettings(sweep_name=sweep, work_dir=str(tmp_path), progress=False,
                             tracking=TrackingSettings(uri=f"sqlite:///{tmp_path}/mlflow.db"),
                             cluster=ClusterSettings(kind=ClusterKind.RAY, **cluster))


def _groups(n: int, runs: int, *, tp: int = 8, first_job: int = 0, gen_tokens: int = 40, token_s: float = 0.01,
            nnodes: int = 1, seed0: int = 0):
    groups, job = [], first_job
    for g in range(n):
        server = stub_server(tp_size=tp, nnodes=nnodes, token_s=token_s, seed=seed0 + g)
        groups.append(tiny_group(server, [tiny_run(server, job + i, gen_tokens=gen_tokens) for i in range(runs)]))
        job += runs
    return tuple(groups)


def _plan(groups, sweep: str = "t") -> Plan:
    return Plan(sweep_name=sweep, groups=tuple(groups), base_config={"gen_tokens": 40})


def _max_overlap(intervals) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def _group_spans(results) -> dict[str, tuple[str, float, float]]:
    """server_group -> (node_id, first run start, last run end) from the recorded tags and timestamps."""
    spans: dict[str, tuple[str, float, float]] = {}
    for r in results:
        gid, node = r.tags["server_group"], r.tags["node_id"]
        if gid in spans:
            n, a, b = spans[gid]
            assert n == node, "one group's runs on two nodes without a node loss"
            spans[gid] = (n, min(a, r.started_at), max(b, r.ended_at))
        else:
            spans[gid] = (node, r.started_at, r.ended_at)
    return spans


def _arch_of_node(nodes) -> dict[str, str]:
    return {n.node_id: arch for n, arch in zip(nodes, ARCHS)}


# ---------------------------------------------------------------- placement and concurrency


def test_tp8_servers_take_a_whole_node_each_three_at_a_time(sim, tmp_path):
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    _, nodes = sim
    plan = _plan(_groups(12, 2, gen_tokens=30))
    stats = ExecutionStats()
    results = execute_plan(plan, _settings(tmp_path), track=False, stats=stats)
    assert len(results) == 24 and all(r.state is RunState.FINISHED for r in results), [r.message for r in results]
    spans = _group_spans(results)
    assert len(spans) == 12 and set(n for n, _, _ in spans.values()) <= set(_arch_of_node(nodes))
    for node in {n for n, _, _ in spans.values()}:  # never two servers on one node at once
        assert _max_overlap([(a, b) for n, a, b in spans.values() if n == node]) == 1
    assert _max_overlap([(a, b) for _, a, b in spans.values()]) <= 3
    assert _max_overlap([(s.began_at, s.ended_at) for s in stats.slots]) <= 3
    assert all(len(r.tags["gpu_ids"].split(",")) == 8 for r in results)  # CUDA_VISIBLE_DEVICES from the bundle
    assert stats.total_engine_starts == 12


def test_tp4_servers_pack_two_per_node(sim, tmp_path):
    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    plan = _plan(_groups(6, 2, tp=4, first_job=100, gen_tokens=100, seed0=100))
    stats = ExecutionStats()
    results = execute_plan(plan, _settings(tmp_path), track=False, stats=stats)
    assert all(r.state is RunState.FINISHED for r in results), [r.message for r in results]
    spans = _group_spans(results)
    gpus = {r.tags["server_group"]: set(r.tags["gpu_ids"].split(",")) for r in results}
    assert all(len(g) == 4 for g in gpus.values())
    pairs = [(g, h) for g in spans for h in spans if g < h and spans[g][0] == spans[h][0]
             and spans[g][1] < spans[h][2] and spans[h][1] < spans[g][2]]
    assert pairs, "no node ever held two TP=4 servers at once"
    assert all(not gpus[g] & gpus[h] for g, h in pairs)  # each got its own half of the node's GPUs
    for node in {n for n, _, _ in spans.values()}:
        assert _max_overlap([(a, b) for n, a, b in spans.values() if n == node]) <= 2
    assert stats.total_engine_starts == 6


def test_accelerator_label_keeps_servers_off_other_architectures(sim, tmp_path):
    from orchestrator.execution.execute import execute_plan

    _, nodes = sim
    arch = _arch_of_node(nodes)
    results = execute_plan(_plan(_groups(4, 2, first_job=200, seed0=200)), _settings(tmp_path, accelerator="sm_120"),
                       track=False)
    assert all(r.state is RunState.FINISHED for r in results), [r.message for r in results]
    assert {arch[r.tags["node_id"]] for r in results} == {"sm_120"}
    assert {r.tags["node_label.gpu-arch"] for r in results} == {"sm_120"}


def test_accelerator_resource_fallback(sim, tmp_path):
    from orchestrator.execution.execute import execute_plan

    _, nodes = sim
    arch = _arch_of_node(nodes)
    settings = _settings(tmp_path, accelerator="sm_90", accelerator_match=AcceleratorMatch.RESOURCE)
    results = execute_plan(_plan(_groups(2, 1, first_job=250, seed0=250)), settings, track=False)
    assert all(r.state is RunState.FINISHED for r in results), [r.message for r in results]
    assert {arch[r.tags["node_id"]] for r in results} == {"sm_90"}


def test_preflight_names_the_missing_label_and_launches_nothing(sim, tmp_path):
    from ray.util import placement_group_table

    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.preflight import PreflightError

    before = len(placement_group_table())
    plan = _plan(_groups(2, 1, first_job=300, seed0=300))
    with pytest.raises(PreflightError) as e:
        execute_plan(plan, _settings(tmp_path, accelerator="sm_100"))
    msg = str(e.value)
    assert "accelerator=sm_100: no node has that label" in msg, msg
    assert "2× sm_120 (8 GPU), 1× sm_90 (8 GPU)" in msg and all(g.group_id in msg for g in plan.groups)
    assert len(placement_group_table()) == before
    assert not (tmp_path / "mlflow.db").exists() or _experiment_runs(tmp_path, "t-stub") is None


def test_engine_start_failure_fails_that_group_and_the_sweep_goes_on(sim, tmp_path):
    from orchestrator.execution.execute import execute_plan

    good = _groups(1, 2, first_job=350, seed0=350)[0]
    bad_server = stub_server(tp_size=8, seed=351, extra_args=("--stub-startup-s", "not-a-number"))
    bad = tiny_group(bad_server, [tiny_run(bad_server, 352), tiny_run(bad_server, 353)])
    results = execute_plan(_plan([bad, good]), _settings(tmp_path), track=False)
    states = {r.run.job_index: r for r in results}
    assert states[350].state is RunState.FINISHED and states[351].state is RunState.FINISHED
    for i in (352, 353):
        assert states[i].reason is FailureReason.ENGINE_START_FAILED
        assert "not-a-number" in states[i].artifacts["engine_log_tail.txt"]


# ---------------------------------------------------------------- multi-node


def test_multi_node_server_starts_one_rank_per_node(sim, tmp_path):
    from orchestrator.execution.execute import execute_plan

    groups = _groups(1, 2, tp=16, nnodes=2, first_job=400, seed0=400)
    results = execute_plan(_plan(groups), _settings(tmp_path), track=False)
    assert all(r.state is RunState.FINISHED for r in results), [r.message for r in results]
    starts = stub_starts(tmp_path)  # each rank's start-up line in its engine log
    assert sorted(s.node_rank for s in starts) == [0, 1] and {s.nnodes for s in starts} == {2}
    addrs = {s.dist_init_addr for s in starts}
    assert len(addrs) == 1 and ":" in addrs.pop()
    assert len({s.node_id for s in starts}) == 2  # one rank per node
    for s in starts:
        assert len(s.cuda_visible_devices.split(",")) == 8 and s.tp_size == 16
        assert s.argv[s.argv.index("--node-rank") + 1] == str(s.node_rank) and "--tp-size" in s.argv
    rank0 = next(s for s in starts if s.node_rank == 0)
    assert all(res.tags["node_id"] == rank0.node_id for res in results)  # rank 0 was probed
    assert all(len(set(res.tags["server_node_ids"].split(","))) == 2 for res in results)
    deadline = time.monotonic() + 10
    while any(pid_alive(s.pid) for s in starts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(s.pid) for s in starts), "a rank outlived its server"


# ---------------------------------------------------------------- faults


def _experiment_runs(tmp_path, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    return [r for r in client.search_runs([exp.experiment_id], max_results=1000)
            if r.data.tags.get("specsweep.role") == "child"]


def _engine_node(pid: int) -> str | None:
    try:
        return proc_env(pid).get("SPECSWEEP_NODE_ID")
    except OSError:
        return None


def test_node_lost_mid_sweep_requeues_and_every_run_finishes_once(sim, tmp_path):
    import threading

    from orchestrator.execution.execute import execute_plan
    from orchestrator.execution.stats import ExecutionStats

    cluster, nodes = sim
    plan = _plan(_groups(3, 4, first_job=500, gen_tokens=80, token_s=0.01, seed0=500), sweep="loss")
    removed = []

    def remove_a_busy_node():
        pid = wait_for_request(os.getpid(), finished={1, 2, 3})  # a group's second or later run is in flight
        node_id = _engine_node(pid)
        victim = next(n for n in nodes if n.node_id == node_id)
        cluster.remove_node(victim)
        removed.append(victim)

    t = threading.Thread(target=remove_a_busy_node, daemon=True)
    t.start()
    stats = ExecutionStats()
    try:
        results = execute_plan(plan, _settings(tmp_path, sweep="loss"), stats=stats)
    finally:
        t.join(30)
        if removed:  # a fresh node with the same label keeps the cluster whole for later tests
            arch = ARCHS[nodes.index(removed[0])]
            nodes[nodes.index(removed[0])] = cluster.add_node(**_node_args(arch))
            cluster.wait_for_nodes()
    assert removed, "no node was removed"
    assert [r.state for r in results] == [RunState.FINISHED] * 12, [(r.run.job_index, r.message) for r in results]
    victim_node = removed[0].node_id
    assert all(r.tags["node_id"] != victim_node for r in results if r.tags["attempt"] != "1")
    children = _experiment_runs(tmp_path, "loss-stub")
    finished = Counter(c.data.tags["run_hash"] for c in children if c.info.status == "FINISHED")
    assert finished == Counter({r.run_hash: 1 for r in plan.runs})
    failed = [c for c in children if c.info.status == "FAILED"]
    assert failed and all(c.data.tags["failure_reason"] == "node_lost" and c.data.tags["retried"] == "true"
                          for c in failed)
    assert victim_node in {c.data.tags["node_id"] for c in failed}  # the run in flight there, at least
    assert stats.attempts_retried == len(failed)


def _driver_cmd(address: str, work_dir: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), address, str(work_dir)]


def test_interrupt_stops_every_engine_and_the_rerun_finishes_only_the_rest(sim, tmp_path):
    cluster, _ = sim
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(_driver_cmd(cluster.address, tmp_path), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_request(os.getpid(), finished=1)  # a group's second run is in flight (the nodes are ours)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0, output[-3000:]
    pids = [s.pid for s in stub_starts(tmp_path)]  # the engines the interrupted driver started (their logs)
    assert pids
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids), "an engine outlived the interrupted driver"
    first = _experiment_runs(tmp_path, "interrupted-stub")
    assert first and {c.info.status for c in first} <= {"FINISHED", "KILLED"}
    done_before = {c.data.tags["run_hash"] for c in first if c.info.status == "FINISHED"}
    assert len(first) == _INT_RUNS * _INT_GROUPS and len(done_before) < len(first)

    again = subprocess.run(_driver_cmd(cluster.address, tmp_path), cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=180)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    report = json.loads(again.stdout.strip().splitlines()[-1])
    assert report["skipped"] == len(done_before) and report["ran"] == len(first) - len(done_before)
    after = _experiment_runs(tmp_path, "interrupted-stub")
    finished = Counter(c.data.tags["run_hash"] for c in after if c.info.status == "FINISHED")
    assert len(finished) == _INT_RUNS * _INT_GROUPS and set(finished.values()) == {1}


_INT_FIRST, _INT_GROUPS, _INT_RUNS = 600, 3, 3


def _interrupt_driver(address: str, work_dir: str) -> None:
    """The driver of the interrupt test: the session's sweep_plan (preflight, resume, claims, execute_plan)."""
    import logging

    from orchestrator.session.sweep import sweep_plan

    logging.basicConfig(level=logging.INFO)
    plan = _plan(_groups(_INT_GROUPS, _INT_RUNS, first_job=_INT_FIRST, gen_tokens=300, token_s=0.01, seed0=600),
                 sweep="interrupted")
    settings = dataclasses.replace(_settings(Path(work_dir), sweep="interrupted"),
                                   cluster=ClusterSettings(kind=ClusterKind.RAY, address=address))
    results, skipped, _ = sweep_plan(plan, settings)
    print(json.dumps({"skipped": skipped, "ran": len(results),
                      "finished": sum(r.state is RunState.FINISHED for r in results)}))


if __name__ == "__main__":
    _interrupt_driver(sys.argv[1], sys.argv[2])


# ---------------------------------------------------------------- pure: needs and fit (no Ray)


def test_server_needs_and_fit_without_ray():
    from orchestrator.execution.preflight import NodeInfo, check_fit, server_needs

    cluster = ClusterSettings(accelerator="sm_90", cpus_per_server=2)
    one, two = stub_server(tp_size=8), stub_server(tp_size=16, nnodes=2, seed=1)
    n1 = server_needs(one, cluster)
    assert (n1.strategy, n1.bundles(), n1.label_selector()) == ("STRICT_PACK", [{"CPU": 2, "GPU": 8.0}],
                                                                [{"gpu-arch": "sm_90"}])
    n2 = server_needs(two, dataclasses.replace(cluster, accelerator=None))
    assert n2.strategy == "STRICT_SPREAD" and n2.bundles() == [{"CPU": 2, "GPU": 8.0}] * 2 and not n2.label_selector()
    fallback = server_needs(one, cluster, AcceleratorMatch.RESOURCE)
    assert fallback.bundle()["accelerator_sm_90"] > 0 and fallback.label_selector() is None
    nodes = [NodeInfo("a", "ip", 8, 4, {"gpu-arch": "sm_120"}), NodeInfo("b", "ip", 8, 4, {"gpu-arch": "sm_90"})]
    g1, g2 = tiny_group(one, [tiny_run(one, 0)]), tiny_group(two, [tiny_run(two, 1)])
    assert check_fit([g1], cluster, nodes)[1] == []
    _, problems = check_fit([g1, g2], cluster, nodes)  # the 2-node server needs two sm_90 nodes
    assert len(problems) == 1 and two.key in problems[0] and "it needs 2" in problems[0]
