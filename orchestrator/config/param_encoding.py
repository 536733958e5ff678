"""A resolved config as MLflow params: dotted keys, strings as they are and every other value as JSON. The reading
side, which decodes each key by its schema type, is orchestrator/config/params.py (it needs the schema; the schema's
conversion needs this encoding: two modules, no import cycle).

    flatten(node, leaf=str) -> {"model.name": "tiny", "engine.env": "{}", ...}
    param_value(v) -> str        `1024`, `true`, `null`, `["a", "b"]`; a string as it is
    to_params(config) -> {"context_len": "1024", "drafter.is_oracle": "true", ...}
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any


def flatten(node: Mapping[str, Any], leaf: Callable[[Any], str] = str, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys, each value through `leaf`: {"model.name": "tiny", "engine.env": "{}", ...}
    (an empty section is one key)."""
    out: dict[str, str] = {}
    for k, v in node.items():
        if (type(v) is dict or isinstance(v, Mapping)) and v:  # type() first: an ABC's isinstance is slow
            out.update(flatten(v, leaf, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = leaf(v)
    return out


def param_value(v: Any) -> str:
    """One MLflow param: strings as they are, anything else as JSON (`null`, `true`, `[1, 2]`); read back by
    `orchestrator.config.params.decode`."""
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) or v is None:  # bool is an int: (type, value) tells True from 1
        return _scalar_json(type(v).__name__, v)
    return json.dumps(v)


@functools.lru_cache(maxsize=65536)
def _scalar_json(_: str, v: Any) -> str:
    return json.dumps(v)


def to_params(config: Mapping[str, Any]) -> dict[str, str]:
    """A resolved config as MLflow params (dotted keys, `param_value` encoding)."""
    return flatten(config, leaf=param_value)
