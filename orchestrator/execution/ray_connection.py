"""The driver's Ray connection: connected once per invocation, with the Ray preflight, and shut down by whoever
started it.

    ray_connection(cluster, groups, stats=None) -> RayConnection   (a context manager)
        connect (or reuse) Ray, then the preflight (`orchestrator.execution.preflight.check_placement`: PreflightError before
        MLflow or any engine) and, for specsweep_verify servers, the plugin preflight on each node that could host
        one (`orchestrator.execution.plugin_preflight`); on exit shuts Ray down if this call started it. The launcher opens one and hands it
        to `run_plan`; `run_plan` called on its own opens its own.
    connect_ray(cluster, gpus_needed=0) -> bool   True when this call started Ray (and must shut it down); an
                                                  embedded Ray that times out starting is retried once, then
                                                  RayStartFailed (one line: what happened, what to do); a Ctrl-C or
                                                  SIGTERM during the start ends it, even one Ray's start swallowed
    shutdown_ray(interrupted=False)               `ray.shutdown()` without its 1 s stall on the autoscaler monitor;
                                                  interrupted: bounded by RAY_STOP_WAIT_S, else Ray is abandoned
    bounded_ray_call(fn, what) -> bool            fn() in a thread, waited for RAY_STOP_WAIT_S; False (and Ray
                                                  abandoned) when it did not return: its GCS is gone
    ray_abandoned() -> bool                       Ray stopped answering while the sweep stopped: the process must
                                                  exit without Ray's own shutdown (`os._exit`, see __main__)
    bundle_nodes(pg) -> [node_id, ...]            where a placement group's bundles landed

Interrupts: a SIGTERM sent to the driver's process group (a batch system, `kill -- -PGID`) reaches the Ray
processes this driver started too, and its GCS is gone at once: every Ray call then blocks for Ray's 60 s GCS
reconnection and the process is ended by Ray's C++ (exit 1, runs left RUNNING). So every Ray call made while the
sweep stops is bounded (RAY_STOP_WAIT_S); past it, Ray is abandoned: its local processes are killed, its own
shutdown (atexit included) is skipped, and `python -m orchestrator` ends with `os._exit` after the MLflow runs are
closed.

An existing connection is used as is; otherwise `cluster.kind=local` starts an embedded Ray of its own, listening
on 127.0.0.1 only (`orchestrator.execution.local_ray`; logical GPUs when the machine has none but a server asks for
some),
`cluster.kind=ray` connects to `cluster.address`, and a driver running as a Ray Job joins that job's cluster.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table

from orchestrator.execution.local_ray import init_local_ray
from orchestrator.execution.plugin_preflight import check_plugin_nodes
from orchestrator.execution.preflight import Preflight, check_placement, gpus_per_node
from orchestrator.execution.signals import interrupt_for
from orchestrator.config.settings import ClusterKind, ClusterSettings
from orchestrator.execution.stats import ExecutionStats
from specsweep_common.spec import ServerGroup

logger = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_MB = 128  # results are small; Ray's default (30% of RAM) only slows start-up
# Ray 2.60's Node waits a hard-coded 30 s (`raylet_start_wait_time_s = 30`, ray/_private/node.py:428, not read from
# any setting) for the raylet to register, then raises this message (node.py:439-444): a busy host misses it once.
RAYLET_START_WAIT_S = 30
RAY_START_TIMEOUT = "timed out during startup"
# How long a Ray call made while the sweep stops (killing actors, shutting Ray down) may take before Ray is taken to
# be gone (its GCS stopped by the same signal). Ray answers these in well under a second when it is alive (2-core VM).
RAY_STOP_WAIT_S = 5.0
RESIGNAL_S = 0.5  # an interrupt Ray's start swallowed is raised again this often until the start is left
_abandoned = threading.Event()


class RayStartFailed(RuntimeError):
    """Ray itself could not start (after one retry) or be reached: one line saying what happened and what to do."""


@dataclass(frozen=True)
class RayConnection:
    preflight: Preflight  # how each server is placed on this cluster
    started: bool  # this process started the Ray (and shuts it down when the connection is closed)


@contextlib.contextmanager
def ray_connection(cluster: ClusterSettings, groups: Sequence[ServerGroup],
                   stats: ExecutionStats | None = None) -> Iterator[RayConnection]:
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
        yield RayConnection(preflight, started)
    except BaseException as e:
        if started:
            shutdown_ray(interrupted=isinstance(e, KeyboardInterrupt))
        raise
    else:
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
    # ray.init replaces the SIGTERM handler by its own `sys.exit(signum)` (ray/_private/worker.py:1675-1679) and its
    # start path can swallow a KeyboardInterrupt raised inside it: `_signals_seen` keeps our handlers and remembers
    # every SIGINT/SIGTERM of the start, which then ends it however Ray took it
    for attempt in (1, 2):
        seen: list[int] = []
        try:
            with _signals_seen(seen):
                init_local_ray(num_cpus=cluster.num_cpus, num_gpus=num_gpus, object_store_memory=mb * 2**20,
                               include_dashboard=cluster.include_dashboard, **common)
            if seen:  # an interrupt Ray's start swallowed
                raise interrupt_for(seen[0])
            return True
        except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C or SIGTERM while Ray starts: stop what started
            shutdown_ray(interrupted=True)
            if isinstance(e, SystemExit):
                raise interrupt_for(seen[0] if seen else signal.SIGTERM) from None
            raise
        except Exception as e:
            if seen:
                shutdown_ray(interrupted=True)
                raise interrupt_for(seen[0]) from None
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


@contextlib.contextmanager
def _signals_seen(seen: list[int]) -> Iterator[None]:
    """While Ray starts (main thread only): SIGINT and SIGTERM raise as usual (`interrupt_for`) and are also listed,
    so that an interrupt Ray's start swallowed still ends it; Ray's own SIGTERM handler is not installed meanwhile
    (`ray._private.utils.set_sigterm_handler`, called by ray.init, is a no-op for the duration). A swallowed
    interrupt is raised again every RESIGNAL_S until one leaves Ray's start: a signal to the whole process group
    stops the raylet too, and Ray would otherwise wait its fixed 30 s for the raylet before giving up. The repeats
    and our handlers end as soon as the start is left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from ray._private import utils as ray_utils

    left = threading.Event()

    def handler(signum: int, frame: object) -> None:
        seen.append(signum)
        if not left.is_set():
            raise interrupt_for(signum)

    def again() -> None:
        # Python's own handler, not a new OS signal: by now Ray's C++ start may have installed its failure-signal
        # handler, which turns a delivered SIGTERM into an abort (exit -6) instead of our clean exit 143
        while not left.wait(RESIGNAL_S):
            if seen:
                _thread.interrupt_main(signal.Signals(seen[0]))

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    ray_set = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda _handler: None
    threading.Thread(target=again, name="ray-start-interrupt", daemon=True).start()
    try:
        yield
    finally:
        left.set()
        if seen:  # the sweep ends: a Ray interrupted while it started is abandoned (its exit can abort or crash)
            _abandon_ray()
        ray_utils.set_sigterm_handler = ray_set
        for sig, h in previous.items():
            signal.signal(sig, h)


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def ray_abandoned() -> bool:
    """Ray stopped answering while the sweep stopped (bounded_ray_call): exit without Ray's shutdown."""
    return _abandoned.is_set()


