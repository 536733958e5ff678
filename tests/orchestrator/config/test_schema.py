"""DictConfig → RunConfig: composed from the real conf/ tree, no Ray, MLflow or engine."""

from __future__ import annotations

import dataclasses
import enum
import hashlib

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from omegaconf import OmegaConf

from orchestrator.config.param_encoding import flatten
from orchestrator.config.schema import (ClusterConf, DrafterConf, EngineConf, ProbeConf, SpecsweepConf, _from_conf,
                                        _Problems, absolute_tracking_uri, register_configs, structured_conf,
                                        to_run_config)
from orchestrator.config.settings import ClusterKind, ClusterSettings, Thresholds
from specsweep_common.spec import Algorithm, AttentionKind, EngineKind, EngineSpec, ProbeKind
from orchestrator.config.config_error import ConfigError


def compose_cfg(*overrides: str):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


def run_config(*overrides: str, cwd: str = "/work/here"):
    return to_run_config(compose_cfg(*overrides), overrides, cwd=cwd)


def test_defaults_convert_to_typed_specs():
    rc = run_config()
    assert rc.engine.kind is EngineKind.REFERENCE and rc.engine.device == "cpu"
    assert (rc.model.name, rc.model.max_context_len, rc.model.num_q_heads, rc.model.num_kv_heads) == \
        ("smollm2-135m", 8192, 9, 3)  # a real trained model by default; tiny only where a sweep pins it
    # a drafter a newcomer learns from (ngram commits less on novel text), not the oracle's constant num_steps + 1
    assert rc.drafter.name == "ngram" and not rc.drafter.is_oracle
    oracle = run_config("drafter=oracle").drafter
    assert oracle.algorithm is Algorithm.STANDALONE and oracle.is_oracle
    assert oracle.draft_model_path == rc.model.path == "smollm2-135m"  # the oracle drafts with the target
    assert oracle.num_draft_tokens == oracle.num_steps + 1
    assert rc.probe.kind is ProbeKind.PREDICTABLE and rc.probe.gen_tokens == 64
    assert rc.cluster.kind is ClusterKind.LOCAL
    assert rc.tracking.uri == "sqlite:////work/here/mlflow.db"
    assert rc.resume is True and rc.sweep_name == "specsweep"


def test_model_shapes():
    q = run_config("model=qwen3-8b").model
    assert (q.num_layers, q.hidden_size, q.num_q_heads, q.num_kv_heads, q.head_dim, q.max_context_len, q.dtype) \
        == (36, 4096, 32, 8, 128, 40960, "bfloat16")
    d = run_config("model=deepseek-v3").model
    assert d.attention_kind is AttentionKind.MLA
    assert (d.num_layers, d.num_q_heads, d.num_kv_heads, d.head_dim, d.v_head_dim, d.max_context_len) == \
        (61, 128, 1, 576, 512, 163840)
    assert d.kv_bytes_per_token == 61 * 576 * 2


def test_params_are_the_flattened_resolved_config():
    params = dict(run_config("drafter=ngram", "page_size=1").params)
    assert params["drafter.name"] == "ngram" and params["page_size"] == "1"
    assert params["model.path"] == "smollm2-135m" and "hydra.job.name" not in params
    assert flatten({"a": {"b": [1, 2]}, "c": None}) == {"a.b": "[1, 2]", "c": "None"}


def test_unknown_key_is_hydras_own_error():
    for override in ("model.n_layers=3", "pagesize=3"):
        with pytest.raises(ConfigCompositionException) as e:
            compose_cfg(override)
        assert isinstance(e.value.__cause__, (ConfigAttributeError, ConfigKeyError)), override  # "Key 'n_layers' not in 'ModelConf'"
    with pytest.raises(ConfigCompositionException):
        compose_cfg("attention=bogus")
    with pytest.raises(ConfigKeyError):  # a group file with a misspelt key fails to merge the same way
        OmegaConf.merge(OmegaConf.structured(SpecsweepConf), {"model": {"n_layers": 3}})
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg("page_size=sixteen")
    assert isinstance(e.value.__cause__, ValidationError)


