"""Project-wide test fixtures: one local Ray for the tests that need any Ray, a real MLflow server on loopback and a
real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# Triton picks interpreted or compiled when a kernel is decorated, so this must precede any import of
# `specsweep_kernels.verify_attention`, from whichever test package comes first. On a CUDA machine kernels compile.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tools.testing import scaled  # noqa: E402
from tools.ray_testing import RayProcess, ray_process  # noqa: E402
from tools.ui_pages import mlflow_server  # noqa: E402

# --- tiers: `make test` runs `not slow`; what is slow comes from measured cost (tools/test_tiers.py) ---------------
TIER_COSTS = Path(__file__).with_name("tier_costs.json")


def pytest_collection_modifyitems(config, items):
    """Mark `slow` each test the cost table measured over its line, or in a module whose fixture is the cost;
    `smoke` tests stay fast. Runs before `-m` deselects."""
    if not TIER_COSTS.exists():
        return
    table = json.loads(TIER_COSTS.read_text())
    line, modules, costs = table["slow_over_s"], set(table["slow_modules"]), table["tests"]
    for item in items:
        if item.get_closest_marker("smoke"):
            continue
        if costs.get(item.nodeid, 0.0) > line or item.nodeid.split("::")[0] in modules:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """pytest-timeout's limit scales with the machine's load (`tools.testing.scaled`): a loaded machine makes a
    test slower, never a failure."""
    marker = item.get_closest_marker("timeout")
    base = marker.args[0] if marker and marker.args else item.config.getini("timeout")
    if base:
        item.add_marker(pytest.mark.timeout(scaled(float(base))), append=False)
    yield

@pytest.fixture(scope="session")
def session_ray(tmp_path_factory) -> Iterator[RayProcess]:
    """One local Ray for the whole session, for the tests that need "a Ray" rather than a particular one: a
    one-node cluster (4 CPUs, no GPUs, 128 MB object store, no dashboard) held by a child process
    (`tools.ray_testing.ray_process`), started on first use and shut down at the end of the session. A test joins
    it in-process with `ray.init(address=session_ray.address)` (and `ray.shutdown()` only disconnects), a
    sweep subprocess with `cluster.kind=ray cluster.address=<address>`; the engines its actors start run below
    `session_ray.pid`. Tests about how Ray is started or about a topology (the product's own `cluster=local`
    start, ray_cluster's several nodes, a job server) start their own."""
    with ray_process(num_cpus=4, object_store_mb=128, log=tmp_path_factory.mktemp("session-ray") / "holder.log") as r:
        yield r


TEST_ARTIFACTS = Path(os.environ.get("SPECSWEEP_TEST_ARTIFACTS", "test-artifacts"))


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium; in CI (.ci/run installs it) a missing browser is a failure, elsewhere a skip."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing in CI: .ci/run must `apt-get install -y chromium`")
        pytest.skip("Chromium is not installed (apt-get install -y chromium); the browser test needs it")
    return path


@pytest.fixture
def test_artifacts() -> Path:
    """Where tests leave files for a person to look at (screenshots): ./test-artifacts/ or $SPECSWEEP_TEST_ARTIFACTS."""
    return TEST_ARTIFACTS


@pytest.fixture
def browser(chromium, tmp_path):
    """A headless Chromium driven over DevTools (tools/browser.py), fresh profile; closed after the test."""
    from tools.browser import Browser

    with Browser(chromium, tmp_path / "chromium-profile") as b:
        yield b


@pytest.fixture
def mlflow_ui():
    """The `mlflow_server(backend_store_uri, artifacts_dir)` context manager."""
    return mlflow_server
