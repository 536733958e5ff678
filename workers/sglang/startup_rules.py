"""SGLang 0.5.23 rules that its parser does not check: the point parses, then the server dies at start-up (or in
its own warm-up request). Checked at plan time, before Ray starts, by `workers.sglang.rules.sglang_problems`
(`SGLangAdapter.plan_problems`).

    startup_problems(point, bad)  bad(key, value, allowed) for each rule a grid point (a `PlanPoint`) breaks
    weight_bytes(model) -> (bytes, how) | None     the checkpoint's weights, declared or a lower bound from the shape
    gpu_memory(cluster) -> (GiB, how)               one GPU's memory: declared, or the largest of the architecture
    min_tp_size(point) -> int                       the smallest tp_size at which the weights fit (1: they do)

The rules (docs/sglang.md, "Rules SGLang checks only at start-up"):
- attention `fa3` needs SM 8.x without MLA, or SM 9.x: the FA3 factory asserts it
  (`sglang/srt/layers/attention/attention_registry.py:238-246`). Refused by `cluster.accelerator`; with no
  accelerator declared it cannot be judged here, and a warning says so.
- `torch_native` as the verify backend with any speculation: its extend path reads `extend_prefix_lens`, which a
  TARGET_VERIFY batch leaves None (`sglang/srt/model_executor/forward_batch_info.py:1226-1246`; read at
  `sglang/srt/layers/attention/torch_native_backend.py:101`, called from
  `forward_extend`, `:279-320`); SGLang's own warm-up request (`sglang/srt/entrypoints/http_server.py:2360-2420`,
  8 new tokens) is the first verify, so the server never becomes healthy.
- `hpc_ops` with any speculation: its factory raises (`attention_registry.py:286-300`).
- weights that cannot fit: weight bytes per GPU (params x bytes per weight / tp_size, twice for the oracle, whose
  draft worker loads the target again) must stay under one GPU's memory x `engine.sglang.mem_fraction_static` (1
  when unset): SGLang charges the loaded weights (target and draft) against that fraction of the memory free
  before loading and refuses to start when nothing is left for the KV cache
  (`sglang/srt/mem_cache/kv_cache_configurator.py:2990-3060`).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable

from specsweep_vocab.plan_point import ClusterFacts, PlanPoint
from specsweep_vocab.sglang_facts import resolved_backends
from specsweep_vocab.spec import Algorithm, AttentionKind, ModelSpec

logger = logging.getLogger(__name__)

Bad = Callable[[str, Any, str], None]

# Per-GPU memory (GiB, as nvidia-smi reports it, rounded) of the largest GPU of each architecture we know: an
# architecture does not determine the memory (sm_90 is an 80 GiB H100, a 141 GiB H200 or a 144 GiB GH200), so
# the default refuses only what fits no GPU of it. `cluster.gpu_memory_gib` states the nodes' own.
GPU_MEMORY_GIB: dict[str, tuple[float, str]] = {
    "sm_80": (80, "A100 80GB (A100 40GB: 40)"),
    "sm_86": (48, "RTX A6000 / A40 (RTX 3090: 24)"),
    "sm_89": (48, "L40S / L40 (L4: 24, RTX 4090: 24)"),
    "sm_90": (144, "GH200 144GB (H200: 141, H100: 80)"),
    "sm_100": (192, "B200 / GB200 (about 180 usable)"),
    "sm_103": (288, "B300 / GB300"),
    "sm_120": (96, "RTX PRO 6000 Blackwell (RTX 5090: 32)"),
}
# bytes per stored weight
WEIGHT_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0, "float8_e5m2": 1.0,
                "int8": 1.0, "int4": 0.5, "float4_e2m1": 0.5}
SPECULATIVE = "with speculation (drafter.algorithm != NONE)"
GIB = 2 ** 30
_warned: set[str] = set()


def sm_major(accelerator: str | None) -> int | None:
    """sm_90 -> 9, sm_120 -> 12, sm_86 -> 8; None for an unset or unknown spelling."""
    m = re.fullmatch(r"sm_(\d+)[a-z]?", accelerator or "")
    return int(m.group(1)) // 10 if m else None


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def fa3_problems(point: PlanPoint, bad: Bad) -> None:
    a, arch = point.attention, point.cluster.accelerator
    keys = [k for k in ("backend", "decode_backend", "prefill_backend", "draft_backend") if getattr(a, k) == "fa3"]
    if not keys:
        return
    major, mla = sm_major(arch), point.model.attention_kind is AttentionKind.MLA
    if major is None:
        _warn_once(f"attention.{keys[0]}=fa3 with cluster.accelerator={arch!r}: SGLang's FA3 backend runs only on "
                   "SM 8.x (no MLA) and SM 9.x (attention_registry.py:238-246); set cluster.accelerator (e.g. sm_90) "
                   "so that this is checked before any work, or the server may die at start-up")
        return
    if major == 9 or (major == 8 and not mla):
        return
    why = ("SM 8.x runs it only without MLA" if major == 8 else f"{arch} is SM {major}.x")
    for key in keys:
        bad(f"attention.{key}", "fa3", f"a backend other than fa3 on cluster.accelerator={arch} (e.g. flashinfer or "
            f"triton): SGLang's FA3 backend asserts SM 8.x without MLA or SM 9.x at start-up and {why}")


def speculation_problems(point: PlanPoint, bad: Bad) -> None:
    a, d = point.attention, point.drafter
    if d.algorithm is Algorithm.NONE:
        return
    verify = resolved_backends(a, d.algorithm).verify
    if verify == "torch_native":
        own = "decode_backend" if a.speculative_attention_mode == "decode" else "prefill_backend"
        key = own if getattr(a, own) == "torch_native" else "backend"
        bad(f"attention.{key}", "torch_native",
            f"a verify backend other than torch_native {SPECULATIVE}, drafter.algorithm={d.algorithm.value}: "
            "SGLang's torch_native backend has no TARGET_VERIFY path and the server dies at its own warm-up request")
    for key in ("backend", "decode_backend", "prefill_backend"):
        if getattr(a, key) == "hpc_ops":
            bad(f"attention.{key}", "hpc_ops", f"a backend other than hpc_ops {SPECULATIVE}, drafter.algorithm="
                f"{d.algorithm.value}: SGLang's hpc_ops factory refuses speculative decoding")


def weight_bytes(m: ModelSpec) -> tuple[float, str] | None:
    """The checkpoint's weight bytes and how they were counted: num_params x bytes per weight_dtype (else dtype);
    without num_params, a GQA model's attention projections alone (a lower bound); None for MLA without it."""
    dtype = m.weight_dtype or m.dtype
    per = WEIGHT_BYTES.get(dtype)
    if per is None:
        return None
    if m.num_params is not None:
        return m.num_params * per, f"{m.num_params:.3g} parameters x {per:g} B ({dtype})"
    if m.attention_kind is AttentionKind.MLA:
        return None
    h = m.hidden_size
    attention = m.num_layers * h * (m.num_q_heads * m.head_dim + 2 * m.num_kv_heads * m.head_dim
                                    + m.num_q_heads * m.v_head_dim)
    return attention * per, f"at least the attention projections of its shape ({attention:.3g} x {per:g} B, {dtype})"