def test_keys_appended_with_plus_are_problems():
    with pytest.raises(ConfigError) as e:
        run_config("+model.n_layers=3", "+pagesize=3")
    assert {p.key for p in e.value.problems} == {"model.n_layers", "pagesize"}
    assert "num_layers" in e.value.problems[0].allowed or "num_layers" in e.value.problems[1].allowed


def test_bad_enum_values_are_problems_with_allowed_values():
    with pytest.raises(ConfigError) as e:
        run_config("engine.kind=vllm", "drafter.algorithm=MEDUSA", "probe.kind=random")
    by_key = {p.key: p for p in e.value.problems}
    assert set(by_key) == {"engine.kind", "drafter.algorithm", "probe.kind"}
    assert by_key["engine.kind"].value == "vllm" and "reference, sglang" in by_key["engine.kind"].allowed
    assert "NGRAM" in by_key["drafter.algorithm"].allowed
    assert "engine.kind='vllm'" in str(e.value)


def test_file_probe_identity_is_its_content(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    rc = run_config("probe=file", "probe.path=a.txt", cwd=str(tmp_path))
    assert rc.probe.path == str(tmp_path / "a.txt")
    assert rc.probe.content_sha256 == hashlib.sha256(b"hello").hexdigest()
    with pytest.raises(ConfigError, match="probe.path"):
        run_config("probe=file", cwd=str(tmp_path))
    with pytest.raises(ConfigError, match="an existing regular file"):
        run_config("probe=file", "probe.path=missing.txt", cwd=str(tmp_path))


def test_tracking_uri_made_absolute_only_for_relative_sqlite():
    assert absolute_tracking_uri("sqlite:///mlflow.db", "/x") == "sqlite:////x/mlflow.db"
    assert absolute_tracking_uri("sqlite:////abs/m.db", "/x") == "sqlite:////abs/m.db"
    assert absolute_tracking_uri("http://h:5000", "/x") == "http://h:5000"
    with pytest.raises(ConfigError) as e:  # an empty uri is outside tracking.uri's declared domain
        run_config("tracking=server")
    assert [p.key for p in e.value.problems] == ["tracking.uri"]
    assert run_config("tracking=server", "tracking.uri=http://h:5000").tracking.uri == "http://h:5000"


def test_sweep_files_compose():
    cfg = compose_cfg("+sweep=smoke")
    assert cfg.sweep_name == "smoke" and cfg.gen_tokens == 32 and cfg.page_size == 16
    assert compose_cfg("+sweep=longctx").sweep_name == "longctx"
    # plumbing sweeps pin tiny (long contexts on CPU), make run's probe the real model; model= on the command line wins
    assert compose_cfg().model.name == "smollm2-135m" and compose_cfg("+sweep=probe").model.name == "smollm2-135m"
    for sweep in ("longctx", "smoke", "concurrency"):
        assert compose_cfg(f"+sweep={sweep}").model.name == "tiny", sweep
        assert compose_cfg(f"+sweep={sweep}", "model=qwen3-8b").model.name == "qwen3-8b", sweep


class _Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class _Inner:
    rate: float = 0.5


@dataclasses.dataclass(frozen=True)
class _Outer:
    name: str  # no default: MISSING in the config
    colour: _Colour = _Colour.RED
    args: tuple[str, ...] = ("--a",)
    env: tuple[tuple[str, str], ...] = (("K", "v"),)
    limit: int | None = None
    inner: _Inner | None = None  # a section in the config whatever the default


def test_a_dataclass_round_trips_through_its_generated_structured_config():
    """What `structured_conf` generates composes in OmegaConf with the dataclass's defaults and types, and
    `_from_conf` reads the composed values back into the same dataclass."""
    structured_conf(_Inner, "InnerConf")
    conf = OmegaConf.structured(structured_conf(_Outer, "OuterConf"))
    assert OmegaConf.is_missing(conf, "name")
    assert OmegaConf.to_container(conf.inner) == {"rate": 0.5}
    assert (conf.colour, list(conf.args), dict(conf.env), conf.limit) == ("red", ["--a"], {"K": "v"}, None)
    with pytest.raises(ValidationError):  # the types are the dataclass's
        OmegaConf.merge(conf, {"limit": "many"})
    composed = OmegaConf.to_container(OmegaConf.merge(conf, {"name": "x", "colour": "blue", "env": {"B": "2"},
                                                             "inner": {"rate": 2}}))
    p = _Problems(())
    inner = _from_conf(_Inner, "outer.inner", composed["inner"], p)
    assert _from_conf(_Outer, "outer", composed, p, inner=inner) == \
        _Outer(name="x", colour=_Colour.BLUE, env=(("B", "2"), ("K", "v")), inner=_Inner(rate=2.0))
    assert not p.items
    _from_conf(_Outer, "outer", {**composed, "colour": "green"}, p, inner=None)
    assert [(x.key, x.value, x.allowed) for x in p.items] == [("outer.colour", "green", "one of red, blue")]


def test_each_section_is_its_dataclass():
    """The schema's sections are generated from the dataclasses the config becomes: the same keys in the same
    order (the probe's top-level and computed fields aside)."""
    conf_keys = lambda c: [f.name for f in dataclasses.fields(c)]
    assert conf_keys(EngineConf) == conf_keys(EngineSpec)
    assert conf_keys(ClusterConf) == conf_keys(ClusterSettings)
    assert conf_keys(ProbeConf) == ["kind", "sentence", "path", "task", "concurrency", "repeats"]
    cfg = OmegaConf.structured(SpecsweepConf)
    assert OmegaConf.is_missing(cfg, "drafter") and OmegaConf.structured(DrafterConf).algorithm == "NONE"
    assert cfg.cluster.max_retries == ClusterSettings().max_retries == 2 and cfg.job == "engine"
    assert OmegaConf.to_container(cfg.report) == dataclasses.asdict(Thresholds())


def test_each_default_is_declared_once_as_a_field():
    """conf/config.yaml picks groups only: every top-level default is a field's (RunConfig / SpecsweepConf), and
    what Hydra composes and what the test helpers use are that one value. cluster/ options set only what differs."""
    from pathlib import Path

    import yaml

    from orchestrator.config.run_config import RunConfig
    from tools.testing import PAGE_SIZE

    conf = Path(__file__).resolve().parents[3] / "conf"
    assert set(yaml.safe_load((conf / "config.yaml").read_text())) == {"defaults", "hydra"}
    assert compose_cfg().page_size == PAGE_SIZE == RunConfig.page_size
    assert compose_cfg("+sweep=smoke").page_size == RunConfig.page_size
    defaults = ClusterSettings()
    for option in (conf / "cluster").glob("*.yaml"):
        restated = {k: v for k, v in yaml.safe_load(option.read_text()).items()
                    if k != "kind" and v == getattr(defaults, k)}
        assert not restated, f"{option.name} restates ClusterSettings defaults {restated}"


def test_builtin_models_are_declared_once():
    """`model=tiny` / `model=tiny-draft` compose to the specs of specsweep_common/builtin_models.py (no YAML copy),
    and the reference engine builds the same geometry from them."""
    from specsweep_common.builtin_models import BUILTIN_MODELS
    from workers.reference.config import BUILTIN_CONFIGS

    for name, spec in BUILTIN_MODELS.items():
        assert run_config(f"model={name}").model == spec
        c = BUILTIN_CONFIGS[name]
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                c.max_position_embeddings) == (spec.num_layers, spec.hidden_size, spec.num_q_heads,
                                               spec.num_kv_heads, spec.head_dim, spec.max_context_len)
