"""The driver's Ray connection: connected once per invocation, with the Ray preflight, and shut down by whoever
started it.

    ray_session(cluster, groups, stats=None) -> RaySession   (a context manager)
        connect (or reuse) Ray, then the preflight (`orchestrator.execution.preflight.check_placement`: PreflightError before
        MLflow or any engine) and, for specsweep_verify servers, the plugin preflight on each node that could host
        one (`orchestrator.execution.plugin_preflight`); on exit shuts Ray down if this call started it. The launcher opens one and hands it
        to `run_plan`; `run_plan` called on its own opens its own.
    connect_ray(cluster, gpus_needed=0) -> bool   True when this call started Ray (and must shut it down); an
                                                  embedded Ray that times out starting is retried once, then
                                                  RayStartFailed (one line: what happened, what to do)
    shutdown_ray()                                `ray.shutdown()` without its 1 s stall on the autoscaler monitor
    bundle_nodes(pg) -> [node_id, ...]            where a placement group's bundles landed

An existing connection is used as is; otherwise `cluster.kind=local` starts an embedded Ray of its own, listening
on 127.0.0.1 only (`orchestrator.execution.local_ray`; logical GPUs when the machine has none but a server asks for
some),
`cluster.kind=ray` connects to `cluster.address`, and a driver running as a Ray Job joins that job's cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table

from orchestrator.execution.local_ray import init_local_ray
from orchestrator.execution.plugin_preflight import check_plugin_nodes
from orchestrator.execution.preflight import Preflight, check_placement, gpus_per_node
from orchestrator.execution.signals import interrupt_for
from orchestrator.config.settings import ClusterKind, ClusterSettings
from orchestrator.execution.stats import ExecutionStats
from specsweep_vocab.spec import ServerGroup

logger = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_MB = 128  # results are small; Ray's default (30% of RAM) only slows start-up
# Ray 2.60's Node waits a hard-coded 30 s (`raylet_start_wait_time_s = 30`, ray/_private/node.py:428, not read from
# any setting) for the raylet to register, then raises this message (node.py:439-444): a busy host misses it once.
RAYLET_START_WAIT_S = 30
RAY_START_TIMEOUT = "timed out during startup"


class RayStartFailed(RuntimeError):
    """Ray itself could not start (after one retry) or be reached: one line saying what happened and what to do."""


@dataclass(frozen=True)
class RaySession:
    preflight: Preflight  # how each server is placed on this cluster
    started: bool  # this process started the Ray (and shuts it down at the end of the session)


@contextlib.contextmanager
def ray_session(cluster: ClusterSettings, groups: Sequence[ServerGroup],
                stats: ExecutionStats | None = None) -> Iterator[RaySession]:
    """Connect (or reuse) Ray and run the preflight; shuts down only what it started. `stats` gets `ray_init_s`,
    `ray_shutdown_s` and the marks `ray_up`, `ray_down`."""
    stats = stats if stats is not None else ExecutionStats()
    t = time.perf_counter()
    started = connect_ray(cluster, max((gpus_per_node(g.server, cluster) for g in groups), default=0))
    stats.ray_init_s = time.perf_counter() - t
    stats.mark("ray_up")
    try:
        preflight = check_placement(groups, cluster)
        check_plugin_nodes(groups, cluster, preflight)  # attention=specsweep_verify: SGLang's interpreter, per node
        yield RaySession(preflight, started)
    finally:
        if started:
            logger.info("stopping Ray")
            t = time.perf_counter()
            shutdown_ray()
            stats.ray_shutdown_s = time.perf_counter() - t
            stats.mark("ray_down")


def _visible_gpus() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def connect_ray(cluster: ClusterSettings, gpus_needed: int = 0) -> bool:
    """Connect or start Ray; True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    common: dict[str, Any] = dict(namespace=cluster.namespace, log_to_driver=False, configure_logging=False,
                                  runtime_env=cluster.runtime_env)
    if cluster.kind is ClusterKind.RAY:
        try:
            ray.init(address=cluster.address or "auto", **common)
        except (ConnectionError, TimeoutError) as e:
            raise RayStartFailed(f"cluster.address={cluster.address or 'auto'!r} (cluster=ray) cannot be reached: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; start Ray there first "
                                 "(`ray start --head`), or run with cluster=local") from None
        return True
    if os.environ.get("RAY_ADDRESS", "local") != "local":
        # A sweep submitted as a Ray Job (orchestrator.schedule) runs inside that job's cluster.
        ray.init(**common)
        return True
    num_gpus = cluster.num_gpus if cluster.num_gpus is not None else max(_visible_gpus(), gpus_needed)
    mb = cluster.object_store_memory_mb or LOCAL_OBJECT_STORE_MB
    # its own Ray on loopback, never one already on the machine (orchestrator.execution.local_ray)
    # ray.init replaces the SIGTERM handler by its own `sys.exit(signum)` (ray/_private/worker.py:1675-1679): ours
    # (an interrupt, cleaned up) comes back after each attempt; a SIGTERM during the start is an interrupt too
    on_sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    for attempt in (1, 2):
        try:
            _start_once(on_sigterm, num_cpus=cluster.num_cpus, num_gpus=num_gpus, object_store_memory=mb * 2**20,
                        include_dashboard=cluster.include_dashboard, **common)
            return True
        except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C or SIGTERM while Ray starts: stop what of it started
            with contextlib.suppress(Exception):
                shutdown_ray()
            if isinstance(e, SystemExit) and e.code == signal.SIGTERM:
                raise interrupt_for(signal.SIGTERM) from None
            raise
        except Exception as e:
            if RAY_START_TIMEOUT not in str(e):
                raise
            with contextlib.suppress(Exception):
                shutdown_ray()  # whatever of this attempt's Ray did start
            load = _load()
            if attempt == 1:
                logger.warning("Ray's own start timed out (its raylet did not register within Ray's fixed %d s; "
                               "load %s); retrying once", RAYLET_START_WAIT_S, load)
                continue
            raise RayStartFailed(
                f"the embedded Ray (cluster=local) did not start, twice: its raylet did not register with its GCS "
                f"within Ray's fixed {RAYLET_START_WAIT_S} s (ray/_private/node.py), load {load}; nothing was "
                "recorded. Run again when the machine is less busy, or start Ray beforehand (`ray start --head`) "
                "and run with cluster=ray cluster.address=auto") from None
    return True


