"""The Ray actors of a server, thin shells around the plain-Python runners of `workers.runners` and
`workers.kernel_runner`.

    ServerWorker    rank 0 (the only rank on one node), bundle 0 of the server's placement group: starts the
                    engine, runs the group's RunSpecs in order, stops it (`GroupRunner` / `KernelRunner`)
    NodeWorker      rank > 0 of a multi-node server, in bundle `rank`: starts that rank's engine process with
                    rank 0's rendezvous address (`FollowerRunner`)
    node_tags()     where the calling actor runs (node id and IP, its GPUs, the node's labels)

Each actor's worker process imports this module, so it imports only Ray and the runners (no MLflow, rich or torch).
"""

from __future__ import annotations

import contextlib
import logging
import os

import ray

from specsweep_common.spec import JobKind, RunResult, RunSpec, ServerGroup, ServerSpec
from workers.adapter import NodeRank
from workers.engine_process import free_port
from workers.kernel_runner import KernelRunner
from workers.runners import EngineInfo, FollowerRunner, GroupRunner, JobRunner, Runner

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def runner_for(server: ServerSpec, log_dir: str, *, restarts: int = 1,
               node_tags: dict[str, str] | None = None) -> JobRunner:
    """Rank 0's runner for a server: its engine (GroupRunner) or, for `job=kernel`, kernel shapes (KernelRunner)."""
    if server.job is JobKind.KERNEL:
        return KernelRunner(server, log_dir, node_tags=node_tags)
    return GroupRunner(server, log_dir, restarts=restarts, node_tags=node_tags)


@ray.remote
class ServerWorker:
    """Rank 0 of a server (the only rank on one node): a thin actor around its JobRunner (`runner_for`). Methods
    run on the actor's main thread, one at a time (the engine's parent-death signal follows that thread)."""

    def __init__(self, group: ServerGroup, log_dir: str, restarts: int = 1):
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        self.runner: JobRunner = runner_for(group.server, log_dir, restarts=restarts, node_tags=node_tags())

    def dist_init_addr(self) -> str:
        """rank 0's rendezvous address for a multi-node server: this node's IP and a free port."""
        ip = ray.util.get_node_ip_address()
        return f"{ip}:{free_port('0.0.0.0')}"

    def start(self, dist_init_addr: str | None = None) -> EngineInfo:
        rank = NodeRank(0, self.runner.server.nnodes, dist_init_addr) if dist_init_addr else None
        return self.runner.start(rank)

    def run(self, spec: RunSpec, attempt: int = 1) -> RunResult:
        return self.runner.run(spec, attempt)

    def stop(self) -> EngineInfo:
        return self.runner.stop()


@ray.remote
class NodeWorker:
    """Rank > 0 of a multi-node server, in bundle `rank` of the group's placement group."""

    def __init__(self, group: ServerGroup, log_dir: str, rank: int):
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        self.rank = rank
        self.runner: Runner = FollowerRunner(group.server, log_dir, rank, node_tags=node_tags())

    def start(self, dist_init_addr: str) -> EngineInfo:
        return self.runner.start(NodeRank(self.rank, self.runner.server.nnodes, dist_init_addr))

    def stop(self) -> EngineInfo:
        return self.runner.stop()


def node_tags() -> dict[str, str]:
    """Where this actor runs: Ray node id and IP, its GPUs (CUDA_VISIBLE_DEVICES, set by Ray), the node's
    accelerator label."""
    ctx = ray.get_runtime_context()
    tags = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "gpu_ids": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    with contextlib.suppress(Exception):
        labels = ctx.get_node_labels()
        for key, value in labels.items():
            if not key.startswith("ray.io/"):
                tags[f"node_label.{key}"] = str(value)
    return tags
