"""A node removed from a real multi-node Ray (`ray.cluster_utils.Cluster`) while its server's run is in flight: the
run is FAILED `node_lost` and says where it ran (node id and IP), which engine served it (pid, log path) and what
that engine logged (the log tail artifact), in the result and in MLflow."""

from __future__ import annotations

import os
import threading
import time

import pytest

from orchestrator.config.plan import Plan
from orchestrator.config.settings import ClusterKind, ClusterSettings, ExecutionSettings, TrackingSettings
from specsweep_common.spec import FailureReason, RunState
from tools.testing import pid_alive, stub_server, tiny_group, tiny_run, wait_for_request
from tools.ray_testing import ray_cluster
from workers.runners import LOG_TAIL_ARTIFACT


ray = pytest.importorskip("ray")


@pytest.fixture
def two_node_cluster():
    """(cluster, gpu node): a CPU head and one node with a logical GPU; the driver is connected."""
    with ray_cluster([dict(num_cpus=2, num_gpus=1, object_store_memory=80 * 2**20)]) as (cluster, (node,)):
        yield cluster, node


def test_a_lost_node_s_run_carries_node_engine_pid_and_log_tail(two_node_cluster, tmp_path):
    from mlflow import MlflowClient

    from orchestrator.execution.execute import execute_plan

    cluster, node = two_node_cluster
    server = stub_server(tp_size=1, token_s=0.02, seed=7)
    plan = Plan(sweep_name="lost", groups=(tiny_group(server, [tiny_run(server, 0, gen_tokens=3000)]),),
                base_config={})
    settings = ExecutionSettings(sweep_name="lost", work_dir=str(tmp_path), progress=False,
                                 tracking=TrackingSettings(uri=f"sqlite:///{tmp_path}/mlflow.db"),
                                 cluster=ClusterSettings(kind=ClusterKind.RAY, max_retries=0))
    engine_pids = []

    def remove_node_mid_run():
        engine_pids.append(wait_for_request(os.getpid(), finished=0, timeout_s=180))  # the cluster's nodes are ours
        time.sleep(0.5)
        cluster.remove_node(node)

    remover = threading.Thread(target=remove_node_mid_run, daemon=True)
    remover.start()
    [result] = execute_plan(plan, settings)
    remover.join(10)
    assert engine_pids, "the run never started"
    assert result.state is RunState.FAILED and result.reason is FailureReason.NODE_LOST, result.message
    assert result.tags["node_id"] == node.node_id and result.tags["node_ip"]
    assert result.tags["engine_pid"] == str(engine_pids[0])
    assert result.tags["engine_log"].endswith(".log")
    tail = result.artifacts[LOG_TAIL_ARTIFACT]
    assert "-m workers.stub.server" in tail and "stub: serving on 127.0.0.1:" in tail, tail[-2000:]
    deadline = time.monotonic() + 15
    while pid_alive(engine_pids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(engine_pids[0]), "the engine outlived its node"

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments() if e.name.startswith("lost")]  # lost-stub
    [child] = [r for r in client.search_runs(experiments) if r.data.tags.get("specsweep.role") == "child"]
    assert child.info.status == "FAILED" and child.data.tags["failure_reason"] == "node_lost"
    assert child.data.tags["node_id"] == node.node_id and child.data.tags["engine_pid"] == str(engine_pids[0])
    assert LOG_TAIL_ARTIFACT in [a.path for a in client.list_artifacts(child.info.run_id)]
