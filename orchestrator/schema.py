"""The config schema (structured configs in Hydra's ConfigStore) and the one conversion
DictConfig → `RunConfig` (frozen dataclasses) done at the entry.

The `*Conf` dataclasses give Hydra the keys and types: an unknown key or a wrong type is Hydra's
own error at composition. Kinds are plain strings there (OmegaConf matches enums by member name,
`REFERENCE`, not by value); `to_run_config` turns them into the enums of `specsweep_vocab.spec`,
reporting each bad value as a `Problem` with what is allowed.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import MISSING, DictConfig, OmegaConf

from orchestrator.settings import AcceleratorMatch, ClusterKind, ClusterSettings, Thresholds, TrackingSettings
from specsweep_vocab.spec import (Algorithm, AttentionKind, AttentionSpec, DrafterSpec, EngineKind, EngineSpec, JobKind,
                                  KERNEL_LAYOUTS, KernelSpec, ModelSpec, ProbeKind, ProbeSpec, SGLangOptions,
                                  StubOptions)
from orchestrator.validate import (LEAF, OPEN, ConfigError, Problem, config_key_problems, probe_file_problem,
                                   unknown_key_problem)

DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")


# --- Schema: what Hydra composes against -------------------------------------------------------


@dataclass
class SGLangConf:
    """`engine.sglang`: SGLang-only launch settings (ignored by other engines)."""

    mem_fraction_static: Optional[float] = None
    cuda_graph_max_bs: Optional[int] = None
    disable_cuda_graph: bool = False
    max_running_requests: Optional[int] = None
    log_level: Optional[str] = None


@dataclass
class StubConf:
    """`engine.stub`: the stub engine's timing (engine.kind=stub only; ignored by other engines)."""

    token_s: float = 0.005  # seconds per generated token
    prefill_s: float = 0.0  # seconds per prompt token
    startup_s: float = 0.2  # seconds before /health answers 200
    rendezvous_timeout_s: float = 120.0  # multi-node (nnodes > 1): rank rendezvous timeout


@dataclass
class EngineConf:
    kind: str = MISSING  # reference | sglang | stub
    version: str = MISSING
    device: str = "cpu"
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    sglang: SGLangConf = field(default_factory=SGLangConf)
    stub: StubConf = field(default_factory=StubConf)


@dataclass
class ModelConf:
    name: str = MISSING
    path: str = MISSING
    max_context_len: int = MISSING
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_q_heads: int = MISSING
    num_kv_heads: int = MISSING
    head_dim: int = MISSING
    v_head_dim: int = MISSING
    attention_kind: str = "gqa"  # gqa | mla
    dtype: str = "float32"
    load_format: str = "dummy"


@dataclass
class DrafterConf:
    name: str = MISSING
    algorithm: str = "NONE"  # Algorithm value
    draft_model_path: Optional[str] = None
    num_steps: int = 0
    topk: int = 1
    num_draft_tokens: int = 0
    is_oracle: bool = False
    extra_args: list[str] = field(default_factory=list)
    draft_window_size: Optional[int] = None  # DFLASH (SGLang): --speculative-draft-window-size
    draft_num_layers: Optional[int] = None  # reference engine: --speculative-draft-num-layers (early-exit draft)


@dataclass
class AttentionConf:
    name: str = MISSING
    backend: str = MISSING
    decode_backend: Optional[str] = None
    prefill_backend: Optional[str] = None
    draft_backend: Optional[str] = None
    # SGLang --speculative-attention-mode (prefill | decode): which of the prefill/decode backends verifies.
    # null: SGLang's default (prefill).
    speculative_attention_mode: Optional[str] = None


@dataclass
class ProbeConf:
    kind: str = MISSING  # predictable | novel | file
    sentence: str = "The cat sat on the mat. "
    path: Optional[str] = None
    concurrency: int = 1  # requests sent at once (each its own prompt); batched by SGLang and the reference engine