def gpu_memory(cluster: ClusterFacts) -> tuple[float, str]:
    """One GPU's memory in GiB, and where the figure comes from."""
    if cluster.gpu_memory_gib is not None:
        return cluster.gpu_memory_gib, f"cluster.gpu_memory_gib={cluster.gpu_memory_gib:g}"
    known = GPU_MEMORY_GIB.get(cluster.accelerator or "")
    if known is not None:
        return known[0], (f"{known[0]:g} GiB assumed for cluster.accelerator={cluster.accelerator}, its largest GPU "
                          f"({known[1]}); set cluster.gpu_memory_gib for the nodes' own")
    gib, arch = max((v[0], k) for k, v in GPU_MEMORY_GIB.items())
    return gib, (f"{gib:g} GiB assumed, the largest GPU known ({arch}), as cluster.accelerator="
                 f"{cluster.accelerator!r} does not say; set cluster.accelerator or cluster.gpu_memory_gib")


def _budget(point: PlanPoint) -> tuple[float, float, str, str] | None:
    """(weight bytes of one replica, bytes one GPU may hold, how the weights were counted, how the memory)."""
    counted = weight_bytes(point.model)
    if counted is None:
        return None
    total, how = counted
    d = point.drafter
    if d.algorithm is Algorithm.STANDALONE and d.draft_model_path == point.model.path:
        total, how = 2 * total, how + ", twice: the draft worker loads the target again"
    gib, where = gpu_memory(point.cluster)
    opts = point.engine.sglang
    fraction = opts.mem_fraction_static if opts is not None and opts.mem_fraction_static else 1.0
    return total, gib * GIB * fraction, how, where + (f", x mem_fraction_static {fraction:g}" if fraction < 1 else "")


def min_tp_size(point: PlanPoint) -> int:
    """The smallest tp_size whose weights per GPU fit (1 when they fit on one GPU, or cannot be counted)."""
    b = _budget(point)
    return max(1, math.ceil(b[0] / b[1])) if b is not None and b[1] > 0 else 1


def weights_problems(point: PlanPoint, bad: Bad) -> None:
    if point.model.weight_dtype is not None and point.model.weight_dtype not in WEIGHT_BYTES:
        bad("model.weight_dtype", point.model.weight_dtype, "null or one of " + ", ".join(WEIGHT_BYTES))
        return
    b = _budget(point)
    if b is None:
        return
    total, budget, how, where = b
    per_gpu = total / point.tp_size
    if per_gpu >= budget:
        bad("tp_size", point.tp_size,
            f">= {min_tp_size(point)} for model {point.model.name}: its weights ({total / GIB:.1f} GiB: {how}) over tp_size "
            f"{point.tp_size} are {per_gpu / GIB:.1f} GiB per GPU, not under {budget / GIB:.1f} GiB ({where}), "
            "and SGLang would refuse to start with no memory left for the KV cache")


def startup_problems(point: PlanPoint, bad: Bad) -> None:
    """Every rule of this module for one SGLang grid point."""
    fa3_problems(point, bad)
    speculation_problems(point, bad)
    weights_problems(point, bad)
