"""The resources a sweep needs besides the tracking store, opened before Ray starts, each failure one line naming
its key (the store: `orchestrator.results.store_probe`).

    work_dir_problem(work_dir, runs) -> str | None     writable, and room for the sweep's logs and store (the
                                                       estimate is shown)
    ray_address_problem(address, budget_s) -> str | None   cluster.address answers a TCP connect within the deadline
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import urllib.parse

RUN_BYTES = 2 * 2 ** 20  # per run: engine log tail, continuation and steps artifacts, the store's rows (generous)
BASE_BYTES = 64 * 2 ** 20  # the store itself and Hydra's sweep record
RAY_CLIENT_PORT, GCS_PORT = 10001, 6379
ADDRESS_PROBE_S = 5.0


def work_dir_problem(work_dir: str, runs: int) -> str | None:
    need = BASE_BYTES + runs * RUN_BYTES
    if not os.path.isdir(work_dir):
        return f"working directory {work_dir!r} does not exist"
    try:
        with tempfile.NamedTemporaryFile(dir=work_dir, prefix=".specsweep-write-check-"):
            pass
    except OSError as e:
        return f"working directory {work_dir!r} is not writable ({e.strerror or e}): the store and logs go there"
    free = shutil.disk_usage(work_dir).free
    if free < need:
        return (f"working directory {work_dir!r} has {free / 2 ** 20:.0f} MiB free; the sweep needs about "
                f"{need / 2 ** 20:.0f} MiB ({runs} run(s) x {RUN_BYTES // 2 ** 20} MiB of logs and artifacts + "
                f"{BASE_BYTES // 2 ** 20} MiB for the store)")
    return None


def ray_address_problem(address: str | None, budget_s: float = ADDRESS_PROBE_S) -> str | None:
    """None for `auto` (Ray finds the local cluster itself) or an address that accepts a connection in time."""
    if not address or address == "auto":
        return None
    url = urllib.parse.urlsplit(address if "://" in address else f"gcs://{address}")
    port = url.port or (RAY_CLIENT_PORT if url.scheme == "ray" else GCS_PORT)
    try:
        socket.create_connection((url.hostname or "", port), timeout=budget_s).close()
    except OSError as e:
        return (f"cluster.address={address!r} does not answer on {url.hostname}:{port} within {budget_s:g} s "
                f"({e.strerror or type(e).__name__}); start the cluster first (`ray start --head`) or use "
                "cluster=local")
    return None
