"""`Problem(key, value, allowed)`: one refused config value, the one type every check before any work reports with.

The config layer's checks (`orchestrator/config/`: the declared domains, the keys, the generic rules) and each
engine's own plan-time rules (`workers/<engine>/rules.py`, reached through `workers.adapter.EngineAdapter`) return
it, so a refusal always names the key, the value and what is allowed, whichever layer found it. It lives in
specsweep_common because workers/ never imports orchestrator/.

`read_file(key, value, path)`: every file a check reads before work is read through it, so that a file that
cannot be read (any OSError: EIO from /proc/self/mem, EACCES, EISDIR, a vanished file) is a `ProblemError` naming
the key and the path, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specsweep_common.redact import MASK, is_secret_path, redact_text


@dataclass(frozen=True)
class Problem:
    key: str  # dotted config key, e.g. "page_size", "attention.backend"
    value: Any
    allowed: str  # what would be accepted, in words
    overrides: tuple[str, ...] = ()  # the job's Hydra overrides (which grid point)

    def __str__(self) -> str:
        value = MASK if is_secret_path(self.key) else redact_text(repr(self.value))
        return f"{self.key}={value}: allowed {self.allowed}"


class ProblemError(ValueError):
    """A refusal raised where a check cannot return its problem (deep in a reader): carries the Problem."""

    def __init__(self, problem: Problem):
        self.problem = problem
        super().__init__(str(problem))


def read_file(key: str, value: Any, path: str, *, limit: int | None = None, overrides: tuple[str, ...] = (),
              what: str = "a readable file") -> bytes:
    """The bytes of `path` (at most `limit`), read for config key `key` (set to `value`); any OSError is a
    ProblemError naming the key, the value, the path and the system's reason."""
    try:
        with open(path, "rb") as f:
            return f.read() if limit is None else f.read(limit)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ProblemError(Problem(key, value, f"{what} ({path}: {reason}, errno {e.errno})", overrides)) from None
