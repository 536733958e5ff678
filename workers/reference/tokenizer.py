"""Tokenizers: byte-level for built-in configs; a GGUF file's own (`tokenizers`); a checkpoint's own through
transformers when present."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

from .config import BOS_ID, BYTE_VOCAB, EOS_ID, PAD_ID

logger = logging.getLogger(__name__)


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS/EOS/PAD follow. No BOS is prepended (as SGLang for Qwen)."""

    bos_token_id, eos_token_id, pad_token_id = BOS_ID, EOS_ID, PAD_ID

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < BYTE_VOCAB).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path)
        self.eos_token_id = self._tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return cast(str, self._tok.decode(ids, skip_special_tokens=True))  # one sequence's ids decode to one str


class GGUFTokenizer:
    """The tokenizer built from a GGUF file's metadata (gguf_checkpoint.tokenizer_from_gguf), read from the
    conversion cache's tokenizer.json. No BOS is prepended (tokenizer.ggml.add_bos_token is false for SmolLM2)."""

    def __init__(self, tokenizer_json: str | Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_json))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(model_path: str):
    from .config import BUILTIN_CONFIGS
    from .gguf_checkpoint import prepare_gguf, resolve_gguf

    if model_path in BUILTIN_CONFIGS:
        return ByteTokenizer()
    gguf_path = resolve_gguf(model_path)
    if gguf_path is not None:
        return GGUFTokenizer(prepare_gguf(gguf_path) / "tokenizer.json")
    path = Path(model_path)
    has_files = path.is_dir() and any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
    if has_files:
        try:
            return HFTokenizer(model_path)
        except Exception as exc:  # transformers missing or a broken tokenizer: say so, fall back
            logger.warning("could not load the tokenizer of %s (%s); using the byte tokenizer", model_path, exc)
    elif path.is_dir():
        logger.warning("%s has no tokenizer files; using the byte tokenizer (pass input_ids)", model_path)
    return ByteTokenizer()
