"""What a config leaf allows, declared once beside its type: `field(default=..., metadata=domain(Num(0, 60)))`.

A `Domain` says, in one object, what values a leaf accepts (range and finiteness, a set of choices, a length and a
pattern) and in words what that is. `orchestrator/config/domains.py` checks every leaf of every grid point
against the domain its field declares; `tests/orchestrator/config/test_domains.py` fails when a numeric or string
leaf of the schema has none. None is never judged here: whether a leaf may be null is its type's business.

    Int(lo, hi)             an integer in [lo, hi]
    Num(lo, hi, lo_open=)   a finite number in [lo, hi] (or (lo, hi])
    Choice(*values)         one of a fixed set
    Text(max_len, pattern=, empty=)   a string
    NAME                    a name that becomes a path or an identifier (sweep, schedule, experiment names)
    Items(domain, max_items)   a list whose every item is in `domain`

Standard library only: specsweep_common is shared by the driver and the workers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

DOMAIN_KEY = "domain"


class Domain:
    """A leaf's allowed values. `why_not(value)` is None for an allowed value, else what is allowed, in words."""

    def describe(self) -> str:
        raise NotImplementedError

    def why_not(self, value: Any) -> str | None:
        raise NotImplementedError


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Int(Domain):
    lo: int
    hi: int

    def describe(self) -> str:
        return f"an integer in [{self.lo}, {self.hi}]"

    def why_not(self, value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and self.lo <= value <= self.hi
        return None if ok else self.describe()


@dataclass(frozen=True)
class Num(Domain):
    lo: float
    hi: float
    lo_open: bool = False

    def describe(self) -> str:
        return f"a finite number in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}]"

    def why_not(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return self.describe()
        above = value > self.lo if self.lo_open else value >= self.lo
        return None if above and value <= self.hi else self.describe()


@dataclass(frozen=True)
class Choice(Domain):
    values: tuple[str, ...]

    def __init__(self, *values: str):
        object.__setattr__(self, "values", tuple(values))

    def describe(self) -> str:
        return "one of " + ", ".join(self.values)

    def why_not(self, value: Any) -> str | None:
        return None if value in self.values else self.describe()


@dataclass(frozen=True)
class Text(Domain):
    max_len: int
    pattern: str | None = None  # a full match is required
    empty: bool = False  # "" allowed
    what: str = "a string"  # the words for the pattern

    def describe(self) -> str:
        return f"{self.what}{'' if self.empty else ', not empty'}, at most {self.max_len} characters" + (
            f" (matching {self.pattern})" if self.pattern else "")

    def why_not(self, value: Any) -> str | None:
        if not isinstance(value, str) or len(value) > self.max_len or (not value and not self.empty) \
                or "\0" in value:
            return self.describe()
        if value and self.pattern and not re.fullmatch(self.pattern, value):
            return self.describe()
        return None


@dataclass(frozen=True)
class Name(Domain):
    """One rule for every name that becomes a path or an identifier (a folder, an MLflow experiment, a Ray
    job id): not empty, no path separator, not `.` or `..` (nor containing `..`), printable, at most `max_len`."""

    max_len: int = 100

    def describe(self) -> str:
        return (f"a name of 1 to {self.max_len} characters: letters, digits and . _ - = + , @ "
                "(no path separator, no '..', not starting with '.' or '-')")

    def why_not(self, value: Any) -> str | None:
        ok = isinstance(value, str) and 0 < len(value) <= self.max_len and ".." not in value \
            and re.fullmatch(r"[A-Za-z0-9_=+,@][A-Za-z0-9._=+,@-]*", value) is not None
        return None if ok else self.describe()


NAME = Name()


@dataclass(frozen=True)
class Items(Domain):
    item: Domain
    max_items: int

    def describe(self) -> str:
        return f"a list of at most {self.max_items} items, each {self.item.describe()}"

    def why_not(self, value: Any) -> str | None:
        if not isinstance(value, (list, tuple)) or len(value) > self.max_items:
            return self.describe()
        bad = [i for i, x in enumerate(value) if self.item.why_not(x) is not None]
        return f"{self.describe()} (item {bad[0]} is not)" if bad else None


def domain(d: Domain, *more: Mapping[str, Any]) -> dict[str, Any]:
    """Field metadata declaring `d` (merged with other metadata such as spec.NOT_IDENTITY)."""
    out: dict[str, Any] = {DOMAIN_KEY: d}
    for m in more:
        out.update(m)
    return out


def domain_of(metadata: Mapping[str, Any]) -> Domain | None:
    return metadata.get(DOMAIN_KEY)


# Shared domains.
SECONDS = Num(0, 7 * 86400, lo_open=True)  # a timeout: > 0, at most a week
DELAY_S = Num(0, 3600)  # a simulated delay: >= 0, at most an hour
FRACTION = Num(0, 1)
TOKENS = Int(1, 2 ** 24)  # a context length (16 Mi tokens: beyond any model)
PATH = Text(4096, what="a path")
IDENT = Text(64, r"[A-Za-z0-9_.+-]+", what="an identifier (letters, digits, _ . + -)")
ARGV = Items(Text(4096, empty=True, what="a command-line argument"), 512)
