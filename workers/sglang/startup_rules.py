"""SGLang 0.5.23 rules that its parser does not check: the point parses, then the server dies at start-up (or in
its own warm-up request). Checked at plan time, before Ray starts, by `workers.sglang.rules.sglang_problems`
(`SGLangAdapter.plan_problems`).

    startup_problems(point, bad)  bad(key, value, allowed) for each rule a grid point (a `PlanPoint`) breaks
    weight_bytes(model) -> (bytes, how) | None     the checkpoint's weights, declared or a lower bound from the shape
    gpu_memory(cluster) -> (GiB, how)               one GPU's memory: declared, or the largest of the architecture
    min_tp_size(point) -> int                       the smallest tp_size at which the weights fit (1: they do)
    mem_fraction_static(point, gib) -> (f, how)     the fraction SGLang 0.5.23 resolves on a GPU of `gib` GiB

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
  draft worker loads the target again) plus the KV cache the point's requests need (prompt + gen_tokens tokens,
  x probe.concurrency, per GPU as SGLang shards KV heads) must stay under one GPU's memory x
  mem_fraction_static: SGLang charges the loaded weights (target and draft) against that fraction of the memory
  free before loading and refuses to start when nothing is left for the KV cache
  (`sglang/srt/mem_cache/kv_cache_configurator.py:3007,3051`). The fraction is `engine.sglang.mem_fraction_static`,
  else the one SGLang resolves for that GPU (`mem_fraction_static(point, gib)`, its heuristic in
  `sglang/srt/arg_groups/memory_hook.py:47-350`: 0.8 for DeepSeek-V3 at tp 8 on an 80 GiB GPU, 0.83 for an 8B GQA
  model at tp 1); tests/workers/sglang/test_startup_rules.py runs SGLang's own resolution against it.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable

from specsweep_common.plan_point import ClusterFacts, PlanPoint, argv_int
from specsweep_common.sglang_facts import resolved_backends
from specsweep_common.spec import WEIGHT_BYTES, Algorithm, AttentionKind, ModelSpec

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
SPECULATIVE = "with speculation (drafter.algorithm != NONE)"
GIB = 2 ** 30
MAX_TP = 1024  # the tp_size domain's top (orchestrator/config/run_config.py)
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


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many prefill CUDA-graph token buckets SGLang captures up to max_bs
    (`sglang/srt/arg_groups/cuda_graph_hook.py:480-497` generate_prefill_cuda_graph_batch_sizes)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return sum(1 for s in sizes if s <= max_bs)


def mem_fraction_static(point: PlanPoint, gib: float, tp: int | None = None) -> tuple[float, str]:
    """The mem_fraction_static SGLang 0.5.23 runs with on one GPU of `gib` GiB, and how it was reached:
    `engine.sglang.mem_fraction_static`, else SGLang's heuristic at tp_size `tp` (default: the point's) (`handle_gpu_memory_settings`,
    `sglang/srt/arg_groups/memory_hook.py`) for a CUDA GPU, no disaggregation, DP attention, DeepEP or VLM (which
    this project never sets): fraction = round((memory - reserved) / memory, 3) in MiB (`:324-328`) with
    reserved = 512 + max(chunked_prefill_size, 2048) x 1.5 + tp_size / 8 x 1024 + the CUDA-graph reserve
    (`:309-313`), at least 10 GiB on a GPU over 60 GiB (`:314-315`). chunked_prefill_size and the decode graph's
    max batch come from the memory bracket (`:89-170`), the batch capped by max_running_requests when set
    (`:182-187`); the graph reserve is 2 MiB per decode batch slot (`:364-368`), and 8 MiB per prefill token
    bucket, or 1.5 GiB flat for MLA (`:380-389`), each unless its graph is disabled."""
    opts = point.engine.sglang
    if opts is not None and opts.mem_fraction_static:
        return opts.mem_fraction_static, f"engine.sglang.mem_fraction_static={opts.mem_fraction_static:g}"
    mib, tp = gib * 1024, tp or point.tp_size
    _, bracket_chunked, small_tp_bs, large_tp_bs = next(
        bracket for bracket in ((20, 2048, 8, 8), (35, 4096, 48, 160), (60, 4096, 32, 160), (90, 8192, 256, 512),
                                (160, 8192, 256, 512), (math.inf, 16384, 512, 512)) if mib < bracket[0] * 1024)
    given = argv_int(point.engine.extra_args, "--chunked-prefill-size")
    chunked = given if given is not None else bracket_chunked
    bracket_bs = small_tp_bs if tp < 4 else large_tp_bs
    graphs = not (opts is not None and opts.disable_cuda_graph)
    decode_bs = opts.cuda_graph_max_bs if opts is not None and opts.cuda_graph_max_bs else None
    if decode_bs is None:
        decode_bs = bracket_bs
        if opts is not None and opts.max_running_requests is not None:
            decode_bs = min(decode_bs, opts.max_running_requests)
    reserved = 512 + max(chunked, 2048) * 1.5 + tp / 8 * 1024
    if graphs:
        reserved += decode_bs * 2
        mla = point.model.attention_kind is AttentionKind.MLA
        reserved += 1.5 * 1024 if mla else _prefill_graph_sizes(chunked) * 8
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((mib - reserved) / mib, 3)
    return fraction, (f"mem_fraction_static {fraction:g}, as SGLang resolves it on this GPU at tp_size {tp} "
                      f"({reserved / 1024:.1f} GiB reserved for activations and CUDA graphs; "
                      "set engine.sglang.mem_fraction_static to choose)")


def kv_cache_bytes(point: PlanPoint, tp: int | None = None) -> tuple[float, str]:
    """KV cache bytes one GPU needs for the point's requests: (prompt + gen_tokens) x probe.concurrency tokens,
    KV heads split over tp_size as SGLang shards them, at least one per GPU (`ModelConfig.get_num_kv_heads`,
    `sglang/srt/configs/model_config.py:1700-1711`); MLA's one latent head is held whole on every GPU."""
    m, probe = point.model, point.probe
    tokens = (probe.context_len + probe.gen_tokens) * probe.concurrency
    tp = tp or point.tp_size
    heads = m.num_kv_heads if m.attention_kind is AttentionKind.MLA else max(1, m.num_kv_heads // tp)
    per_token = m.kv_bytes_per_token * heads / m.num_kv_heads
    return tokens * per_token, f"{tokens} tokens of KV cache ({per_token / 2 ** 10:.1f} KiB per token per GPU)"


def _budget(point: PlanPoint, tp: int | None = None) -> tuple[float, float, str, str] | None:
    """(weight bytes of one replica, bytes one GPU may hold for weights, how the weights were counted, how the
    memory): one GPU's memory x the fraction SGLang runs with, less the KV cache the point needs, at tp_size `tp`
    (default: the point's)."""
    counted = weight_bytes(point.model)
    if counted is None:
        return None
    total, how = counted
    d = point.drafter
    if d.algorithm is Algorithm.STANDALONE and d.draft_model_path == point.model.path:
        total, how = 2 * total, how + ", twice: the draft worker loads the target again"
    gib, where = gpu_memory(point.cluster)
    fraction, fraction_how = mem_fraction_static(point, gib, tp)
    kv, kv_how = kv_cache_bytes(point, tp)
    return total, gib * GIB * fraction - kv, how, f"{where}, x {fraction_how}, less {kv_how}"


def min_tp_size(point: PlanPoint) -> int:
    """The smallest tp_size whose weights per GPU fit (1 when they fit on one GPU, or cannot be counted)."""
    for tp in range(1, MAX_TP + 1):  # the budget depends on tp_size too (SGLang's reserve, KV heads per GPU)
        b = _budget(point, tp)
        if b is None:
            return 1
        if b[1] > 0 and b[0] / tp < b[1]:
            return tp
    return MAX_TP + 1


def weights_problems(point: PlanPoint, bad: Bad) -> None:
    b = _budget(point)
    if b is None:
        return
    total, budget, how, where = b
    per_gpu = total / point.tp_size
    if per_gpu >= budget:
        least = min_tp_size(point)
        bad("tp_size", point.tp_size,
            f"{'>= ' + str(least) if least <= MAX_TP else 'none up to ' + str(MAX_TP)} for model {point.model.name}: "
            f"its weights ({total / GIB:.1f} GiB: {how}) over tp_size {point.tp_size} are {per_gpu / GIB:.1f} GiB per "
            f"GPU, not under the {budget / GIB:.1f} GiB left for them ({where}), and SGLang would refuse to start "
            "with no memory left for the KV cache")


def startup_problems(point: PlanPoint, bad: Bad) -> None:
    """Every rule of this module for one SGLang grid point."""
    fa3_problems(point, bad)
    speculation_problems(point, bad)
    weights_problems(point, bad)
