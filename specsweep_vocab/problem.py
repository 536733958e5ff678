"""`Problem(key, value, allowed)`: one refused config value, the one type every check before any work reports with.

The config layer's checks (`orchestrator/config/`: the declared domains, the keys, the generic rules) and each
engine's own plan-time rules (`workers/<engine>/rules.py`, reached through `workers.adapter.EngineAdapter`) return
it, so a refusal always names the key, the value and what is allowed, whichever layer found it. It lives in the
vocabulary because workers/ never imports orchestrator/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specsweep_vocab.redact import MASK, is_secret_path, redact_text


@dataclass(frozen=True)
class Problem:
    key: str  # dotted config key, e.g. "page_size", "attention.backend"
    value: Any
    allowed: str  # what would be accepted, in words
    overrides: tuple[str, ...] = ()  # the job's Hydra overrides (which grid point)

    def __str__(self) -> str:
        value = MASK if is_secret_path(self.key) else redact_text(repr(self.value))
        return f"{self.key}={value}: allowed {self.allowed}"
