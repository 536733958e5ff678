"""The embedded local Ray: always a fresh instance started by this process, never one already running on the
machine, and reachable from this machine only.

    init_local_ray(*, job_temp_dir=None, **ray_init_kwargs) -> RayContext
        ray.init(address="local", ...) with every Ray server (GCS, raylet, object manager, workers, agents)
        listening on 127.0.0.1: an embedded Ray runs with auth disabled, so it must not listen on the network.
        job_temp_dir: for a Ray that runs Ray Jobs (the schedule daemon), its own temp dir, where this Ray's
        address is recorded: Ray's job supervisor hands each job the Ray recorded in the node's temp dir
        (`canonicalize_bootstrap_address_or_die("auto", temp_dir)`), which in the shared /tmp/ray is the
        latest `ray start` on the machine, not this one.

A bare `ray.init()` joins the Ray that a `ray start` on this machine recorded in /tmp/ray/ray_current_cluster;
`address="local"` never does. Tests and the schedule daemon start their Ray through here.

Loopback binding: Ray binds its servers to the node IP, and replaces a loopback `_node_ip_address` with the
machine's address (`services.resolve_ip_for_localhost`) unless Ray clusters are disabled
(`ray_constants.ENABLE_RAY_CLUSTER`, off by default on macOS and Windows). That switch is turned off for the
duration of `ray.init` only, in this process and (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) in the Ray processes it
starts, whose dashboard and job agent must agree on the node IP; a single-node embedded Ray has no other node
to reach.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Iterator, cast

if TYPE_CHECKING:
    from ray._private.worker import RayContext

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
BANNER_LOGGER = "ray._private.authentication.authentication_token_setup"  # its token-auth warnings


@contextlib.contextmanager
def _single_machine_mode() -> Iterator[None]:
    from ray._private import ray_constants

    previous = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"  # for the Ray processes started now
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous[0]
        if previous[1] is None:
            os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
        else:
            os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = previous[1]


@contextlib.contextmanager
def _no_token_auth_banner() -> Iterator[None]:
    """Ray 2.60 warns on every new local cluster whether token auth is on or off, unless RAY_AUTH_MODE is set
    (`enable_token_auth_by_default`, ray/_private/worker.py:1873; the warnings in ray/_private/authentication/
    authentication_token_setup.py:71-89). This Ray listens on loopback only and its mode is Ray's own default:
    only the banner goes, for the duration of the start."""
    banner = logging.getLogger(BANNER_LOGGER)
    level = banner.level
    banner.setLevel(logging.ERROR)
    try:
        yield
    finally:
        banner.setLevel(level)


def init_local_ray(*, job_temp_dir: str | None = None, **kwargs):
    """A new single-node Ray on loopback; `kwargs` go to `ray.init` (not `address`, `_node_ip_address`, `_temp_dir`)."""
    import ray
    from ray._private.utils import write_ray_address

    for key in ("address", "_node_ip_address", "_temp_dir"):
        if key in kwargs:
            raise TypeError(f"init_local_ray sets {key} itself")
    if job_temp_dir is not None:
        kwargs["_temp_dir"] = job_temp_dir
    with _single_machine_mode(), _no_token_auth_banner():
        # address="local" gives a RayContext (only a ray:// address gives a ClientContext)
        ctx = cast("RayContext", ray.init(address="local", _node_ip_address=LOOPBACK, **kwargs))
    if job_temp_dir is not None:
        gcs_address = ctx.address_info["gcs_address"]
        if gcs_address is None:
            raise RuntimeError("ray.init(address='local') returned no gcs_address")
        write_ray_address(gcs_address, job_temp_dir)
    logger.debug("embedded Ray on %s", ctx.address_info.get("gcs_address"))
    return ctx
