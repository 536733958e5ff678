"""engine=sglang_cpu's plan-time rules (workers/sglang/cpu.py) against SGLang 0.5.18's own code in its own
interpreter: the argv our adapter builds is parsed and resolved by SGLang (`workers.sglang.argcheck`), and a point
we accept runs with the backend it asks for; on a host without AMX the speculative server is started to show the
failure the rule prevents."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest

from orchestrator.config.plan import build_server
from specsweep_common.spec import EngineKind
from tools.composed_config import compose_run
from workers.engine_process import EngineProcess
from workers.errors import EngineStartFailed
from workers.registry import adapter_for
from workers.sglang.cpu import cpu_env, host_has_amx, sglang_python

from .conftest import CONTEXT, ROOT_DIR, live_server_spec

COMBOS = [(backend, drafter) for backend in ("intel_amx", "torch_native") for drafter in ("none", "ngram", "oracle")]


def _point(backend: str, drafter: str):
    return compose_run("engine=sglang_cpu", f"attention={backend}", f"drafter={drafter}", "model=smollm2-135m",
                       "page_size=1", f"server_context_len={CONTEXT}")


def _sglang_resolves(manifest, argvs: dict[str, list[str]]) -> dict[str, dict]:
    """SGLang 0.5.18's prepare_server_args + resolve_once on each argv, in its interpreter, CPU platform on."""
    lines = "".join(json.dumps({"id": k, "argv": v}) + "\n" for k, v in argvs.items())
    env = {**os.environ, **cpu_env(), "PYTHONPATH": f"{ROOT_DIR}:{ROOT_DIR / 'kernels'}"}
    out = subprocess.run([manifest["python"], "-m", "workers.sglang.argcheck"], input=lines, text=True,
                         capture_output=True, env=env, timeout=900, cwd=ROOT_DIR)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert rows[0]["sglang_version"] == "0.5.18"
    return {row["id"]: row for row in rows[1:]}


def test_cpu_verdict_equals_sglang_0_5_18(manifest):
    """For each backend x drafter: our rules refuse attention.backend exactly when SGLang would run another backend
    than asked (its AMX fallback), and every argv of a point we accept passes SGLang's parser and resolution."""
    adapter = adapter_for(EngineKind.SGLANG)
    verdicts, argvs = {}, {}
    for backend, drafter in COMBOS:
        rc = _point(backend, drafter)
        problems = adapter.plan_problems(rc)
        verdicts[backend, drafter] = {p.key for p in problems}
        argv = adapter.build_argv(build_server(rc), 30000)
        argvs[f"{backend}/{drafter}"] = argv[argv.index("-m") + 2:]
    resolved = _sglang_resolves(manifest, argvs)
    amx = host_has_amx()
    for (backend, drafter), keys in verdicts.items():
        row = resolved[f"{backend}/{drafter}"]
        if "attention.backend" not in keys and "drafter.algorithm" not in keys:
            assert row["ok"], (backend, drafter, row["error"])
            assert row["resolved"]["attention_backend"] == backend, (backend, drafter, row)
        if row["ok"] and row["resolved"]["attention_backend"] != backend:
            assert "attention.backend" in keys, (backend, drafter, "SGLang would rewrite it; we let it through")
        if drafter != "none":
            assert ("drafter.algorithm" in keys) is (not amx), (backend, drafter, keys)


def test_speculation_without_amx_fails_at_the_first_verify(manifest, tmp_path):
    """Why drafter=ngram is refused on a host without AMX: SGLang's server, started anyway (bypassing our rules),
    replaces intel_amx by torch_native and dies in its warm-up's first TARGET_VERIFY batch. On an AMX host the
    same server serves and the rule lets it through."""
    spec = live_server_spec("drafter=ngram")
    spec = replace(spec, attention=replace(spec.attention, name="intel_amx", backend="intel_amx"))
    if host_has_amx():
        with EngineProcess.for_server(spec, tmp_path / "engine.log") as engine:
            assert engine.healthy()
        return
    with pytest.raises(EngineStartFailed) as info:
        EngineProcess.for_server(spec, tmp_path / "engine.log").start()
    log = (tmp_path / "engine.log").read_text()
    assert "does not support Intel AMX, will fallback to torch_native" in log
    assert "torch_native_backend.py" in log and "extend_prefix_lens" in str(info.value) + log


def test_interpreter_is_sglang_0_5_18_with_the_backports(manifest):
    """`make setup-sglang`'s manifest names what runs: SGLang 0.5.18 in its own interpreter, every backport
    applied (tests/workers/sglang/test_backports.py checks the file contents)."""
    assert manifest["sglang"] == "0.5.18" and manifest["python"] == sglang_python(live_server_spec().engine)
    out = subprocess.run([manifest["python"], "-c", "import sglang, torch; print(sglang.__version__, torch.__version__)"],
                         text=True, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "0.5.18" and out.stdout.split()[1].startswith("2.13.0")
    assert len(manifest["backports"]) == 2


def test_paged_kv_needs_a_triton_driver(manifest, tmp_path):
    """Why page_size > 1 is refused on CPU: the server, started anyway, dies at its warm-up's first prefill in
    SGLang's paged allocator, a Triton kernel with no CPU driver to run it."""
    paged = compose_run("engine=sglang_cpu", "attention=torch_native", "drafter=none", "model=smollm2-135m",
                        "page_size=16", f"server_context_len={CONTEXT}")
    assert "page_size" in {p.key for p in adapter_for(EngineKind.SGLANG).plan_problems(paged)}
    spec = replace(live_server_spec(), page_size=16)
    with pytest.raises(EngineStartFailed) as info:
        EngineProcess.for_server(spec, tmp_path / "engine.log").start()
    assert "active drivers" in str(info.value) + (tmp_path / "engine.log").read_text()
