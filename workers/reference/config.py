"""Model configuration: Qwen3/Llama-style decoder hyper-parameters from an HF `config.json`, a GGUF file or a built-in name."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from specsweep_common.builtin_models import BUILTIN_MODELS
from specsweep_common.spec import ModelSpec

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")  # --load-format choices, with SGLang's names

logger = logging.getLogger(__name__)

BYTE_VOCAB = 256
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
BYTE_VOCAB_SIZE = 259  # 256 bytes + BOS, EOS, PAD


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    qk_norm: bool = True  # Qwen3's per-head RMSNorm on q and k; False for Llama
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = field(default=())  # "full_attention" | "sliding_attention" per layer
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, expected {self.num_hidden_layers}")

    def window_of(self, layer: int) -> int | None:
        """Sliding-window size of a layer (keys with q_pos - k_pos < window are visible), None = full."""
        if self.sliding_window and self.layer_types and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None


def _byte_config(**kw) -> ModelConfig:
    base: dict[str, Any] = dict(vocab_size=BYTE_VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                max_position_embeddings=32768, layer_types=())
    base.update(kw)
    if not base["layer_types"]:
        base["layer_types"] = ("full_attention",) * base["num_hidden_layers"]
    return ModelConfig(**base)


def _builtin(m: ModelSpec) -> ModelConfig:
    """A built-in model's config from its one declaration (specsweep_common/builtin_models.py); the MLP width,
    which the orchestrator never needs, is the engine's: 3 x hidden_size."""
    return _byte_config(hidden_size=m.hidden_size, intermediate_size=3 * m.hidden_size, num_hidden_layers=m.num_layers,
                        num_attention_heads=m.num_q_heads, num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim,
                        max_position_embeddings=m.max_context_len)


BUILTIN_CONFIGS: dict[str, ModelConfig] = {name: _builtin(m) for name, m in BUILTIN_MODELS.items()}


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        logger.warning("rope type %r is not implemented; using plain RoPE", kind)
    return float(params.get("rope_theta", raw.get("rope_theta", 1_000_000.0)))


def _layer_types(raw: dict, num_layers: int, window: int | None) -> tuple[str, ...]:
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    first_sliding = raw.get("max_window_layers", num_layers)
    return tuple("sliding_attention" if window is not None and i >= first_sliding else "full_attention"
                 for i in range(num_layers))


def config_from_hf(raw: dict) -> ModelConfig:
    """Qwen3Config field names (transformers 4.5x and 5.x) -> ModelConfig."""
    num_layers = raw["num_hidden_layers"]
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    eos = raw.get("eos_token_id")
    return ModelConfig(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_hidden_layers=num_layers, num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
        max_position_embeddings=raw.get("max_position_embeddings", 32768),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=_rope_theta(raw),
        attention_bias=raw.get("attention_bias", False),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        sliding_window=window, layer_types=_layer_types(raw, num_layers, window),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=raw.get("pad_token_id"),
    )
