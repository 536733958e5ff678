"""Where a firing goes: a Ray job server, reached over HTTP (`JobSubmissionClient`), or a local Ray with its job
server started here when no address is given.

    RayJobBackend(url).submit(submission_id, entrypoint, env, metadata) -> bool   False: Ray knew that id already
    (every HTTP request to the job server has a deadline: Ray's SDK sends its requests without one, so a server that
    accepts and never answers would hang the daemon; it fails with ScheduleError instead)
    job_server(address) -> context manager yielding the job server's URL
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Protocol

from orchestrator.schedules.definition import ScheduleError

log = logging.getLogger(__name__)


class JobBackend(Protocol):
    def submit(self, submission_id: str, entrypoint: str, env: dict[str, str], metadata: dict[str, str]) -> bool:
        """Submit; False when a job with this id already exists (nothing submitted)."""

    def is_running(self, submission_id: str) -> bool: ...


class RayJobBackend:
    """Ray Jobs through `JobSubmissionClient` (address: the job server's http URL)."""

    # The job server answers before its node agent has registered (seconds on a loaded head node).
    AGENT_NOT_READY = "No available agent"

    def __init__(self, address: str, agent_wait_s: float = 60.0, request_timeout_s: float = 30.0):
        self.address = address
        self.agent_wait_s = agent_wait_s
        self.request_timeout_s = request_timeout_s
        self.client = self._call(lambda: _client(address, request_timeout_s))

    def _call(self, fn):
        """One request to the job server, within `request_timeout_s`; a silent server is a ScheduleError."""
        import requests

        try:
            return fn()
        except requests.Timeout as e:
            raise ScheduleError(f"the Ray job server at {self.address} did not answer within "
                                f"{self.request_timeout_s:.0f} s (request_timeout_s)") from e

    def submit(self, submission_id: str, entrypoint: str, env: dict[str, str], metadata: dict[str, str]) -> bool:
        deadline = time.monotonic() + self.agent_wait_s
        while True:
            if self._exists(submission_id):
                return False
            try:
                self._call(lambda: self.client.submit_job(entrypoint=entrypoint, submission_id=submission_id,
                                                          runtime_env={"env_vars": env}, metadata=metadata))
                return True
            except RuntimeError as e:
                if "already exists" in str(e):
                    return False
                if self.AGENT_NOT_READY not in str(e):
                    raise
                if time.monotonic() > deadline:
                    raise ScheduleError(
                        f"the Ray job server at {self.address} has had no job agent for {self.agent_wait_s:.0f} s; "
                        "with the embedded Ray, another Ray instance on this machine may hold the dashboard "
                        "agent's port (52365): stop it or pass --address") from e
                log.info("Ray job server has no agent yet; retrying %s", submission_id)
                time.sleep(1.0)

    def is_running(self, submission_id: str) -> bool:
        try:
            return not self._call(lambda: self.client.get_job_status(submission_id)).is_terminal()
        except RuntimeError as e:
            if "does not exist" in str(e):
                return False
            raise

    def _exists(self, submission_id: str) -> bool:
        try:
            self._call(lambda: self.client.get_job_info(submission_id))
            return True
        except RuntimeError as e:
            if "does not exist" in str(e):
                return False
            raise


def _client(address: str, request_timeout_s: float):
    """Ray's JobSubmissionClient, each of whose HTTP requests carries `timeout=request_timeout_s`.

    Ray's SDK forwards extra keyword arguments of `_do_request` to `requests.request` but its own calls (submit,
    status, info, the version check in the constructor) pass none, so the deadline is added there."""
    from ray.job_submission import JobSubmissionClient

    class BoundedClient(JobSubmissionClient):
        def _do_request(self, method, endpoint, **kwargs):
            kwargs.setdefault("timeout", request_timeout_s)
            return super()._do_request(method, endpoint, **kwargs)

    return BoundedClient(address)


def wait_for_job_server(url: str, timeout_s: float = 90.0) -> None:
    """The dashboard (which hosts the job server) can lag `ray.init` on a loaded machine."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url + "/api/version", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise ScheduleError(f"Ray job server at {url} not reachable within {timeout_s:.0f} s")
        time.sleep(0.5)


@contextlib.contextmanager
def job_server(address: str | None) -> Iterator[str]:
    """Yield a Ray job-server URL: the given one, or a local Ray started here with its job server."""
    if address:
        wait_for_job_server(address)
        yield address
        return
    import ray

    from orchestrator.execution.local_ray import LOOPBACK, init_local_ray
    from workers.engine_process import free_port

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="specsweep-ray-")  # its jobs are handed this Ray, not another on the machine
    ctx = init_local_ray(include_dashboard=True, dashboard_host=LOOPBACK, dashboard_port=free_port(LOOPBACK),
                         log_to_driver=False, configure_logging=False, job_temp_dir=temp_dir)
    try:
        if not ctx.dashboard_url:
            raise ScheduleError("the local Ray started without its dashboard, which hosts the job server "
                                "(is ray[default] installed?)")
        url = "http://" + ctx.dashboard_url
        wait_for_job_server(url)
        log.info("embedded Ray with its job server at %s (jobs end when this process ends)", url)
        yield url
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
