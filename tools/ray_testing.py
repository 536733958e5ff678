"""A Ray for tests and benchmarks, on this machine.

    ray_process(num_cpus=4, object_store_mb=128) -> RayProcess(address, pid)   a context manager: a one-node Ray
        (ray.cluster_utils.Cluster head, no GPUs, no dashboard) held by a process of its own; drivers join it
        with ray.init(address=...) or `cluster.kind=ray cluster.address=...`; its engines run below `pid`
    ray_cluster([node_args, ...], object_store_mb=80) -> (Cluster, [node, ...])   a context manager: a
        ray.cluster_utils.Cluster with a 1-CPU head and these nodes, this process connected; shut down after

Imported by tests/ and the benchmarks only, never by product code.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tools.testing import pid_alive, scaled


@contextlib.contextmanager
def ray_cluster(node_args: list[dict[str, Any]], *, object_store_mb: int = 80) -> Iterator[tuple[Any, list[Any]]]:
    """A several-node Ray on this machine (ray.cluster_utils.Cluster): a 1-CPU head without GPUs and one node per
    entry of `node_args` (Cluster.add_node's arguments); this process is connected as the driver."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, num_gpus=0, include_dashboard=False,
                                                                object_store_memory=object_store_mb * 2**20))
    try:
        nodes = [cluster.add_node(**args) for args in node_args]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


@dataclass(frozen=True)
class RayProcess:
    address: str  # the GCS address drivers join
    pid: int  # the holding process: every Ray process of this cluster, and the engines its actors start, run below it


_RAY_HOLDER = """
import os, sys
if os.fork():  # the holder detaches: not a descendant of the test process, whose own children stay its own
    os._exit(0)
from ray.cluster_utils import Cluster

# its dashboard agent on a free port, never Ray's fixed 52365: a Ray with a job server started beside this one
# (the schedule tests, the product's own embedded Ray) needs that port for its job agent
cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=int(sys.argv[1]), num_gpus=0,
                  include_dashboard=False, object_store_memory=int(sys.argv[2]) * 2**20,
                  dashboard_agent_listen_port=int(sys.argv[3])))
print("RAY", cluster.address, os.getpid(), flush=True)
sys.stdin.read()  # until the owner closes stdin (or exits)
cluster.shutdown()
"""


@contextlib.contextmanager
def ray_process(*, num_cpus: int = 4, object_store_mb: int = 128, log: Path | None = None,
                start_timeout_s: float = 120.0) -> Iterator[RayProcess]:
    """A one-node Ray held by a detached process of its own (not by this one, so `ray.shutdown()` here never stops
    it, and not below it, so this process's descendants are only its own); stopped when the block ends: stdin
    closed, then `Cluster.shutdown()` (KILL of the holder's process group after a scaled 60 s)."""
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"))
    err = open(log, "w") if log else subprocess.DEVNULL
    from workers.engine_process import free_port

    proc = subprocess.Popen([sys.executable, "-c", _RAY_HOLDER, str(num_cpus), str(object_store_mb), str(free_port())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                            start_new_session=True)
    proc.wait()  # the forked holder carries on with the pipes
    holder = 0
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + scaled(start_timeout_s)
        line = ""
        while not line.startswith("RAY ") and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
                if not line:
                    break  # the holder exited
        if not line.startswith("RAY "):
            raise RuntimeError(f"the test Ray did not start within {scaled(start_timeout_s):.0f} s"
                               + (f" (log: {log})" if log else ""))
        _, address, pid = line.split()
        holder = int(pid)
        yield RayProcess(address=address, pid=holder)
    finally:
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()
        deadline = time.monotonic() + scaled(60)
        while holder and pid_alive(holder) and time.monotonic() < deadline:
            time.sleep(0.1)
        if holder and pid_alive(holder):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)  # the holder's group: start_new_session made proc.pid its id
        if log:
            err.close()  # type: ignore[union-attr]
