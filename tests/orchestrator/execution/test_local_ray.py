"""The embedded Ray with a foreign `ray start --head` running on the same machine: the sweep's Ray, the schedule
daemon's Ray and the Ray Jobs it submits never join the foreign one, and the embedded Ray listens on 127.0.0.1
only. The foreign Ray is stopped by its own processes (never `ray stop`: other Rays may run on this machine)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.engine_process import free_port


ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

LOOPBACK_IPS = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
ADDRESS_FILE = Path("/tmp/ray/ray_current_cluster")  # what a bare ray.init() joins


def _session_processes(session: str) -> list[psutil.Process]:
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(session in arg for arg in p.info["cmdline"] or ()):
                procs.append(p)
    return procs


def _session_of_gcs(port: int) -> str | None:
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if f"--gcs_server_port={port}" in cmd:
            return next((a.split("=", 1)[1] for a in cmd if a.startswith("--session-name=")), None)
    return None


@pytest.fixture
def foreign_ray(tmp_path):
    """A `ray start --head` as another user of the machine would run it; yields its GCS address."""
    previous = ADDRESS_FILE.read_text() if ADDRESS_FILE.exists() else None
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
                          "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats",
                          f"--dashboard-agent-listen-port={free_port()}", "--object-store-memory=80000000"],
                         env=env, capture_output=True, text=True, timeout=120)
    session = _session_of_gcs(port)
    try:
        assert out.returncode == 0 and session, out.stdout[-2000:] + out.stderr[-2000:]
        address = re.search(r"ray start --address='([^']+)'", out.stdout)
        assert address and ADDRESS_FILE.read_text().strip() == address.group(1)
        yield address.group(1)
    finally:
        procs = _session_processes(session) if session else []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if previous is None:
            ADDRESS_FILE.unlink(missing_ok=True)
        else:
            ADDRESS_FILE.write_text(previous)


AGENT_PORT = 52365  # Ray's dashboard agent (job agent) port: fixed, no ray.init option


def _agent_port_holder(exclude: set[int]) -> str:
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port == AGENT_PORT and c.pid and c.pid not in exclude:
            with contextlib.suppress(psutil.Error):
                return f"pid {c.pid}: {' '.join(psutil.Process(c.pid).cmdline())[:120]}"
    return ""


def _listening(procs) -> set[tuple[str, str, int]]:
    out = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add((p.name(), c.laddr.ip, c.laddr.port))
    return out


def test_the_sweeps_ray_is_its_own_and_listens_on_loopback_only(foreign_ray):
    from orchestrator.execution.ray_connection import connect_ray, shutdown_ray
    from orchestrator.config.settings import ClusterSettings

    if ray.is_initialized():
        ray.shutdown()
    assert connect_ray(ClusterSettings(num_cpus=1, object_store_memory_mb=80))
    try:
        ctx = ray.get_runtime_context()
        assert ctx.gcs_address != foreign_ray and ctx.gcs_address.startswith("127.0.0.1:")
        assert ray.util.get_node_ip_address() == "127.0.0.1"
        session = Path(ray._private.worker._global_node.get_session_dir_path()).name
        procs = _session_processes(session) + [psutil.Process()]
        names = {p.name() for p in procs}
        assert {"gcs_server", "raylet"} <= names, names
        listening = _listening(procs)
        gcs_port = int(ctx.gcs_address.rsplit(":", 1)[1])
        assert any(name == "gcs_server" and port == gcs_port for name, _, port in listening), listening
        assert any(name == "raylet" for name, _, _ in listening), listening
        exposed = {entry for entry in listening if entry[1] not in LOOPBACK_IPS}
        assert not exposed, f"listening beyond loopback: {sorted(exposed)}"
    finally:
        shutdown_ray()
    assert _session_of_gcs(int(foreign_ray.rsplit(":", 1)[1])), "the foreign Ray must be left running"


def test_the_schedule_daemons_ray_and_its_jobs_are_its_own(foreign_ray):
    from ray.job_submission import JobSubmissionClient

    from orchestrator.schedules.ray_jobs import job_server

    if ray.is_initialized():
        ray.shutdown()
    with job_server(None) as url:
        ours = ray.get_runtime_context().gcs_address
        assert ours != foreign_ray
        client = JobSubmissionClient(url)
        entrypoint = f"{sys.executable} -c \"import ray; ray.init(); print('GCS', ray.get_runtime_context().gcs_address)\""
        deadline = time.monotonic() + 120
        while True:  # the job agent can register well after the job server answers (a loaded machine)
            try:
                job = client.submit_job(entrypoint=entrypoint)
                break
            except RuntimeError as e:
                if time.monotonic() > deadline:
                    session = Path(ray._private.worker._global_node.get_session_dir_path()).name
                    holder = _agent_port_holder(exclude={p.pid for p in _session_processes(session)})
                    if "No available agent" in str(e) and holder:
                        pytest.skip(f"another Ray on this machine holds the job agent's port {AGENT_PORT} "
                                    f"({holder}); ray.init cannot move it")
                    raise
                time.sleep(2)
        while not client.get_job_status(job).is_terminal():
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(1)
        logs = client.get_job_logs(job)
        assert f"GCS {ours}" in logs, logs[-2000:]
    assert not ray.is_initialized()