def _start_once(on_sigterm: Any, **kwargs: Any) -> None:
    try:
        init_local_ray(**kwargs)
    finally:
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def shutdown_ray() -> None:
    """`ray.shutdown()`, without Ray's 1 s stall on its autoscaler monitor when this process started the Ray.

    Ray stops the processes of the node it started one after another, raylet and GCS first, each with SIGTERM
    and up to 1 s of grace before SIGKILL. The autoscaler monitor's SIGTERM handler reports its "failure" to the
    GCS, which is gone by then, so it never exits within the grace and is SIGKILLed after a full second (Ray
    2.60: 1.0 of the 1.4 s of `ray.shutdown()` on a 2-core VM). The monitor holds no state and a single-node
    embedded Ray never autoscales: it gets that SIGKILL up front (and is reaped), then `ray.shutdown()` stops
    everything else exactly as before. Connected to a Ray started elsewhere, this is plain `ray.shutdown()`."""
    with contextlib.suppress(Exception):  # Ray internals: if they are not as expected, plain ray.shutdown()
        from ray._private import ray_constants
        from ray._private.worker import _global_node as node

        if node is not None and node.head:
            for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
                if info.process.poll() is None:
                    info.process.kill()
                    info.process.wait(timeout=5)
    ray.shutdown()


def bundle_nodes(pg: PlacementGroup) -> list[str]:
    """The node id of each bundle of `pg`, in bundle order; [] when Ray cannot say."""
    try:
        where = placement_group_table(pg).get("bundles_to_node_id") or {}
    except Exception:  # a table read must never fail the sweep; the tag is only missing
        return []
    return [where[i] for i in sorted(where)]
