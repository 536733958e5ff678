"""A grid's jobs composed in O(points): Hydra composes once per distinct choice of config groups, and each job's
plain-key overrides are applied to a copy of that composition, each override's effect computed once by Hydra itself.

    compose_grid(job_overrides, compose, is_group, *, fast=True) -> list[dict]   each job's resolved config (plain dicts, no
                                                                   `hydra` node), exactly what composing the job
                                                                   alone and `OmegaConf.to_container(resolve=True)`
                                                                   give
    hydra_group_test(loader) -> is_group                           Hydra's own test of "is this key a config group"

Why: composing one job costs Hydra ~0.15 s on these cores (the defaults list, every YAML file, the schema merge), so a
8,000-point grid composed point by point took minutes. Most axes are plain keys (`context_len`, `seed`, ...), whose
overrides Hydra applies after composition (`ConfigLoaderImpl._apply_overrides_to_config`), one after another.

The fast path is exact by construction, and a job falls back to a full composition of its own whenever it could not
be: an override Hydra fails to apply (the full composition then raises Hydra's own error), a key path that is not a
plain dotted name, two overrides of one job on the same key or one under the other, a value with an interpolation, or
an override of a key that some interpolation of the composition reads (`drafter.draft_model_path: ${model.path}`).
`tests/orchestrator/config/test_grid.py` compares both paths job by job.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

Compose = Callable[[list[str]], DictConfig]  # overrides -> a composed config with its `hydra` node
_PLAIN_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")
_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")
_REF = re.compile(r"\.*[A-Za-z_][\w.-]*")


def hydra_group_test(loader: Any) -> Callable[[str], bool]:
    """`key -> is it a config group` as Hydra's defaults list decides it (`Overrides.__init__`:
    `repo.group_exists(override.key_or_group)`)."""
    return loader.repository.group_exists  # type: ignore[no-any-return]


@dataclass
class _Base:
    """One composition (a distinct choice of config groups) and what plain overrides do to it."""

    cfg: DictConfig
    container: dict[str, Any]
    references: tuple[str, ...]  # the key paths its interpolations read (relative ones with their leading dots)
    effects: dict[str, Any] = field(default_factory=dict)  # override string -> its value at its key, or _FAILS
    scratch: DictConfig | None = None  # a copy of cfg that scalar overrides are applied to, one after another


_FAILS = object()


def compose_grid(job_overrides: Sequence[Sequence[str]], compose: Compose,
                 is_group: Callable[[str], bool], *, fast: bool = True) -> list[dict[str, Any]]:
    if not fast:  # every job in full: the reference (tests, `tools.bench_validate --slow`)
        return [_task(compose(list(o))) for o in job_overrides]
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed: dict[str, Any] = {}
    structural_of: dict[str, bool] = {}
    bases: dict[tuple[str, ...], _Base] = {}
    out: list[dict[str, Any]] = []
    for overrides in job_overrides:
        for o in overrides:
            if o not in parsed:
                parsed[o] = parser.parse_overrides([o])[0]
                structural_of[o] = _structural(parsed[o], is_group)
        structural = tuple(o for o in overrides if structural_of[o])
        plain = [o for o in overrides if o not in structural]
        if structural not in bases:
            cfg = compose(list(structural))
            bases[structural] = _Base(cfg, _task(cfg), tuple(_references(_unresolved(cfg))))
        base = bases[structural]
        keys = [parsed[o].key_or_group for o in plain]
        if not _fast(base, plain, keys, parsed):
            out.append(_task(compose(list(overrides))))
            continue
        for o in plain:
            if o not in base.effects:
                base.effects[o] = _effect(base, parsed[o], ConfigLoaderImpl._apply_overrides_to_config)
        if any(base.effects[o] is _FAILS for o in plain):
            out.append(_task(compose(list(overrides))))
            continue
        job = _copy(base.container)
        for o, key in zip(plain, keys):
            _set(job, key, _copy(base.effects[o]))
        out.append(job)
    return out


def _effect(base: _Base, o: Any, apply: Callable[[list[Any], DictConfig], None]) -> Any:
    """What Hydra's applying override `o` to the base composition leaves at its key (resolved plain containers), or
    _FAILS. A scalar value over a leaf that is there replaces it whatever it was, so these share one scratch copy
    of the base (they touch nothing else: keys read by interpolations never take the fast path); anything else (a
    dict or list value, which may merge; a key that is not there; a section) gets a fresh copy."""
    try:
        at = _at(base.container, o.key_or_group)
    except (KeyError, TypeError):
        at = _FAILS  # not there yet (`+key=...`)
    scalar = not isinstance(o.value(), (dict, list)) and at is not _FAILS and not isinstance(at, (dict, list))
    trial = base.scratch if scalar and base.scratch is not None else copy.deepcopy(base.cfg)
    try:
        apply([o], trial)
        value = OmegaConf.select(trial, o.key_or_group) if scalar else _at(_task(trial), o.key_or_group)
    except Exception:  # noqa: BLE001 - Hydra's and OmegaConf's errors: the job's full composition raises them
        if scalar:
            base.scratch = None  # perhaps half-applied: the next scalar starts from a fresh copy
        return _FAILS
    if scalar:
        base.scratch = trial
    return value


def _structural(o: Any, is_group: Callable[[str], bool]) -> bool:
    """Overrides that change the defaults list or Hydra's node: composed, never applied afterwards."""
    key = o.key_or_group
    return (o.package is not None or o.is_delete() or key.split(".")[0] == "hydra"
            or (is_group(key) and not isinstance(o.value(), dict)))


