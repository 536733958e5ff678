"""The config schema (structured configs in Hydra's ConfigStore) and the one conversion
DictConfig → `RunConfig` (frozen dataclasses) done at the entry.

Each config key is declared once, as a field of the dataclass it becomes (`specsweep_common.spec` for what a
run is, `orchestrator.config.settings` for where it runs and is recorded, `RunConfig` for the top level): the `*Conf`
structured configs are generated from those (`structured_conf`), and `to_run_config` fills them field by field.
The `*Conf` dataclasses give Hydra the keys and types: an unknown key or a wrong type is Hydra's own error at
composition. Kinds are plain strings there (OmegaConf matches enums by member name, `REFERENCE`, not by value);
`to_run_config` turns them into the enums, reporting each bad value as a `Problem` with what is allowed.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import MISSING, DictConfig, OmegaConf

from orchestrator.config.domains import domain_problems
from orchestrator.config.run_config import CONTEXT_LEN, GEN_TOKENS, LOG_PATTERNS, RunConfig
from orchestrator.config.settings import ClusterSettings, RegressSettings, Thresholds, TrackingSettings
from orchestrator.config.keys import LEAF, OPEN, config_key_problems
from orchestrator.config.param_encoding import to_params
from orchestrator.config.probe_file import probe_file_problem
from orchestrator.config.config_error import ConfigError
from specsweep_common.problem import Problem
from specsweep_common.builtin_models import BUILTIN_MODELS
from specsweep_common.domain import Choice, Int, domain
from specsweep_common.problem import ProblemError, read_file
from specsweep_common.spec import (DTYPES, AttentionSpec, DrafterSpec, EngineKind, EngineSpec, JobKind,
                                  KERNEL_LAYOUTS, KernelSpec, ModelSpec, ProbeKind, ProbeSpec, SGLangOptions,
                                  StubOptions)



PROBE_BYTES_PER_TOKEN = 64  # generous: a BPE token is about 4 bytes of text, JSONL adds its framing
PROBE_FILE_MIN_BYTES = 2 ** 20

# --- The typed run config ----------------------------------------------------------------------


# --- Schema: what Hydra composes against, generated from the dataclasses above ------------------


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of a field's type hint: `int | None` -> (int, True)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _is_pairs(tp: Any) -> bool:
    """`tuple[tuple[str, str], ...]`: a mapping kept hashable (engine.env)."""
    return typing.get_origin(tp) is tuple and typing.get_origin(typing.get_args(tp)[0]) is tuple


_CONFS: dict[type, type] = {}  # spec dataclass -> its structured config


def structured_conf(spec: type, name: str, *, replace: Mapping[str, Sequence[tuple[str, Any, Any]]] = {},
                    after: Mapping[str, Sequence[tuple[str, Any, Any]]] = {}) -> type:
    """The structured config of the dataclass `spec`: its fields, in its order, with its defaults, in the types
    OmegaConf composes: an enum as its value string, a tuple as a list, pairs as a dict, a nested dataclass
    (optional or not) as its section, a field without a default as MISSING. `replace` swaps a field for other
    (name, type, Field) entries (none: left out of the config), `after` adds entries after a field."""
    hints = typing.get_type_hints(spec)
    entries: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(spec):
        entries += replace[f.name] if f.name in replace else [(f.name, *_conf_field(hints[f.name], f))]
        entries += after.get(f.name, ())
    conf = dataclasses.make_dataclass(name, entries)
    conf.__doc__ = (f"`{spec.__qualname__}` as Hydra composes it "
                    "(generated: see orchestrator.config.schema.structured_conf).")
    _CONFS[spec] = conf
    return conf


def _conf_field(hint: Any, f: dataclasses.Field) -> tuple[Any, Any]:
    tp, optional = unwrap_optional(hint)
    default = f.default if f.default is not dataclasses.MISSING else \
        f.default_factory() if f.default_factory is not dataclasses.MISSING else MISSING
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a section: always present, its own defaults
        conf = _CONFS[tp]
        if default is MISSING:
            return conf, field(default=MISSING)
        assert default is None or default == tp(), f"{f.name}: a section's default is its dataclass's defaults"
        return conf, field(default_factory=conf)
    meta = f.metadata
    if _is_enum(tp):  # its members are its domain
        return str, field(default=MISSING if default is MISSING else default.value,
                          metadata=domain(Choice(*(m.value for m in tp)), meta))
    if _is_pairs(tp):
        return dict[str, str], field(default_factory=lambda: dict(default), metadata=meta)
    if typing.get_origin(tp) is tuple:
        return list[typing.get_args(tp)[0]], field(default_factory=lambda: list(default),  # type: ignore[misc]
                                                   metadata=meta)
    return (Optional[tp] if optional else tp), field(default=default, metadata=meta)


SGLangConf = structured_conf(SGLangOptions, "SGLangConf")  # engine.sglang (engine.kind=sglang only)
StubConf = structured_conf(StubOptions, "StubConf")  # engine.stub (engine.kind=stub only)
EngineConf = structured_conf(EngineSpec, "EngineConf")
ModelConf = structured_conf(ModelSpec, "ModelConf")
DrafterConf = structured_conf(DrafterSpec, "DrafterConf")
AttentionConf = structured_conf(AttentionSpec, "AttentionConf")
# content_sha256 is computed, the others are top-level keys (context_len, gen_tokens, seed) or fixed (temperature 0)
ProbeConf = structured_conf(ProbeSpec, "ProbeConf", replace={k: () for k in ("context_len", "gen_tokens",
                                                                             "content_sha256", "seed", "temperature")})
ClusterConf = structured_conf(ClusterSettings, "ClusterConf")
TrackingConf = structured_conf(TrackingSettings, "TrackingConf")
# `report`: the diagnosis thresholds, overridable like any key, e.g. `report.collapse_drop=0.3`.
ReportConf = structured_conf(Thresholds, "ReportConf")
# `regress`: the comparison with the sweep's history, e.g. `regress.baseline=git_sha:3f2c1ab`.
RegressConf = structured_conf(RegressSettings, "RegressConf")


@dataclass
class KernelConf:
    """`kernel`: one verify-kernel shape (used when `job=kernel`; page size is the top-level `page_size`). What the
    user asks for: `_kernel_spec` resolves it into a KernelSpec (the layout's heads and dims unless set here)."""

    # a KERNEL_LAYOUTS name: gqa | mla | gqa-small
    layout: str = field(default="gqa", metadata=domain(Choice(*KERNEL_LAYOUTS)))
    prefix: int = field(default=4096, metadata=domain(CONTEXT_LEN))  # prefix (KV) tokens
    tokens: int = field(default=8, metadata=domain(Int(1, 4096)))  # T: tree tokens verified per step
    # cuda: any; cpu (Triton interpreter): float32 | float16
    dtype: str = field(default="bfloat16", metadata=domain(Choice(*DTYPES)))
    num_q_heads: Optional[int] = field(default=None, metadata=domain(Int(1, 4096)))  # null: the layout's
    num_kv_heads: Optional[int] = field(default=None, metadata=domain(Int(1, 4096)))
    head_dim: Optional[int] = field(default=None, metadata=domain(Int(1, 4096)))
    v_head_dim: Optional[int] = field(default=None, metadata=domain(Int(1, 4096)))


@dataclass
class MetricsConf:
    """`metrics`: what a run records besides the probe's own figures."""

    # Python regexes with named groups, applied to the engine log lines a run produced: every named group
    # becomes a per-step series (MLflow metric of that name, step = match index). Empty: none.
    log_patterns: list[str] = field(default_factory=list, metadata=domain(LOG_PATTERNS))


SpecsweepConf = structured_conf(RunConfig, "SpecsweepConf", replace={
    "kernel": [("kernel", KernelConf, field(default_factory=KernelConf))],
    "log_patterns": [("metrics", MetricsConf, field(default_factory=MetricsConf))],
    "params": (), "overrides": ()},
    after={"sweep_name": [("context_len", int, field(default=1024, metadata=domain(CONTEXT_LEN))),  # prompt tokens
                          ("gen_tokens", int, field(default=64, metadata=domain(GEN_TOKENS)))]})  # generated per run


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore (`conf/config.yaml` lists `specsweep_schema` first), and the reference
    engine's built-in models as the `model` group's options `tiny` and `tiny-draft` (declared once, in
    specsweep_common/builtin_models.py; the other options are conf/model/*.yaml)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="specsweep_schema", node=SpecsweepConf)
    for name, model in BUILTIN_MODELS.items():
        store.store(group="model", name=name, node=ModelConf(**_conf_values(model)))


# --- DictConfig -> RunConfig ---------------------------------------------------------------------


class _Problems:
    """Collects conversion problems so one pass reports every bad value."""

    def __init__(self, overrides: tuple[str, ...]):
        self.overrides = overrides
        self.items: list[Problem] = []

    def enum(self, key: str, value: Any, kind: type[enum.Enum]) -> Any:
        try:
            return kind(value)
        except ValueError:
            allowed = "one of " + ", ".join(m.value for m in kind)
            self.items.append(Problem(key, value, allowed, self.overrides))
            return None

    def choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> Any:
        if value not in allowed:
            self.items.append(Problem(key, value, "one of " + ", ".join(allowed), self.overrides))
        return value


def _from_conf(spec: type, key: str, values: Mapping[str, Any], p: _Problems, **given: Any) -> Any:
    """`spec` from its composed section `values`, field by field (the inverse of `structured_conf`): an enum
    checked against its members (each bad value a Problem), a list as a tuple, a dict as sorted pairs. `given` fields are the caller's (computed, or from elsewhere in the config)."""
    kwargs: dict[str, Any] = {}
    for fname, tp, kind in _field_kinds(spec):
        if fname in given:
            kwargs[fname] = given[fname]
        elif fname in values:
            v = values[fname]
            if kind == "enum":
                v = p.enum(f"{key}.{fname}" if key else fname, v, tp)
            elif kind == "pairs":
                v = tuple(sorted(v.items()))
            elif kind == "tuple":
                v = tuple(v)
            kwargs[fname] = v
    return spec(**kwargs)


@functools.cache
def _field_kinds(spec: type) -> tuple[tuple[str, Any, str], ...]:
    """(name, type, how `_from_conf` converts it: enum, pairs, tuple or as is) per field, once per class."""
    out = []
    for f in dataclasses.fields(spec):
        tp = unwrap_optional(_type_hints(spec)[f.name])[0]
        kind = ("enum" if _is_enum(tp) else "pairs" if _is_pairs(tp) else
                "tuple" if typing.get_origin(tp) is tuple else "")
        out.append((f.name, tp, kind))
    return tuple(out)


def _conf_values(spec: Any) -> dict[str, Any]:
    """A spec's fields as its structured config holds them (`_from_conf` the other way): an enum as its value."""
    return {f.name: v.value if isinstance(v := getattr(spec, f.name), enum.Enum) else v
            for f in dataclasses.fields(spec)}


@functools.lru_cache(maxsize=256)  # every grid point asks, with the same two strings
def absolute_tracking_uri(uri: str, cwd: str) -> str:
    """`sqlite:///mlflow.db` → `sqlite:////<cwd>/mlflow.db`: Ray workers have other working dirs."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(Path(cwd, uri[len(prefix):]).resolve())
    return uri


@functools.cache
def _type_hints(spec: type) -> dict[str, Any]:
    """`typing.get_type_hints`, once per class (it costs ~0.2 ms a call, and every grid point asks)."""
    return typing.get_type_hints(spec)


def _engine_sections(e: Mapping[str, Any]) -> dict[str, Any]:
    """EngineSpec's per-engine sections (a field named after an engine kind: `engine.sglang`, `engine.stub`): the
    configured kind's, built from its keys; the others None (they are no part of that engine's server)."""
    out: dict[str, Any] = {}
    for name, hint in _type_hints(EngineSpec).items():
        if EngineKind.named(name) is not None:
            out[name] = unwrap_optional(hint)[0](**e[name]) if e["kind"] == name else None
    return out


@functools.cache
def schema_tree(schema: type = SpecsweepConf) -> Mapping[str, Any]:
    """The schema's keys: name -> subtree (a section), LEAF (a value) or OPEN (a dict: any sub-key is legal).
    Computed once per schema class: read it, never change it."""
    out: dict[str, Any] = {}
    for name, hint in _type_hints(schema).items():
        tp = unwrap_optional(hint)[0]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out[name] = schema_tree(tp)
        else:
            out[name] = OPEN if tp is dict or typing.get_origin(tp) is dict or tp is Any else LEAF
    return out


def to_run_config(cfg: DictConfig | Mapping[str, Any], overrides: tuple[str, ...] = (),
                  cwd: str | None = None) -> RunConfig:
    """Convert one composed job config (a DictConfig, or its resolved plain containers as
    `orchestrator.config.grid.compose_grid` gives them). Raises `ConfigError` listing every bad value it finds."""
    cwd = cwd or os.getcwd()
    p = _Problems(tuple(overrides))
    c: dict[str, Any] = (OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig)  # type: ignore[assignment]
                         else dict(cfg))
    c.pop("hydra", None)
    p.items += config_key_problems(c, schema_tree(), p.overrides)
    if not p.items:  # every leaf in its declared domain (orchestrator/config/domains.py)
        p.items += domain_problems(c, SpecsweepConf, p.overrides)
    if p.items:
        raise ConfigError(p.items)
    e, pr = c["engine"], c["probe"]
    engine = _from_conf(EngineSpec, "engine", e, p, **_engine_sections(e))
    model = _from_conf(ModelSpec, "model", c["model"], p)
    drafter = _from_conf(DrafterSpec, "drafter", c["drafter"], p)
    attention = _from_conf(AttentionSpec, "attention", c["attention"], p)
    probe_kind = p.enum("probe.kind", pr["kind"], ProbeKind)
    probe_path, digest = None, None
    if probe_kind is ProbeKind.FILE:
        if not pr["path"]:
            p.items.append(Problem("probe.path", pr["path"], "a text or JSONL file path", p.overrides))
        else:
            probe_path = str(Path(cwd, pr["path"]).resolve())
            # no more than the longest context this model takes could use: read only that much
            limit = max(PROBE_FILE_MIN_BYTES, PROBE_BYTES_PER_TOKEN * int(c["model"]["max_context_len"]))
            raw: bytes | None = None
            if not Path(probe_path).is_file():  # a folder, a FIFO, a device: never opened
                p.items.append(Problem("probe.path", pr["path"], "an existing regular file", p.overrides))
            elif not os.access(probe_path, os.R_OK):
                p.items.append(Problem("probe.path", pr["path"], "a readable file", p.overrides))
            else:
                try:
                    raw = read_file("probe.path", pr["path"], probe_path, limit=limit + 1, overrides=p.overrides)
                except ProblemError as e:
                    p.items.append(e.problem)
            if raw is not None:
                digest = hashlib.sha256(raw).hexdigest()
                if len(raw) > limit:
                    p.items.append(Problem("probe.path", pr["path"], f"a file of at most {limit} bytes "
                                           f"({PROBE_BYTES_PER_TOKEN} bytes per token of model.max_context_len "
                                           f"{c['model']['max_context_len']}): more could never be sent", p.overrides))
                elif problem := probe_file_problem(pr["path"], probe_path, raw, p.overrides):
                    p.items.append(problem)
    probe = _from_conf(ProbeSpec, "probe", pr, p, kind=probe_kind, context_len=c["context_len"],
                       gen_tokens=c["gen_tokens"], path=probe_path, content_sha256=digest, seed=c["seed"])
    cluster = _from_conf(ClusterSettings, "cluster", c["cluster"], p, runtime_env=c["cluster"]["runtime_env"] or None)
    tracking = _from_conf(TrackingSettings, "tracking", c["tracking"], p,
                          uri=absolute_tracking_uri(c["tracking"]["uri"], cwd))
    job = p.enum("job", c["job"], JobKind)
    kernel = _kernel_spec(c, p) if job is JobKind.KERNEL else None
    report = _from_conf(Thresholds, "report", c["report"], p)
    if p.items:
        raise ConfigError(p.items)
    return _from_conf(RunConfig, "", c, p, engine=engine, model=model, drafter=drafter, attention=attention,
                      probe=probe, cluster=cluster, tracking=tracking, report=report,
                      regress=_from_conf(RegressSettings, "regress", c["regress"], p),
                      job=job, kernel=kernel, log_patterns=tuple(c["metrics"]["log_patterns"]),
                      params=tuple(sorted(to_params(c).items())), overrides=tuple(overrides))


def _kernel_spec(c: dict[str, Any], p: _Problems) -> KernelSpec | None:
    k = c["kernel"]
    layout = p.choice("kernel.layout", k["layout"], tuple(KERNEL_LAYOUTS))
    dtype = p.choice("kernel.dtype", k["dtype"], DTYPES)
    if layout not in KERNEL_LAYOUTS:
        return None
    q, kv, hd, vd, mla = KERNEL_LAYOUTS[layout]
    pick = lambda key, preset: preset if k[key] is None else k[key]  # noqa: E731
    return KernelSpec(layout=layout, num_q_heads=pick("num_q_heads", q), num_kv_heads=pick("num_kv_heads", kv),
                      head_dim=pick("head_dim", hd), v_head_dim=pick("v_head_dim", vd), mla=mla,
                      prefix=k["prefix"], tokens=k["tokens"], page_size=c["page_size"], dtype=dtype,
                      device=c["engine"]["device"], seed=c["seed"])
