"""After a sweep's report: when it found a regression, say so in one marker line (what `specsweep-schedule fire
--fail-on-regression` looks for in the job's log) and run the schedule's `on_regression` command.

The schedule hands its command to the sweep's Ray Job as JSON in `SPECSWEEP_ON_REGRESSION` (an argv list, never a
shell string); it runs as `argv + [path of the report's diagnosis.md]`, without a shell, once per sweep.

    alert_on_regression(client, parent_run_id) -> bool    True when the parent's `regression` tag names one
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Sequence
from orchestrator.results.store_layout import REGRESSION_TAG

log = logging.getLogger(__name__)

ENV_ON_REGRESSION = "SPECSWEEP_ON_REGRESSION"
REGRESSION_MARK = "specsweep-regression:"  # the marker line's prefix in the sweep's log
ON_REGRESSION_TIMEOUT_S = 600.0


def argv_problem(value: object) -> str | None:
    """Why `value` is not an `on_regression` argv (None when it is one)."""
    if isinstance(value, str):
        return "an argv list such as ['notify-send', 'regression'], never a shell string"
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) and a for a in value):
        return "a non-empty list of non-empty strings (the command's argv; the report's path is appended)"
    return None


def argv_from_env(environ: dict[str, str] | None = None) -> list[str] | None:
    raw = (environ if environ is not None else os.environ).get(ENV_ON_REGRESSION)
    if not raw:
        return None
    try:
        argv = json.loads(raw)
    except ValueError:
        argv = raw
    if (why := argv_problem(argv)) is not None:
        log.error("%s=%r is invalid; allowed: %s", ENV_ON_REGRESSION, raw, why)
        return None
    return list(argv)


def run_command(argv: Sequence[str], report_path: str) -> int:
    """`argv + [report_path]`, no shell; its exit status (a failure is logged, never raised)."""
    cmd = [*argv, report_path]
    try:
        done = subprocess.run(cmd, shell=False, check=False, timeout=ON_REGRESSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.error("on_regression %s failed: %s", cmd, e)
        return -1
    (log.info if done.returncode == 0 else log.error)("on_regression %s exited %d", cmd, done.returncode)
    return done.returncode


def report_path(client, parent_run_id: str) -> str:
    """A local copy of the parent's diagnosis.md (the report, "Changes since" at its top); kept for the command."""
    dst = tempfile.mkdtemp(prefix=f"specsweep-regression-{parent_run_id[:8]}-")
    return client.download_artifacts(parent_run_id, "diagnosis.md", dst)


def alert_on_regression(client, parent_run_id: str, environ: dict[str, str] | None = None) -> bool:
    tag = client.get_run(parent_run_id).data.tags.get(REGRESSION_TAG, "none")
    if tag == "none":
        return False
    log.warning("%s parent=%s %s", REGRESSION_MARK, parent_run_id, tag)
    argv = argv_from_env(environ)
    if argv:
        run_command(argv, report_path(client, parent_run_id))
    return True