def bounded_ray_call(fn: Callable[[], object], what: str, *, watch_node: bool = True) -> bool:
    """`fn()` (Ray calls made while the sweep stops) in a daemon thread, waited for RAY_STOP_WAIT_S, or only until a
    process of the Ray node this process started is seen to exit (`_node_hit`; `watch_node`: not for Ray's own
    shutdown, which stops them). False when it did not return in time, or Ray was abandoned already: Ray is then abandoned (`_abandon_ray`)."""
    if _abandoned.is_set():
        return False
    if _node_hit():
        _abandon_ray()
        return False
    done = threading.Event()

    def call() -> None:
        try:
            fn()
        except Exception as e:  # a Ray error while stopping changes nothing of what is closed
            logger.debug("%s: %s", what, e)
        finally:
            done.set()

    threading.Thread(target=call, name=f"ray-stop:{what}", daemon=True).start()
    deadline = time.monotonic() + RAY_STOP_WAIT_S
    while time.monotonic() < deadline and not (watch_node and _node_hit()):
        if done.wait(0.1):
            return True
    logger.warning("Ray did not answer %s (the signal reached Ray's own processes too, as a signal to the whole "
                   "process group does; waited at most %.0f s); leaving Ray without its shutdown", what,
                   RAY_STOP_WAIT_S)
    _abandon_ray()
    return False


def _node_hit() -> bool:
    """A process of the Ray node this process started has exited: the signal that stops the sweep reached Ray too
    (on SIGTERM its dashboard and log monitor exit at once, while its GCS and raylet stay up but answer nothing;
    2-core VM, Ray 2.60). A Ray this process connected to: never known here, False."""
    with contextlib.suppress(Exception):
        from ray._private.worker import _global_node as node

        if node is not None and node.head:
            return any(info.process.poll() is not None for infos in node.all_processes.values() for info in infos)
    return False


def _abandon_ray() -> None:
    """Kill the Ray processes this driver started, without a word to its GCS, and keep Ray's own shutdown (which
    would wait for the GCS) from running at exit."""
    _abandoned.set()
    with contextlib.suppress(Exception):
        atexit.unregister(ray.shutdown)
    with contextlib.suppress(Exception):
        from ray._private.worker import _global_node as node

        if node is not None and node.head:
            procs = [info.process for infos in node.all_processes.values() for info in infos]
            _kill_trees([p.pid for p in procs if p.poll() is None])
            for p in procs:
                with contextlib.suppress(Exception):
                    p.wait(timeout=1)


def _kill_trees(pids: list[int]) -> None:
    """SIGKILL these processes and everything below them (the raylet's workers and agents, and below the workers the
    engines), read from /proc (Linux; elsewhere only the roots)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{entry}/stat") as f:
                        children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    todo, victims = list(pids), []
    while todo:
        pid = todo.pop()
        victims.append(pid)
        todo += children.get(pid, [])
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def shutdown_ray(interrupted: bool = False) -> None:
    """`ray.shutdown()`, without Ray's 1 s stall on its autoscaler monitor when this process started the Ray.

    Ray stops the processes of the node it started one after another, raylet and GCS first, each with SIGTERM
    and up to 1 s of grace before SIGKILL. The autoscaler monitor's SIGTERM handler reports its "failure" to the
    GCS, which is gone by then, so it never exits within the grace and is SIGKILLed after a full second (Ray
    2.60: 1.0 of the 1.4 s of `ray.shutdown()` on a 2-core VM). The monitor holds no state and a single-node
    embedded Ray never autoscales: it gets that SIGKILL up front (and is reaped), then `ray.shutdown()` stops
    everything else exactly as before. Connected to a Ray started elsewhere, this is plain `ray.shutdown()`.

    `interrupted`: the sweep is stopping on a signal that may have stopped Ray's GCS too: bounded (bounded_ray_call)."""
    if interrupted:
        bounded_ray_call(_shutdown_ray, "ray.shutdown()", watch_node=False)
        return
    _shutdown_ray()


def _shutdown_ray() -> None:
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
