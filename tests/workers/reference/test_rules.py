"""The reference engine's plan-time rules (workers/reference/rules.py) name the same algorithms and attention backends
as the engine itself: its parser's choices (args.py) and its attention registry (attention.py, which imports torch,
so the rules keep a plain copy of its names)."""

from __future__ import annotations

from workers.reference import rules
from workers.reference.args import build_parser
from workers.reference.attention import ATTENTION_BACKENDS


def _choices(flag: str) -> tuple[str, ...]:
    action = next(a for a in build_parser()._actions if flag in a.option_strings)
    return tuple(action.choices or ())


def test_the_rules_allow_the_algorithms_the_parser_accepts():
    assert tuple(a.value for a in rules.ALGORITHMS) == _choices("--speculative-algorithm")
    assert {a.value for a in rules.ALGORITHMS} == {"NONE", "NGRAM", "STANDALONE"}


def test_the_rules_allow_the_backends_the_engine_registers():
    assert set(rules.BACKENDS) == set(ATTENTION_BACKENDS) == {"torch", "specsweep_verify"}
