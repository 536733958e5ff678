from __future__ import annotations

import pytest

from workers.reference.args import parse_args
from workers.reference.attention import create_attention_backend
from workers.reference.engine import Engine
from workers.reference.runner import ModelRunner


def _make_engine(*flags: str) -> Engine:
    return Engine(parse_args(["--model-path", "tiny", "--load-format", "dummy", "--context-length", "2048", *flags]))


def _make_runner(model, page_size: int, chunk: int = 2048, max_tokens: int = 1024) -> ModelRunner:
    return ModelRunner(model, create_attention_backend("torch"), page_size=page_size, max_total_tokens=max_tokens,
                       max_seq_tokens=max_tokens, chunked_prefill_size=chunk)


@pytest.fixture
def make_engine():
    """make_engine(*extra_flags) -> Engine on `tiny` with dummy weights, context 2048; closed after the test."""
    engines = []

    def make(*flags: str) -> Engine:
        engines.append(_make_engine(*flags))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def make_runner():
    """make_runner(model, page_size, chunk=2048, max_tokens=1024) -> ModelRunner with the torch backend."""
    return _make_runner
