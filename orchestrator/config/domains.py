"""The one check of every config leaf against the domain its field declares (`specsweep_common.domain`).

    domain_problems(config, schema, overrides) -> [Problem]   every leaf of a composed config (plain dicts) outside
                                                              its declared domain: key, value and what is allowed
    schema_leaves(schema) -> [(key, type, Domain | None)]      every value leaf of the schema (a test requires a
                                                              domain on each numeric and string one)

The domains are declared beside the types (`field(metadata=domain(...))` in specsweep_common/spec.py,
orchestrator/config/settings.py, run_config.py and schema.py) and reach the Hydra schema with the fields
(`schema.structured_conf`); this module knows no key by name. It runs for every grid point, in `to_run_config`,
before any rule, Ray, MLflow or engine.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Mapping

from specsweep_common.problem import Problem
from specsweep_common.domain import Domain, domain_of


@functools.cache
def _fields(conf: type) -> tuple[tuple[str, Any, Mapping[str, Any]], ...]:
    """(name, resolved type, metadata) of each field of a structured config."""
    hints = typing.get_type_hints(conf)
    return tuple((f.name, hints[f.name], f.metadata) for f in dataclasses.fields(conf))


def _section(tp: Any) -> type | None:
    """The structured config of a section-typed field (Optional or not); None for a value."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union else [tp]
    sub = args[0] if len(args) == 1 else None
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


@functools.cache
def _checks(conf: type) -> tuple[tuple[str, type | None, Domain | None], ...]:
    """(name, section or None, domain or None) of each field, once per class: every grid point walks them."""
    return tuple((name, _section(tp), domain_of(meta)) for name, tp, meta in _fields(conf))


def domain_problems(config: Mapping[str, Any], schema: type, overrides: tuple[str, ...] = ()) -> list[Problem]:
    out: list[Problem] = []

    def walk(node: Mapping[str, Any], conf: type, prefix: str) -> None:
        for name, sub, d in _checks(conf):
            if name not in node:
                continue
            value = node[name]
            if sub is not None:
                if type(value) is dict or isinstance(value, Mapping):  # type() first: an ABC's isinstance is slow
                    walk(value, sub, f"{prefix}{name}.")
            elif value is not None and d is not None and (why := d.why_not(value)):
                out.append(Problem(prefix + name, value, why, overrides))

    walk(config, schema, "")
    return out


def schema_leaves(schema: type, prefix: str = "") -> list[tuple[str, Any, Domain | None]]:
    out: list[tuple[str, Any, Domain | None]] = []
    for name, tp, meta in _fields(schema):
        sub = _section(tp)
        if sub is not None:
            out += schema_leaves(sub, f"{prefix}{name}.")
        else:
            out.append((prefix + name, tp, domain_of(meta)))
    return out