@dataclass
class ClusterConf:
    kind: str = "local"  # local | ray
    address: Optional[str] = None
    num_cpus: Optional[int] = None
    num_gpus: Optional[int] = None
    object_store_memory_mb: Optional[int] = None
    include_dashboard: bool = False
    namespace: str = "specsweep"
    runtime_env: Optional[dict[str, Any]] = None
    gpus_per_server: int = 0
    gpus_per_node: Optional[int] = None
    cpus_per_server: float = 1.0
    accelerator: Optional[str] = None  # e.g. sm_120
    accelerator_label: str = "gpu-arch"
    accelerator_match: str = "auto"  # auto | label | resource
    max_concurrent_servers: Optional[int] = None
    max_retries: int = 2


@dataclass
class TrackingConf:
    uri: str = "sqlite:///mlflow.db"
    experiment_name: Optional[str] = None


@dataclass
class KernelConf:
    """`kernel`: one verify-kernel shape (used when `job=kernel`; page size is the top-level `page_size`)."""

    layout: str = "gqa"  # a KERNEL_LAYOUTS name: gqa | mla | gqa-small
    prefix: int = 4096  # prefix (KV) tokens
    tokens: int = 8  # T: tree tokens verified per step
    dtype: str = "bfloat16"  # cuda: any; cpu (Triton interpreter): float32 | float16
    num_q_heads: Optional[int] = None  # null: the layout's
    num_kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None


@dataclass
class MetricsConf:
    """`metrics`: what a run records besides the probe's own figures."""

    # Python regexes with named groups, applied to the engine log lines a run produced: every named group
    # becomes a per-step series (MLflow metric of that name, step = match index). Empty: none.
    log_patterns: list[str] = field(default_factory=list)


# `report`: the diagnosis thresholds (orchestrator.settings.Thresholds), overridable like any key,
# e.g. `report.collapse_drop=0.3`.
ReportConf = dataclasses.make_dataclass(
    "ReportConf", [(f.name, f.type, field(default=f.default)) for f in dataclasses.fields(Thresholds)])


@dataclass
class SpecsweepConf:
    engine: EngineConf = MISSING
    model: ModelConf = MISSING
    drafter: DrafterConf = MISSING
    attention: AttentionConf = MISSING
    probe: ProbeConf = MISSING
    cluster: ClusterConf = field(default_factory=ClusterConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    report: ReportConf = field(default_factory=ReportConf)  # type: ignore[valid-type]
    kernel: KernelConf = field(default_factory=KernelConf)
    metrics: MetricsConf = field(default_factory=MetricsConf)
    job: str = "engine"  # engine (an engine + probe per point) | kernel (one verify-kernel shape per point)
    sweep_name: str = "default"
    context_len: int = 1024
    gen_tokens: int = 64
    page_size: int = 16
    seed: int = 0
    resume: bool = True
    server_context_len: Optional[int] = None  # None = the model's max_context_len
    tp_size: int = 1
    nnodes: int = 1  # nodes one server spans (SGLang --nnodes); tp_size is split evenly across them
    progress: bool = True


_SECTIONS: dict[str, type] = {"engine": EngineConf, "model": ModelConf, "drafter": DrafterConf,
                              "attention": AttentionConf, "probe": ProbeConf, "cluster": ClusterConf,
                              "tracking": TrackingConf, "report": ReportConf, "kernel": KernelConf,
                              "metrics": MetricsConf}


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore (`conf/config.yaml` lists `specsweep_schema` first)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="specsweep_schema", node=SpecsweepConf)


# --- The typed run config ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunConfig:
    """One grid point, fully typed. Nothing below the entry sees a DictConfig."""

    sweep_name: str
    engine: EngineSpec
    model: ModelSpec
    drafter: DrafterSpec
    attention: AttentionSpec
    probe: ProbeSpec
    page_size: int
    seed: int
    tp_size: int
    nnodes: int
    server_context_len: int | None
    cluster: ClusterSettings
    tracking: TrackingSettings
    resume: bool
    progress: bool
    report: Thresholds = field(default_factory=Thresholds)
    job: JobKind = JobKind.ENGINE
    kernel: KernelSpec | None = None  # job=kernel
    log_patterns: tuple[str, ...] = ()  # metrics.log_patterns (checked by validate.log_pattern_problems)
    params: tuple[tuple[str, str], ...] = ()  # flattened resolved config
    overrides: tuple[str, ...] = ()  # this job's Hydra overrides


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


