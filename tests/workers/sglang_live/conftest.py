"""A live SGLang server on this machine's CPU (`make test-sglang`, after `make setup-sglang`): every test here is
marked `live_sglang`, and fails, never skips, when SGLang's interpreter is missing or its server cannot start.

Fixtures start the real server the way a sweep does: the config composed from conf/ (`engine=sglang_cpu`), the
ServerSpec the planner builds, the argv and environment of `workers.sglang.adapter.SGLangAdapter`, and
`workers.engine_process.EngineProcess` (its own process group, stopped at teardown, no orphan)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.plan import build_server
from specsweep_common.spec import ServerSpec
from tools.composed_config import compose_run
from workers.engine_process import EngineProcess
from workers.sglang.cpu import read_manifest, sglang_python

HERE = Path(__file__).parent
ROOT_DIR = HERE.parents[2]
# a short context keeps the context-edge prompts cheap on CPU; the probe tests build their own servers
CONTEXT = 512


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.live_sglang)


def live_server_spec(*overrides: str) -> ServerSpec:
    rc = compose_run("engine=sglang_cpu", "attention=torch_native", "drafter=none", "model=smollm2-135m",
                     "page_size=1", f"server_context_len={CONTEXT}", *overrides)
    return build_server(rc)


@pytest.fixture(scope="session", autouse=True)
def _no_triton_interpreter():
    """tests/conftest.py sets TRITON_INTERPRET=1 for the kernel tests; a SGLang server inheriting it would run
    Triton kernels that a user's server cannot (no CPU driver), so the live servers start without it."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    yield
    if saved is not None:
        os.environ["TRITON_INTERPRET"] = saved


@pytest.fixture(scope="session")
def manifest() -> dict:
    spec = live_server_spec()
    python = sglang_python(spec.engine)
    found = read_manifest(python)
    if not Path(python).is_file() or not found.get("models"):
        pytest.fail(f"SGLang's interpreter {python} (or its manifest) is missing: run `make setup-sglang` first")
    return found


@pytest.fixture(scope="session")
def live(manifest, tmp_path_factory) -> Iterator[tuple[ServerSpec, EngineProcess]]:
    """(spec, running engine) of SGLang on CPU without speculation, context CONTEXT, float32."""
    spec = live_server_spec()
    log = tmp_path_factory.mktemp("sglang") / "engine.log"
    with EngineProcess.for_server(spec, log) as engine:
        yield spec, engine
