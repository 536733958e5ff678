"""Model facts come from the model's file: an override that disagrees is refused naming both, a context longer
than the model was trained for is refused, and an unreadable model is refused by its header before Ray (a 16k prompt on the 8k SmolLM2 recorded "the The The" as an ordinary result,
2026-12-02)."""

from __future__ import annotations

import shutil

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.jobs import convert_and_validate
from orchestrator.config.schema import register_configs
from orchestrator.config.config_error import ConfigError
from specsweep_common.spec import EngineKind
from workers.registry import adapter_for


def _problems(*overrides: str, cwd: str = "/tmp"):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        jobs = [(compose("config", overrides=list(overrides)), overrides)]
    try:
        convert_and_validate(jobs, sweep=False, cwd=cwd)
    except ConfigError as e:
        return {p.key: p for p in e.problems}
    return {}


def test_an_override_of_a_fact_is_refused_naming_both():
    p = _problems("model.max_context_len=16384")["model.max_context_len"]
    assert p.value == 16384 and p.allowed.startswith("8192, what smollm2-135m says")
    assert _problems("model.num_layers=12")["model.num_layers"].allowed.startswith("30,")


def test_a_context_longer_than_the_model_was_trained_for_is_refused():
    p = _problems("context_len=16000")["context_len"]
    assert "max_context_len 8192" in p.allowed


def test_truncated_gguf_and_garbage_folder_refused(tmp_path):
    real = adapter_for(EngineKind.REFERENCE).model_file("smollm2-135m")
    assert real is not None
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as f:
        cut.write_bytes(f.read(4096))  # inside the tokenizer arrays of the header
    p = _problems(f"model.path={cut}")["model.path"]
    assert "truncated" in p.allowed
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "weights.bin").write_bytes(b"\0" * 100)
    assert "without config.json" in _problems(f"model.path={tmp_path / 'junk'}")["model.path"].allowed
    (tmp_path / "text.gguf").write_text("hello")
    assert "no GGUF magic" in _problems(f"model.path={tmp_path / 'text.gguf'}")["model.path"].allowed


def test_a_real_gguf_copy_is_read(tmp_path):
    real = adapter_for(EngineKind.REFERENCE).model_file("smollm2-135m")
    copy = tmp_path / "m.gguf"
    shutil.copyfile(real, copy)
    assert _problems(f"model.path={copy}") == {}


@pytest.mark.parametrize("model", ["tiny", "qwen3-8b"])
def test_models_without_a_file_here_are_left_to_the_engine(model):
    extra = ("engine=sglang", "attention=triton") if model == "qwen3-8b" else ()
    assert _problems(f"model={model}", *extra) == {}
