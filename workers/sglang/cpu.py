"""SGLang on CPU (`engine=sglang_cpu`: engine.kind=sglang, engine.device=cpu): what differs from a GPU server.

    cpu_isa() -> CpuIsa                     this host's CPU, as SGLang's CPU kernel build sees it
    sglang_python(engine) -> str            the interpreter SGLang runs in (`engine.python`, else $SPECSWEEP_SGLANG_PYTHON,
                                            else this checkout's .venv-sglang, made by `make setup-sglang`)
    read_manifest(python) -> dict           what `make setup-sglang` installed beside that interpreter
    served_model_path(path, python) -> str  the Hugging Face directory SGLang loads for model.path
    cpu_env() -> {name: value}              SGLang's switch to its CPU platform
    cpu_problems(point, python) -> [Problem] what SGLang's CPU backend cannot do, before any work

SGLang picks its CPU platform from `SGLANG_USE_CPU_ENGINE=1` (`sglang/srt/utils/common.py:213-215`,
`srt/platforms/__init__.py:42`) and `--device cpu`; its CPU attention backends are `intel_amx` (the default on
x86, `srt/server_args.py:4365-4369`) and `torch_native`. The EAGLE-family draft worker (STANDALONE, the oracle)
has an `intel_amx` backend and no `torch_native` one (`srt/speculative/draft_utils.py:83,110`). CUDA graphs,
the device timer behind `sglang:forward_execution_seconds_total` (a `torch.cuda.Event`) and the GPU-only
backends do not exist on CPU. Citations: the SGLang 0.5.18 wheel, the release whose CPU kernels build from the
tagged source (docs/sglang.md, "Rehearse on a laptop with real SGLang").
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep_common.plan_point import PlanPoint
from specsweep_common.problem import Problem
from specsweep_common.spec import Algorithm, EngineSpec

MANIFEST_NAME = "specsweep-sglang.json"
PYTHON_ENV = "SPECSWEEP_SGLANG_PYTHON"
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
CPU_VERSIONS = ("0.5.18",)
CPU_BACKENDS = ("intel_amx", "torch_native")
# Without AMX SGLang replaces intel_amx by torch_native (`_attention_backend_platform_fallbacks`,
# srt/arg_groups/overrides.py:2319-2329, on `cpu_has_amx_support()`), and torch_native cannot verify drafts: a
# TARGET_VERIFY batch carries no extend_prefix_lens (`srt/layers/attention/torch_native_backend.py:101`, an
# AttributeError at the first verify step; measured 2026-12-06 on an AMD EPYC without AVX-512 or AMX).
# what was run end to end on SGLang's CPU backend (tests/workers/sglang/live/): n-gram lookup and the target as its
# own STANDALONE draft; EAGLE/EAGLE3 need a trained draft head no CPU model here has, DFLASH a GPU draft backend
CPU_ALGORITHMS = (Algorithm.NONE, Algorithm.NGRAM, Algorithm.STANDALONE)
EAGLE_DRAFT_CPU_BACKEND = "intel_amx"
# models `make setup-sglang` writes a Hugging Face directory for: name -> the context length it serves
SGLANG_CPU_MODELS = {"smollm2-135m": 8192}
ROOT = Path(__file__).resolve().parent.parent.parent

# SGLang's x86_64 CPU build: -march=x86-64-v4 -mavx512bf16 -mavx512vnni -mamx-tile -mamx-bf16 -mamx-int8
# (csrc/cpu/CMakeLists.txt of the kernel source): these /proc/cpuinfo flags, or SIGILL at `import sgl_kernel`
SGLANG_X86_FLAGS = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16", "avx512_vnni",
                    "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class CpuIsa:
    key: str  # cache key of a kernel build for this CPU
    sglang_x86_build: bool  # SGLang's own x86_64 flags run here
    missing: tuple[str, ...]  # flags of SGLANG_X86_FLAGS this CPU lacks


@functools.cache
def _host_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """/proc/cpuinfo's flags (read once per process: a plan asks for every grid point)."""
    if cpuinfo is None:
        cpuinfo = _host_cpuinfo()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_isa(cpuinfo: str | None = None) -> CpuIsa:
    """`x86-64-v4-amx` where SGLang's x86_64 build runs; else `native-<hash of the flags>` (a -march=native build
    is this CPU's own)."""
    import hashlib

    flags = cpu_flags(cpuinfo)
    missing = tuple(f for f in SGLANG_X86_FLAGS if f not in flags)
    if not missing:
        return CpuIsa("x86-64-v4-amx", True, ())
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:10]
    return CpuIsa(f"native-{digest}", False, missing)


def host_has_amx(cpuinfo: str | None = None) -> bool:
    """What SGLang's `cpu_has_amx_support()` reads (torch's AMX-tile check), from /proc/cpuinfo: `amx_tile`."""
    return "amx_tile" in cpu_flags(cpuinfo)


