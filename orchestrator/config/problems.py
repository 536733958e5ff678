"""`Problem(key, value, allowed)`: one refused config value; `ConfigError`: every problem of a sweep, by grid point.

Every check before any work (the declared domains, the keys, the rules, the resources) reports with these, so each
refusal names the key, the value (secrets masked) and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from specsweep_vocab.redact import MASK, is_secret_path, redact_override, redact_text


@dataclass(frozen=True)
class Problem:
    key: str  # dotted config key, e.g. "page_size", "attention.backend"
    value: Any
    allowed: str  # what would be accepted, in words
    overrides: tuple[str, ...] = ()  # the job's Hydra overrides (which grid point)

    def __str__(self) -> str:
        value = MASK if is_secret_path(self.key) else redact_text(repr(self.value))
        return f"{self.key}={value}: allowed {self.allowed}"


class ConfigError(ValueError):
    """Every problem of a config or a sweep, grouped by grid point."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = tuple(problems)
        super().__init__(self._message())

    def _message(self) -> str:
        points: dict[tuple[str, ...], list[Problem]] = {}
        for p in self.problems:
            points.setdefault(p.overrides, []).append(p)
        lines = [f"invalid config: {len(self.problems)} problem(s) in {len(points)} grid point(s)"]
        for overrides, problems in points.items():
            where = " ".join(redact_override(o) for o in overrides) if overrides else "(no overrides)"
            lines.append(f"  [{where}]")
            lines.extend(f"    {p}" for p in problems)
        return "\n".join(lines)
