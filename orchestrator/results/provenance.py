"""Where a sweep came from, as its parent run records it: the code's git commit, the schedule that fired it, and
Hydra's `multirun.yaml` (redacted).

    git_sha(cwd) -> str                      the specsweep checkout's commit, else the working directory's
    schedule_tags(environ) -> dict           `schedule`, `scheduled_time` of a sweep fired by the schedules daemon
    hydra_multirun_yaml() -> str | None      the `multirun.yaml` Hydra wrote for this sweep
    redact_multirun_yaml(text, secrets)      its mappings redacted structurally, its override lists by value
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

from specsweep_common.redact import redact_config, redact_override, redact_text

# Set by the schedules daemon (orchestrator/schedules/scheduler.py) on the Ray job of each firing; tagged on the
# parent run.
ENV_SCHEDULE = "SPECSWEEP_SCHEDULE"
ENV_SCHEDULED_TIME = "SPECSWEEP_SCHEDULED_TIME"


def git_sha(cwd: str | os.PathLike = ".") -> str:
    """The commit of the specsweep code that ran (its checkout), else of the working directory."""
    for where in (Path(__file__).resolve().parent, Path(cwd)):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return out.stdout.strip()
    return "unknown"


def schedule_tags(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A sweep fired by the schedules daemon (`specsweep-schedule`) carries its schedule name and scheduled time."""
    if ENV_SCHEDULE not in environ:
        return {}
    return {"schedule": environ[ENV_SCHEDULE], "scheduled_time": environ.get(ENV_SCHEDULED_TIME, "")}


def hydra_multirun_yaml() -> str | None:
    """The `multirun.yaml` Hydra wrote in this sweep's directory, when running under a Hydra multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        path = Path(HydraConfig.get().sweep.dir) / "multirun.yaml"
        return path.read_text() if path.is_file() else None
    except Exception:  # not under Hydra, or no sweep dir: the parent simply has no multirun.yaml
        return None


def redact_multirun_yaml(text: str, secrets: Iterable[str]) -> str:
    """Hydra's multirun.yaml: its mappings structurally (engine.env, extra_args), its override lists by value,
    then every literal secret."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return redact_text(text, secrets)
    if isinstance(doc, dict):
        task = doc.get("hydra", {}).get("overrides", {}) if isinstance(doc.get("hydra"), dict) else {}
        if isinstance(task, dict):
            for k, v in task.items():
                if isinstance(v, list):
                    task[k] = [redact_override(o) if isinstance(o, str) else o for o in v]
        doc = redact_config(doc)
        text = yaml.safe_dump(doc, sort_keys=False)
    return redact_text(text, secrets)