def sglang_python(engine: EngineSpec) -> str:
    if engine.python:
        return engine.python
    return os.environ.get(PYTHON_ENV) or str(ROOT / ".venv-sglang" / "bin" / "python")


@functools.lru_cache(maxsize=8)
def read_manifest(python: str) -> dict[str, Any]:
    """`make setup-sglang`'s record beside the interpreter ({} when there is none or it does not parse); read once
    per process and interpreter, since the plan asks for every grid point. Callers do not modify it."""
    path = Path(python).parent.parent / MANIFEST_NAME
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def served_model_path(model_path: str, python: str) -> str:
    """A directory or hub id as it is; a name `make setup-sglang` exported -> its Hugging Face directory."""
    if os.path.isdir(model_path):
        return model_path
    return str(read_manifest(python).get("models", {}).get(model_path, model_path))


def cpu_env() -> dict[str, str]:
    return {CPU_ENGINE_ENV: "1"}


def cpu_problems(point: PlanPoint, python: str) -> list[Problem]:
    """What engine.device=cpu refuses before any work (engine.kind=sglang)."""
    out: list[Problem] = []
    a, d, e = point.attention, point.drafter, point.engine

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, point.overrides))

    if e.version not in CPU_VERSIONS:
        bad("engine.version", e.version, f"one of {', '.join(CPU_VERSIONS)} with engine.device=cpu (the SGLang "
            "release whose CPU kernels `make setup-sglang` builds)")
    manifest = read_manifest(python)
    if not Path(python).is_file():
        bad("engine.python", python, "SGLang's interpreter: run `make setup-sglang` (it makes .venv-sglang), or "
            f"set engine.python / ${PYTHON_ENV}")
    elif manifest.get("sglang") not in (None, e.version):
        bad("engine.version", e.version, f"{manifest['sglang']}, the SGLang installed beside {python}")
    amx = host_has_amx()
    backends = CPU_BACKENDS if amx else ("torch_native",)
    for key, value in (("backend", a.backend), ("decode_backend", a.decode_backend),
                       ("prefill_backend", a.prefill_backend), ("draft_backend", a.draft_backend)):
        if value is not None and value not in backends:
            why = "" if amx else (" on this host: it has no AMX, and SGLang would run torch_native instead of "
                                  "intel_amx (srt/arg_groups/overrides.py:2319-2329)")
            bad(f"attention.{key}", value, f"one of {', '.join(backends)} on SGLang's CPU backend{why} "
                f"(e.g. attention={backends[0]})")
    if d.algorithm is not Algorithm.NONE and not amx:
        bad("drafter.algorithm", d.algorithm.value, "NONE (drafter=none) on SGLang's CPU backend on this host: it "
            "verifies drafts only with intel_amx, which needs AMX (this CPU lacks it); torch_native has no "
            "TARGET_VERIFY path (srt/layers/attention/torch_native_backend.py:101)")
    elif d.algorithm not in CPU_ALGORITHMS:
        bad("drafter.algorithm", d.algorithm.value, f"one of {', '.join(x.value for x in CPU_ALGORITHMS)} on "
            "SGLang's CPU backend (EAGLE/EAGLE3 need a trained draft head, DFLASH a GPU draft backend)")
    elif d.algorithm is Algorithm.STANDALONE and a.backend != EAGLE_DRAFT_CPU_BACKEND and a.draft_backend is None:
        bad("attention.backend", a.backend, f"{EAGLE_DRAFT_CPU_BACKEND} with {d.algorithm.value} on CPU: SGLang's "
            "EAGLE-family draft worker has no torch_native backend (srt/speculative/draft_utils.py:83)")
    if point.page_size != 1:
        bad("page_size", point.page_size, "1 on SGLang's CPU backend: its paged KV allocator launches a Triton kernel "
            "(`alloc_extend_kernel`, srt/mem_cache/allocator/paged.py:197) and Triton has no CPU driver "
            "(\"0 active drivers\" at the first prefill)")
    opts = e.sglang
    if opts is not None and opts.cuda_graph_max_bs is not None:
        bad("engine.sglang.cuda_graph_max_bs", opts.cuda_graph_max_bs, "null on CPU (no CUDA graphs)")
    if point.tp_size != 1 or point.nnodes != 1:
        bad("tp_size", point.tp_size, "1 with engine.device=cpu (one CPU server process per grid point here)")
    path = point.model.path
    if not os.path.isdir(path) and path not in manifest.get("models", {}):
        known = ", ".join(sorted(manifest.get("models", {}))) or "none yet"
        bad("model.path", path, "a Hugging Face checkpoint directory, or a model `make setup-sglang` exported "
            f"({known}) on engine=sglang_cpu")
    return out
