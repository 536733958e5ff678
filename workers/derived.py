"""Derived per-run metrics: KV bytes a verify step must read, the bandwidth that implies, and the step time
against the node's physical floor.

    kv_bytes_per_step  = ModelSpec.kv_bytes_per_token x mean prefix length over the run's verify steps
                         (prompt_tokens + completion_tokens / 2): layers x KV heads x (Dk + Dv) x dtype bytes x context
    kv_bw_gbs          = kv_bytes_per_step / verify_step_ms                    (CPU and GPU)
    peak_bw_gbs        = the node's measured device-to-device copy bandwidth   (GPU only; specsweep_kernels.roofline, cached)
    floor_step_ms      = (weight bytes read per forward / requests per forward + kv_bytes_per_step) / peak_bw_gbs
                                                                               (GPU only)
    roofline_frac      = floor_step_ms / verify_step_ms                        (GPU only; 1.0 = at the floor)

verify_step_ms (workers.engine_counters) is device time per request verify step: one forward's time at
probe.concurrency 1, a batched forward's time / the requests in it above. So kv_bw_gbs is the batch's KV bytes per
second, and the floor counts the weights once per forward, shared by its requests: `batch_size_mean` where the
engine reports it (the reference engine's spec_steps), else `requests` (probe.concurrency; all requests start
together and generate the same number of tokens).

Weight bytes come from the model's full shape (`model_weight_bytes`), which the engine's adapter reads
(`EngineAdapter.weight_bytes`: an HF config.json directory; the reference engine's also its built-in and GGUF
models); where the shape can't be read, the floor counts the KV bytes alone. On CPU the
roofline metrics are left out (there is no measured ceiling), a log line says so.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Protocol, cast

from specsweep_common.spec import DTYPE_BYTES, ModelSpec

logger = logging.getLogger(__name__)


def mean_context(metrics: dict[str, float]) -> float | None:
    prompt = metrics.get("prompt_tokens")
    if prompt is None:
        return None
    return float(prompt) + float(metrics.get("completion_tokens", 0.0)) / 2.0


class ModelShape(Protocol):
    """What the weight count reads of a model's config: the reference engine's `ModelConfig` has these fields, and
    `hf_shape` reads them from an HF config.json."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def num_attention_heads(self) -> int: ...

    @property
    def num_key_value_heads(self) -> int: ...

    @property
    def intermediate_size(self) -> int: ...

    @property
    def num_hidden_layers(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...


def model_weight_bytes(cfg: ModelShape, dtype: str) -> float:
    """Bytes of the weights one forward reads: every decoder layer plus the LM head (the embedding is only
    gathered, T rows)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (cfg.num_attention_heads * 2 + cfg.num_key_value_heads * 2)  # q, o, k, v projections
    mlp = 3 * h * cfg.intermediate_size
    params = cfg.num_hidden_layers * (attn + mlp + 2 * h) + cfg.vocab_size * h + h
    return float(params * DTYPE_BYTES.get(dtype, 2))


def hf_shape(path: str) -> ModelShape | None:
    """The shape in `path`/config.json (HF names; head_dim and KV heads defaulted as transformers does); None when
    there is no such file or it lacks a field (an HF id without a local checkout, a config of another kind)."""
    config = Path(path) / "config.json"
    try:
        raw = json.loads(config.read_text())
        heads = raw["num_attention_heads"]
        return cast(ModelShape, SimpleNamespace(
            hidden_size=raw["hidden_size"], head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            num_attention_heads=heads, num_key_value_heads=raw.get("num_key_value_heads", heads),
            intermediate_size=raw["intermediate_size"], num_hidden_layers=raw["num_hidden_layers"],
            vocab_size=raw["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.info("no full model shape in %s (%s): the floor counts KV bytes only", config, e)
        return None


def node_peak_gbs() -> float | None:
    """The node's measured copy bandwidth (GB/s, read + write), measured once per GPU and cached; None on CPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from specsweep_kernels.roofline import load_or_measure_ceilings

    return load_or_measure_ceilings().copy_gbps


def derived_metrics(metrics: dict[str, float], model: ModelSpec, *, on_gpu: bool,
                    peak_gbs: Callable[[], float | None] = node_peak_gbs,
                    weight_bytes: float | None = None) -> dict[str, float]:
    """The derived metrics for one run's probe metrics (see the module docstring). Never raises on missing
    inputs: what can't be computed is left out."""
    out: dict[str, float] = {}
    ctx = mean_context(metrics)
    if ctx is None:
        return out
    kv_bytes = model.kv_bytes_per_token * ctx
    out["kv_bytes_per_step"] = kv_bytes
    step_ms = metrics.get("verify_step_ms")
    if step_ms:
        out["kv_bw_gbs"] = kv_bytes / (step_ms / 1000.0) / 1e9
    if not on_gpu:
        logger.info("CPU engine: roofline_frac and peak_bw_gbs left out (no measured GPU ceiling)")
        return out
    try:
        peak = peak_gbs()
    except Exception as e:  # measuring must not fail the run it describes
        logger.warning("could not measure the node's ceilings: %s", e)
        peak = None
    if not peak:
        return out
    out["peak_bw_gbs"] = peak
    if weight_bytes is None:
        weight_bytes = 0.0  # the shape could not be read: the floor counts KV bytes only
    per_forward = metrics.get("batch_size_mean") or metrics.get("requests") or 1.0  # requests sharing the weights
    floor_ms = 1000.0 * (weight_bytes / per_forward + kv_bytes) / (peak * 1e9)
    out["floor_step_ms"] = floor_ms
    if step_ms:
        out["roofline_frac"] = floor_ms / step_ms
    return out


def repeat_frac(text: str, n: int = 3) -> float:
    """`continuation_repeat_frac`: the share of the continuation's word n-grams (n=3) already seen earlier in it.
    0 for text that never repeats itself; "to be able to be able to be able to" gives 5/8. The diagnosis treats a
    novel-text continuation at or above `report.loop_repeat_frac` as looping (easy text, not novel)."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams) if grams else 0.0
