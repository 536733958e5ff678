"""Model facts are read from the model's file, never taken from an override.

    model_fact_problems(rc) -> [Problem]   for a model with a file (a .gguf, a known GGUF name, a checkpoint folder
                                           with config.json): each of model.max_context_len, num_layers,
                                           hidden_size, num_q_heads and num_kv_heads must equal the file's (a
                                           disagreeing override is refused, naming both), the file must be
                                           readable (a truncated GGUF, a folder of garbage: refused), and so a
                                           context longer than the model was trained for is refused by the
                                           context rule (validate.check_context) against the true length.

GGUF: only the header's key-value section is read (the format: magic `GGUF`, version, tensor and key counts, then
typed keys; `<arch>.context_length`, `.block_count`, `.embedding_length`, `.attention.head_count[_kv]`), never the
tensors. Cached per (path, size, mtime): a grid reads each file once. Built-in configs (tiny) and hub ids that are
not local paths have no file here and are left to the engine.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from pathlib import Path
from typing import IO, Any

from specsweep_common.problem import Problem
from workers.registry import adapter_for

FACTS = ("max_context_len", "num_layers", "hidden_size", "num_q_heads", "num_kv_heads")
GGUF_KEYS = {"max_context_len": "context_length", "num_layers": "block_count", "hidden_size": "embedding_length",
             "num_q_heads": "attention.head_count", "num_kv_heads": "attention.head_count_kv"}
HF_KEYS = {"max_context_len": "max_position_embeddings", "num_layers": "num_hidden_layers",
           "hidden_size": "hidden_size", "num_q_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
MAX_KEYS = 1 << 16


class Unreadable(ValueError):
    pass


def _read(f: IO[bytes], n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise Unreadable("the file ends inside its header (truncated)")
    return b


def _value(f: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if kind == 8:
        (n,) = struct.unpack("<Q", _read(f, 8))
        return _read(f, n).decode("utf-8", "replace")
    if kind == 9:
        item, n = struct.unpack("<IQ", _read(f, 12))
        for _ in range(n):
            _value(f, item)
        return None
    raise Unreadable(f"unknown GGUF value type {kind}")


def gguf_header(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise Unreadable("no GGUF magic at its start")
        version, _tensors, keys = struct.unpack("<IQQ", _read(f, 20))
        if version < 2 or keys > MAX_KEYS:
            raise Unreadable(f"GGUF version {version} with {keys} keys is not one we read")
        meta: dict[str, Any] = {}
        for _ in range(keys):
            (n,) = struct.unpack("<Q", _read(f, 8))
            name = _read(f, n).decode("utf-8", "replace")
            (kind,) = struct.unpack("<I", _read(f, 4))
            meta[name] = _value(f, kind)
    return meta


@functools.cache
def _facts(path: str, _stamp: tuple[int, float]) -> dict[str, int]:
    if os.path.isdir(path):
        config = Path(path, "config.json")
        if not config.is_file():
            raise Unreadable("a folder without config.json (not a checkpoint)")
        try:
            c = json.loads(config.read_text())
            c = c.get("text_config", c)
            return {k: int(c[v]) for k, v in HF_KEYS.items() if v in c}
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as e:
            raise Unreadable(f"config.json is not a model config ({e})") from None
    meta = gguf_header(path)
    arch = meta.get("general.architecture")
    out = {k: int(meta[f"{arch}.{v}"]) for k, v in GGUF_KEYS.items() if f"{arch}.{v}" in meta}
    if "max_context_len" not in out:
        raise Unreadable(f"its header has no {arch}.context_length")
    return out


def model_file(rc: Any) -> str | None:
    """The local file or folder holding the point's model, as its engine resolves model.path (the reference
    engine: a packaged GGUF name to its file; `EngineAdapter.model_file`)."""
    return adapter_for(rc.engine.kind).model_file(rc.model.path)


def model_fact_problems(rc: Any) -> list[Problem]:
    m = rc.model
    file = model_file(rc)
    if file is None:
        return []
    try:
        st = os.stat(file)
        if not (os.path.isdir(file) or file.endswith(".gguf")):
            raise Unreadable("a file that is neither a .gguf nor a checkpoint folder")
        facts = _facts(file, (st.st_size, st.st_mtime))
    except (OSError, Unreadable) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return [Problem("model.path", m.path, f"a model whose header can be read ({why})", rc.overrides)]
    return [Problem(f"model.{k}", getattr(m, k), f"{v}, what {m.path} says (a model fact is read from its file, "
                    "not overridden)", rc.overrides)
            for k, v in facts.items() if k in FACTS and getattr(m, k) != v]
