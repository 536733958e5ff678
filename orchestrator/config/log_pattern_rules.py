"""`metrics.log_patterns`: regexes whose named groups become per-step series."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from specsweep_common.problem import Problem
from specsweep_common.spec import JobKind

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig


LOG_PATTERN_ALLOWED = ("a Python regular expression with at least one named group, "
                       "e.g. 'commit=(?P<commit_len>\\d+)'")


def log_pattern_problems(rc: RunConfig) -> list[Problem]:
    """`metrics.log_patterns`: each must compile and name at least one group (a group is a series name);
    kernel jobs have no engine log to read."""
    out: list[Problem] = []
    for i, pattern in enumerate(rc.log_patterns):
        key = f"metrics.log_patterns[{i}]"
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            out.append(Problem(key, pattern, f"{LOG_PATTERN_ALLOWED} (it does not compile: {e})", rc.overrides))
            continue
        if not compiled.groupindex:
            out.append(Problem(key, pattern, f"{LOG_PATTERN_ALLOWED} (it has no named group (?P<name>...): "
                               "group names become the metric names)", rc.overrides))
    if rc.log_patterns and rc.job is JobKind.KERNEL:
        out.append(Problem("metrics.log_patterns", list(rc.log_patterns),
                           "[] with job=kernel (a kernel run has no engine log)", rc.overrides))
    return out
