"""MLflow params read back through the config schema: the encoding orchestrator/config/param_encoding.py writes
(`to_params`), decoded by each key's schema type.

    recorded(params) -> {"cfg.context_len": "1024", ...}   as MLflow records them: the config under one prefix
    config_params(run_params) -> {"context_len": "1024", ...}   back to schema keys (old runs: as they are)
    RunParams.read(params) -> RunParams      the typed values the report needs, decoded by the schema's types

Writing: the resolved config (checked against `SpecsweepConf`, the schema generated from the typed specs) as dotted
keys; strings as they are, every other value as JSON (`1024`, `true`, `null`, `["a", "b"]`). Reading: each key is
decoded by the type its schema field declares (`schema_types`), so the report never guesses (no fallback keys, no
`int(float(...))`). Params recorded before this encoding (Python's `True` / `None`) still decode.

In MLflow the resolved config sits under one prefix, `cfg.` (`cfg.context_len`, `cfg.drafter.name`, ...), so that a
run's ~100 config params sort behind the sweep's axes (`axis.<key>` params and tags,
orchestrator/results/ui_view.py) and `overrides`. Every reader goes through `config_params`, which also reads runs
recorded before the prefix (2026-12-03 and earlier: plain schema keys). The prefix is MLflow's layout only: `RunSpec.params`, run_hash and
point_key never see it.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from orchestrator.config.schema import SpecsweepConf, unwrap_optional

__all__ = ["CONFIG_PREFIX", "RunParams", "config_params", "decode", "recorded", "schema_types"]

MISSING_VALUES = ("", "None", "null")
CONFIG_PREFIX = "cfg."


def recorded(params: Mapping[str, str]) -> dict[str, str]:
    """Config params as MLflow records them: each key under `CONFIG_PREFIX`."""
    return {CONFIG_PREFIX + k: v for k, v in params.items()}


def config_params(params: Mapping[str, str]) -> dict[str, str]:
    """A run's recorded params back as schema keys: the `cfg.` ones with the prefix removed; a run recorded before
    the prefix (no `cfg.` key at all) as it is."""
    config = {k[len(CONFIG_PREFIX):]: v for k, v in params.items() if k.startswith(CONFIG_PREFIX)}
    return config if config else dict(params)


@cache
def schema_types() -> dict[str, Any]:
    """Dotted key -> the declared type of its schema field (`Optional` unwrapped): {"context_len": int, ...}."""
    out: dict[str, Any] = {}

    def walk(schema: type, prefix: str) -> None:
        for name, hint in typing.get_type_hints(schema).items():
            tp = unwrap_optional(hint)[0]
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{name}.")
            else:
                out[f"{prefix}{name}"] = tp
    walk(SpecsweepConf, "")
    return out


def decode(key: str, value: str | None) -> Any:
    """A param's value as its schema field's type; None when absent. Raises KeyError for a key the schema lacks."""
    tp = schema_types()[key]
    if value is None or value in MISSING_VALUES:
        return None
    if tp is str:
        return value
    if tp is bool:
        return value.lower() == "true"
    decoded = json.loads(value)
    if tp is int and isinstance(decoded, float) and decoded.is_integer():
        return int(decoded)
    return decoded


@dataclass(frozen=True)
class RunParams:
    """What the report reads of a child run's params (every field a schema key, decoded by its declared type)."""
    context_len: int = 0
    probe: str = "?"
    drafter: str = "?"
    attention: str = "?"
    page_size: int = 0
    is_oracle: bool = False
    num_steps: int = 0
    concurrency: int = 1
    algorithm: str = "NONE"  # drafter.algorithm
    dtype: str = ""  # model.dtype
    backends: tuple[str, ...] = ()  # attention.backend, decode_backend, prefill_backend (those set)

    KEYS: typing.ClassVar[dict[str, str]] = {
        "context_len": "context_len", "probe": "probe.kind", "drafter": "drafter.name", "attention": "attention.name",
        "page_size": "page_size", "is_oracle": "drafter.is_oracle", "num_steps": "drafter.num_steps",
        "concurrency": "probe.concurrency", "algorithm": "drafter.algorithm", "dtype": "model.dtype"}

    @classmethod
    def read(cls, params: Mapping[str, str]) -> "RunParams":
        """From a run's recorded params (with or without the `cfg.` prefix)."""
        params = config_params(params)
        values = {f: decode(k, params.get(k)) for f, k in cls.KEYS.items()}
        backends = tuple(b for k in ("attention.backend", "attention.decode_backend", "attention.prefill_backend")
                         if (b := decode(k, params.get(k))))
        return cls(**{f: v for f, v in values.items() if v is not None}, backends=backends)