def flatten(node: Any, prefix: str = "") -> dict[str, str]:
    """{"model.name": "tiny", "drafter.extra_args": "[]", ...} from a resolved container."""
    if isinstance(node, dict):
        out: dict[str, str] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: str(node)}


def absolute_tracking_uri(uri: str, cwd: str) -> str:
    """`sqlite:///mlflow.db` → `sqlite:////<cwd>/mlflow.db`: Ray workers have other working dirs."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(Path(cwd, uri[len(prefix):]).resolve())
    return uri


def schema_tree(schema: type = SpecsweepConf) -> dict[str, Any]:
    """The schema's keys: name -> subtree (a section), LEAF (a value) or OPEN (a dict: any sub-key is legal)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(schema):
        section = _SECTIONS.get(f.name) if schema is SpecsweepConf else None
        if section is None and f.default_factory is not dataclasses.MISSING \
                and dataclasses.is_dataclass(default := f.default_factory()):
            section = type(default)
        if section is not None:
            out[f.name] = schema_tree(section)
        else:  # annotations are strings here (`from __future__ import annotations`)
            out[f.name] = OPEN if "dict" in str(f.type) or str(f.type) == "Any" else LEAF
    return out


def config_groups() -> tuple[str, ...]:
    """Hydra config groups under conf/ (engine, model, ..., sweep): `group=option` selects a file."""
    import importlib.resources

    root = importlib.resources.files("conf")
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")))


