"""`Problem(key, value, allowed)`: one refused config value (`specsweep_common.problem`); `ConfigError`: every problem
of a sweep, by grid point.

Every check before any work (the declared domains, the keys, the rules, the resources) reports with these, so each
refusal names the key, the value (secrets masked) and what is allowed.
"""

from __future__ import annotations

from typing import Iterable

from specsweep_common.problem import Problem
from specsweep_common.redact import redact_override


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
