"""Where a model's configuration comes from: a built-in name, a GGUF file (or a known GGUF model's name) or a
directory holding a Hugging Face `config.json`.

Above both `config` (the dataclass and the HF translation) and `gguf_checkpoint` (which builds a `ModelConfig` from
a GGUF header), so that neither imports the other.
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import BUILTIN_CONFIGS, ModelConfig, config_from_hf
from .gguf_checkpoint import prepare_gguf, read_config, resolve_gguf


def load_config(model_path: str) -> ModelConfig:
    """A built-in name (`tiny`, `tiny-draft`), a .gguf file or a known GGUF name (gguf_checkpoint.GGUF_MODELS),
    or a directory holding an HF `config.json`."""
    if model_path in BUILTIN_CONFIGS:
        return BUILTIN_CONFIGS[model_path]
    gguf_path = resolve_gguf(model_path)
    if gguf_path is not None:
        return read_config(prepare_gguf(gguf_path))
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"--model-path {model_path!r}: not a built-in config "
                                f"({', '.join(BUILTIN_CONFIGS)}), not a .gguf file and no {path}")
    return config_from_hf(json.loads(path.read_text()))
