"""The schema's keys: an unknown key is refused with the keys allowed there and the closest valid ones."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping, Sequence

from specsweep_common.problem import Problem
from specsweep_common.redact import redact_override

# The schema as a key tree (orchestrator.config.schema.schema_tree): name -> subtree, LEAF for a value, OPEN for a
# dict-typed key (engine.env, cluster.runtime_env) under which any key is legal.
LEAF, OPEN = None, "*"


def did_you_mean(name: str, candidates: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)


def _leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, sub in tree.items():
        out += _leaf_paths(sub, f"{prefix}{k}.") if isinstance(sub, Mapping) else [prefix + k]
    return out


def unknown_key_problem(key: str, value: Any, tree: Mapping[str, Any],
                        overrides: tuple[str, ...] = ()) -> Problem | None:
    """None when the dotted `key` exists in the schema (or lies under a dict-typed key); else a Problem
    listing the keys allowed at that level and the closest valid keys."""
    node: Any = tree
    parts = key.split(".")
    for i, part in enumerate(parts):  # noqa: B007 (i is read after the break)
        if node == OPEN:
            return None
        if not isinstance(node, Mapping) or part not in node:
            break
        node = node[part]
    else:
        return None
    parent = ".".join(parts[:i])
    siblings = list(node) if isinstance(node, Mapping) else []
    leaves = [p for p in _leaf_paths(tree) if p != key]
    close = [p for p in leaves if p.rsplit(".", 1)[-1] == parts[-1]]  # the right name at another level
    close += [f"{parent}.{k}" if parent else k for k in siblings
              if k in did_you_mean(part, siblings) or (len(part) >= 3 and k.startswith(part))]
    if not close:
        names = did_you_mean(parts[-1], {p.rsplit(".", 1)[-1] for p in leaves})
        close = [p for p in leaves if p.rsplit(".", 1)[-1] in names]
    close = list(dict.fromkeys(close))[:3]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    if not parent:
        return Problem(key, value, f"a top-level key or a config group{hint} (top-level keys: {', '.join(siblings)})",
                       overrides)
    if siblings:
        return Problem(key, value, f"a key of {parent}{hint} ({parent} has: {', '.join(siblings)})", overrides)
    return Problem(key, value, f"nothing under {parent} (it is a value){hint}", overrides)


def config_key_problems(config: Mapping[str, Any], tree: Mapping[str, Any],
                        overrides: tuple[str, ...] = ()) -> list[Problem]:
    """Every key of a composed config (plain dicts) that the schema does not have, e.g. one added with
    `+engine.stub.tokn_s=1`, checked whichever engine is selected."""
    out: list[Problem] = []

    def walk(node: Mapping[str, Any], sub: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if key not in sub:
                out.append(unknown_key_problem(prefix + key, value, tree, overrides))  # type: ignore[arg-type]
            elif isinstance(sub[key], dict) and (type(value) is dict or isinstance(value, Mapping)):
                walk(value, sub[key], f"{prefix}{key}.")

    walk(config, tree, "")
    return out


def conflicting_override_problems(parsed: Sequence[Any], groups: Iterable[str], selected: Mapping[str, str],
                                  overrides: tuple[str, ...] = ()) -> list[Problem]:
    """Command-line overrides that contradict each other, which Hydra 1.3 resolves silently or with a bare message:
    one key given different values (`model=tiny model=smollm2-135m`: Hydra keeps the last, for a config group and a
    plain key alike; `seed=1,2 seed=3`: the sweeper keeps the last), and `+group=X` for a group the primary config
    already selects (Hydra: "model appears more than once in the final defaults list"). `parsed`: Hydra's parsed
    overrides; `selected`: group -> the option conf/config.yaml picks. The same value twice is harmless."""
    groups = set(groups)
    values: dict[str, list[tuple[str, str]]] = {}
    out: list[Problem] = []
    for o in parsed:
        if o.is_delete() or o.input_line is None or "=" not in o.input_line:
            continue
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        spelled, value = o.input_line.split("=", 1)
        values.setdefault(key, []).append((spelled, value))
        if o.is_add() and not o.package and key in selected:
            out.append(Problem(spelled, value, f"{key}={value}: conf/config.yaml already selects a {key} "
                               f"({selected[key]}), so {spelled} would add a second one, which Hydra refuses; `+` is "
                               f"for a group nothing selects yet (+sweep=...)", overrides))
    for key, given in values.items():
        distinct = list(dict.fromkeys(v for _, v in given))
        if len(distinct) > 1:
            what = "config group" if key.split("@")[0] in groups else "key"
            sweep = "" if any(v.startswith(("[", "{")) for v in distinct) else \
                f"; to sweep over them: {redact_override(key + '=' + ','.join(distinct))}"
            out.append(Problem(key, distinct, f"one value per {what} on the command line (given as "
                               f"{', '.join(redact_override(s + '=' + v) for s, v in given)}; Hydra would silently "
                               f"keep the last){sweep}", overrides))
    return out
