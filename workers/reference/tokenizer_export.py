"""The reference engine's tokenizer as a Hugging Face tokenizer directory, for /model_info's `tokenizer_path`.

    hf_tokenizer_dir(model_path, context_length) -> str

SGLang's bench_serving loads its tokenizer from `/model_info`'s `tokenizer_path` when no `--tokenizer` is given
(sglang/benchmark/serving.py:2170-2187, then `AutoTokenizer.from_pretrained`, benchmark/utils.py:44-62), so that
path must be something transformers loads offline and that encodes as the engine does:

- a Hugging Face checkpoint directory: the directory itself (SGLang's default tokenizer path is the model path);
- a GGUF model: a directory with the converted `tokenizer.json` (gguf_checkpoint's cache) and a
  `tokenizer_config.json` naming BOS/EOS/PAD and the GGUF's chat template (SGLang would report the .gguf file, but
  its GGUF tokenizer loader needs the model's Hub files and fails offline);
- a built-in byte-tokenizer config (`tiny`): a byte-level BPE with no merges, so every UTF-8 byte is one token with
  id = the byte, and BOS/EOS/PAD are ids 256/257/258 as in `tokenizer.ByteTokenizer`. Their names (`<|bos|>`,
  `<|eos|>`, `<|pad|>`) are matched whole by the exported tokenizer, while the engine encodes those strings as bytes.

Written once into the cache directory (gguf_checkpoint.cache_dir()), through a temporary sibling and a rename.
"""
from __future__ import annotations

import functools
import json
import logging
import shutil
import tempfile
from pathlib import Path

from .chat_template import load_chat_template
from .config import BOS_ID, BUILTIN_CONFIGS, EOS_ID, PAD_ID
from .gguf_checkpoint import cache_dir, file_key, prepare_gguf, resolve_gguf

logger = logging.getLogger(__name__)

_FORMAT = 1  # bump when the exported files change
BYTE_SPECIAL_TOKENS = {BOS_ID: "<|bos|>", EOS_ID: "<|eos|>", PAD_ID: "<|pad|>"}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_json() -> str:
    """tokenizer.json of `tokenizer.ByteTokenizer`: ids 0..255 are the bytes, then BOS/EOS/PAD."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BYTE_SPECIAL_TOKENS[i], special=True, normalized=False)
                            for i in sorted(BYTE_SPECIAL_TOKENS)])
    if [tok.token_to_id(BYTE_SPECIAL_TOKENS[i]) for i in sorted(BYTE_SPECIAL_TOKENS)] != sorted(BYTE_SPECIAL_TOKENS):
        raise RuntimeError("byte tokenizer export: special tokens did not get ids 256, 257, 258")
    return tok.to_str()


@functools.cache
def hf_tokenizer_dir(model_path: str, context_length: int) -> str:
    """A directory `AutoTokenizer.from_pretrained` loads offline, encoding as the engine for `model_path` does."""
    if model_path in BUILTIN_CONFIGS:
        name, tokenizer_json = "bytes", byte_tokenizer_json()
        special = {"bos_token": BYTE_SPECIAL_TOKENS[BOS_ID], "eos_token": BYTE_SPECIAL_TOKENS[EOS_ID],
                   "pad_token": BYTE_SPECIAL_TOKENS[PAD_ID]}
    else:
        gguf_path = resolve_gguf(model_path)
        if gguf_path is None:
            return model_path  # a checkpoint directory: its own tokenizer files
        name, tokenizer_json = file_key(gguf_path), (prepare_gguf(gguf_path) / "tokenizer.json").read_text()
        special = _gguf_special_tokens(tokenizer_json, model_path)
    template = load_chat_template(model_path)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "model_max_length": context_length, **special}
    if template is not None:
        config["chat_template"] = template.source
    directory = cache_dir() / f"hf-tokenizer-{name}-ctx{context_length}-v{_FORMAT}"
    if not (directory / "tokenizer_config.json").is_file():
        _write(directory, {"tokenizer.json": tokenizer_json, "tokenizer_config.json": json.dumps(config, indent=1)})
    return str(directory)


def _gguf_special_tokens(tokenizer_json: str, model_path: str) -> dict[str, str]:
    from tokenizers import Tokenizer

    from .model_source import load_config

    tok, cfg = Tokenizer.from_str(tokenizer_json), load_config(model_path)
    ids = {"bos_token": cfg.bos_token_id, "eos_token": cfg.eos_token_id, "pad_token": cfg.pad_token_id}
    names = {key: tok.id_to_token(i) for key, i in ids.items() if i is not None}
    return {key: name for key, name in names.items() if name is not None}


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{directory.name}.tmp", dir=directory.parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        tmp.rename(directory)
        logger.info("wrote the Hugging Face tokenizer files to %s", directory)
    except OSError:
        if not (directory / "tokenizer_config.json").is_file():
            raise
    finally:  # another process may have written it first: ours is dropped
        shutil.rmtree(tmp, ignore_errors=True)
