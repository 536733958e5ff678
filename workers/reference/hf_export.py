"""A GGUF model as a Hugging Face checkpoint directory, for engines that load only that layout (SGLang).

    hf_checkpoint_dir(model_path, context_length) -> Path

The directory holds what SGLang's `--model-path` loader reads for a Llama-architecture model: `config.json`
(`LlamaConfig` names, `architectures: ["LlamaForCausalLM"]`), `model.safetensors` and the tokenizer files with the
chat template (`tokenizer_export.hf_tokenizer_dir`). The weights are the reference engine's own conversion
(`gguf_checkpoint.prepare_gguf`: the GGUF dequantised to float32 with HF names and HF's rotate-half q/k order),
linked rather than copied, so both engines read the same numbers; `torch_dtype` says float32 because those are the
numbers stored (a server picks its compute dtype with `--dtype`).

Checked against the reference engine's logits by `check_against_reference`, which `make setup-sglang`
(tools/setup_sglang.py) runs on the directory it exports: transformers' own `LlamaForCausalLM` loads it and its logits
at every prompt position match the engine's (CHECK_TOLERANCE), with the same greedy next tokens.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .config import ModelConfig
from .gguf_checkpoint import cache_dir, file_key, prepare_gguf, read_config, resolve_gguf
from .tokenizer_export import hf_tokenizer_dir

logger = logging.getLogger(__name__)

_FORMAT = 1  # bump when the exported files change
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def llama_config_json(cfg: ModelConfig) -> dict:
    """`ModelConfig` -> a transformers `LlamaConfig` dict (the fields SGLang's and transformers' Llama read)."""
    if cfg.qk_norm or cfg.sliding_window:
        raise ValueError("only a Llama-architecture model (no q/k norm, no sliding window) exports as LlamaConfig")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "attention_bias": cfg.attention_bias, "mlp_bias": False,
        "hidden_act": "silu", "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "torch_dtype": "float32",
    }


@functools.cache
def hf_checkpoint_dir(model_path: str, context_length: int) -> Path:
    """The Hugging Face directory of a GGUF model (a path or a known name), written once into the cache."""
    gguf_path = resolve_gguf(model_path)
    if gguf_path is None:
        raise ValueError(f"model {model_path!r}: not a .gguf file or a known GGUF model name; "
                         "a Hugging Face directory is already loadable as it is")
    converted = prepare_gguf(gguf_path)
    directory = cache_dir() / f"hf-checkpoint-{file_key(gguf_path)}-ctx{context_length}-v{_FORMAT}"
    if (directory / "config.json").is_file():
        return directory
    cfg = read_config(converted)
    tokenizer = Path(hf_tokenizer_dir(model_path, context_length))
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{directory.name}.tmp", dir=directory.parent))
    try:
        os.symlink(converted / "model.safetensors", tmp / "model.safetensors")
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer / name, tmp / name)
        generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=1))
        (tmp / "config.json").write_text(json.dumps(llama_config_json(cfg), indent=1))
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf_path), "config": dataclasses.asdict(cfg)}))
        tmp.rename(directory)
        logger.info("wrote the Hugging Face checkpoint of %s to %s", model_path, directory)
    except OSError:
        if not (directory / "config.json").is_file():
            raise
    finally:  # another process may have written it first: ours is dropped
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


CHECK_PROMPT = "The cat sat on the mat. The dog slept by the door, and the"
CHECK_TOLERANCE = 1e-3  # float32 on both sides; transformers' eager Llama and ours differ by summation order


def check_against_reference(model_path: str, directory: Path, prompt: str = CHECK_PROMPT) -> float:
    """Max |logit difference| over every prompt position between transformers' `LlamaForCausalLM` loading
    `directory` and the reference engine on `model_path`, both float32; raises ValueError above CHECK_TOLERANCE or
    when the greedy next tokens differ (the directory would then not be the model the reference engine serves)."""
    import torch
    import transformers

    from .attention import create_attention_backend
    from .model import build_model
    from .model_source import load_config
    from .runner import ModelRunner
    from .tokenizer import load_tokenizer

    ids = load_tokenizer(model_path).encode(prompt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    model = build_model(load_config(model_path), model_path, "auto", 0, torch.float32, "cpu")
    runner = ModelRunner(model, create_attention_backend("torch"), page_size=1, max_total_tokens=len(ids) + 8,
                         max_seq_tokens=len(ids) + 8, chunked_prefill_size=len(ids))
    seq = runner.new_sequence()
    try:
        with torch.no_grad():
            ours = runner.extend(seq, ids, all_logits=True).float()
    finally:
        seq.release()
    err = float((ours - theirs).abs().max())
    if err > CHECK_TOLERANCE or not torch.equal(ours.argmax(-1), theirs.argmax(-1)):
        raise ValueError(f"{directory}: transformers' logits differ from the reference engine's on {model_path} "
                         f"(max |diff| {err:.3g}, tolerance {CHECK_TOLERANCE})")
    return err