def override_key_problems(overrides: Sequence[str]) -> list[Problem]:
    """Command-line overrides whose key the schema does not have, each with the closest valid keys, before
    Hydra composes (its own message suggests `+key=...`, which then fails or is silently ignored).
    Left to Hydra: hydra.* keys, config-group selections, deletions, keys under a dict (engine.env.X) and
    anything its parser rejects."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return []
    tree, groups, out = schema_tree(), config_groups(), []
    for o in parsed:
        key = o.key_or_group
        if o.is_delete() or o.package is not None or key.split(".")[0].split("/")[0] == "hydra" or "/" in key:
            continue  # Hydra's own keys, nested group selections (hydra/job_logging=disabled)
        if "." not in key and key in groups:
            continue
        value = o.input_line.split("=", 1)[1] if o.input_line and "=" in o.input_line else None
        if key == "schedule":  # not a config group: schedules are not run configs (orchestrator/schedules/)
            run_groups = ", ".join(g for g in groups if g != "hydra")
            out.append(Problem(key, value, f"a config group ({run_groups}); schedule is none: a schedule is run by "
                               "`specsweep-schedule fire|run` (files in orchestrator/schedules/)", tuple(overrides)))
            continue
        if (p := unknown_key_problem(key, value, tree, tuple(overrides))) is not None:
            out.append(p)
    return out


def to_run_config(cfg: DictConfig, overrides: tuple[str, ...] = (), cwd: str | None = None) -> RunConfig:
    """Convert one composed job config. Raises `ConfigError` listing every bad value it finds."""
    cwd = cwd or os.getcwd()
    p = _Problems(tuple(overrides))
    c: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    c.pop("hydra", None)
    p.items += config_key_problems(c, schema_tree(), p.overrides)
    if p.items:
        raise ConfigError(p.items)
    e, m, d, a, pr, cl, tr = (c[k] for k in ("engine", "model", "drafter", "attention", "probe",
                                              "cluster", "tracking"))

    engine = EngineSpec(
        kind=p.enum("engine.kind", e["kind"], EngineKind),
        version=str(e["version"]),
        device=p.choice("engine.device", e["device"], DEVICES),
        startup_timeout_s=float(e["startup_timeout_s"]),
        request_timeout_s=float(e["request_timeout_s"]),
        extra_args=tuple(e["extra_args"]),
        env=tuple(sorted(e["env"].items())),
        sglang=SGLangOptions(**e["sglang"]) if e["kind"] == EngineKind.SGLANG.value else None,
        stub=StubOptions(**{k: float(v) for k, v in e["stub"].items()}) if e["kind"] == EngineKind.STUB.value
        else None,
    )
    model = ModelSpec(
        name=m["name"], path=m["path"], max_context_len=m["max_context_len"], num_layers=m["num_layers"],
        hidden_size=m["hidden_size"], num_q_heads=m["num_q_heads"], num_kv_heads=m["num_kv_heads"],
        head_dim=m["head_dim"], v_head_dim=m["v_head_dim"],
        attention_kind=p.enum("model.attention_kind", m["attention_kind"], AttentionKind),
        dtype=p.choice("model.dtype", m["dtype"], DTYPES), load_format=m["load_format"],
    )
    drafter = DrafterSpec(
        name=d["name"], algorithm=p.enum("drafter.algorithm", d["algorithm"], Algorithm),
        draft_model_path=d["draft_model_path"], num_steps=d["num_steps"], topk=d["topk"],
        num_draft_tokens=d["num_draft_tokens"], is_oracle=d["is_oracle"],
        extra_args=tuple(d["extra_args"]), draft_window_size=d["draft_window_size"],
        draft_num_layers=d["draft_num_layers"],
    )
    attention = AttentionSpec(name=a["name"], backend=a["backend"], decode_backend=a["decode_backend"],
                              prefill_backend=a["prefill_backend"], draft_backend=a["draft_backend"],
                              speculative_attention_mode=a["speculative_attention_mode"])
    probe_kind = p.enum("probe.kind", pr["kind"], ProbeKind)
    probe_path, digest = None, None
    if probe_kind is ProbeKind.FILE:
        if not pr["path"]:
            p.items.append(Problem("probe.path", pr["path"], "a text or JSONL file path", p.overrides))
        else:
            probe_path = str(Path(cwd, pr["path"]).resolve())
            if Path(probe_path).is_file():
                raw = Path(probe_path).read_bytes()
                digest = hashlib.sha256(raw).hexdigest()
                if problem := probe_file_problem(pr["path"], probe_path, raw, p.overrides):
                    p.items.append(problem)
            else:
                p.items.append(Problem("probe.path", pr["path"], "an existing file", p.overrides))
    probe = ProbeSpec(kind=probe_kind, context_len=c["context_len"], gen_tokens=c["gen_tokens"],
                      sentence=pr["sentence"], path=probe_path, content_sha256=digest, seed=c["seed"],
                      concurrency=pr["concurrency"])
    cluster = ClusterSettings(
        kind=p.enum("cluster.kind", cl["kind"], ClusterKind), address=cl["address"],
        num_cpus=cl["num_cpus"], num_gpus=cl["num_gpus"],
        object_store_memory_mb=cl["object_store_memory_mb"], include_dashboard=cl["include_dashboard"],
        namespace=cl["namespace"], runtime_env=cl["runtime_env"] or None, gpus_per_server=cl["gpus_per_server"],
        gpus_per_node=cl["gpus_per_node"], cpus_per_server=float(cl["cpus_per_server"]),
        accelerator=cl["accelerator"], accelerator_label=cl["accelerator_label"],
        accelerator_match=p.enum("cluster.accelerator_match", cl["accelerator_match"], AcceleratorMatch),
        max_concurrent_servers=cl["max_concurrent_servers"], max_retries=cl["max_retries"],
    )
    tracking = TrackingSettings(uri=absolute_tracking_uri(tr["uri"], cwd),
                                experiment_name=tr["experiment_name"])
    job = p.enum("job", c["job"], JobKind)
    kernel = _kernel_spec(c, p) if job is JobKind.KERNEL else None
    if p.items:
        raise ConfigError(p.items)
    return RunConfig(
        sweep_name=c["sweep_name"], engine=engine, model=model, drafter=drafter, attention=attention,
        probe=probe, page_size=c["page_size"], seed=c["seed"], tp_size=c["tp_size"], nnodes=c["nnodes"],
        server_context_len=c["server_context_len"], cluster=cluster, tracking=tracking,
        resume=c["resume"], progress=c["progress"], report=Thresholds(**c["report"]), job=job, kernel=kernel,
        log_patterns=tuple(c["metrics"]["log_patterns"]), params=tuple(sorted(flatten(c).items())), overrides=tuple(overrides),
    )


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