def _fast(base: _Base, plain: list[str], keys: list[str], parsed: dict[str, Any]) -> bool:
    values = [o.partition("=")[2] for o in plain]
    if any(not _PLAIN_KEY.fullmatch(k) for k in keys) or any("${" in v or "???" in v for v in values):
        return False
    if not all(_parents_are_dicts(base.container, k) for k in keys):  # a key under a null or a leaf
        return False
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if _overlap(a, b):
                return False
    for ref in base.references:
        if ref.startswith("hydra") or ref.startswith("."):  # Hydra's node differs per job; relative: not followed
            return False
        if any(_overlap(ref, k) for k in keys):
            return False
    return True


def _parents_are_dicts(container: dict[str, Any], key: str) -> bool:
    node: Any = container
    for part in key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return False
    return True


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _unresolved(cfg: DictConfig) -> dict[str, Any]:
    return _task(cfg, resolve=False)


def _references(node: Any) -> list[str]:
    """Every dotted name inside an interpolation of `node` (resolver names too: more is only slower, never wrong)."""
    if isinstance(node, dict):
        return [r for v in node.values() for r in _references(v)]
    if isinstance(node, list):
        return [r for v in node for r in _references(v)]
    if isinstance(node, str) and "${" in node:
        refs = [r for inner in _INTERPOLATION.findall(node) for r in _REF.findall(inner)]
        return refs or ["."]  # an interpolation we cannot read: no fast path
    return []


def _task(cfg: DictConfig, *, resolve: bool = True) -> dict[str, Any]:
    """A composed config as `to_run_config` reads it: resolved plain containers, without Hydra's node (not
    resolved: its `${hydra.job.num}` is set only for a launched job)."""
    out: dict[str, Any] = {}
    for k in cfg:
        if k == "hydra":
            continue
        node = cfg._get_node(k)
        out[str(k)] = (OmegaConf.to_container(node, resolve=resolve) if OmegaConf.is_config(node)
                       else (cfg[k] if resolve else node._value()))  # type: ignore[union-attr]
    return out


def _at(container: dict[str, Any], key: str) -> Any:
    node: Any = container
    for part in key.split("."):
        node = node[part]
    return node


def _set(container: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = container
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _copy(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node
