"""Command-line overrides checked against the schema before Hydra composes: unknown keys with the closest valid
ones, overrides that contradict each other, `schedule` (no config group), and what conf/ offers.

    override_key_problems(overrides) -> [Problem]
    config_groups() -> ("attention", "cluster", ...)     Hydra's config groups under conf/
    selected_groups() -> {"engine": "reference", ...}    what conf/config.yaml's defaults list selects
"""

from __future__ import annotations

import functools
from typing import Sequence

from orchestrator.config.keys import conflicting_override_problems, unknown_key_problem
from orchestrator.config.schema import schema_tree
from specsweep_common.problem import Problem


def config_groups() -> tuple[str, ...]:
    """Hydra config groups under conf/ (engine, model, ..., sweep): `group=option` selects a file."""
    import importlib.resources

    root = importlib.resources.files("conf")
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")))


def override_key_problems(overrides: Sequence[str]) -> list[Problem]:
    """Command-line overrides whose key the schema does not have, each with the closest valid keys, before
    Hydra composes (its own message suggests `+key=...`, which then fails or is silently ignored), and overrides
    that contradict each other (`keys.conflicting_override_problems`: one key given two values, `+group` for a
    group conf/config.yaml already selects).
    Left to Hydra: hydra.* keys, config-group selections, deletions, keys under a dict (engine.env.X) and
    anything its parser rejects."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return []
    tree, groups, out = schema_tree(), config_groups(), []
    for o in parsed:
        key = o.key_or_group
        if o.is_delete() or o.package is not None or key.split(".")[0].split("/")[0] == "hydra" or "/" in key:
            continue  # Hydra's own keys, nested group selections (hydra/job_logging=disabled)
        if "." not in key and key in groups:
            continue
        value = o.input_line.split("=", 1)[1] if o.input_line and "=" in o.input_line else None
        if key == "schedule":  # not a config group: schedules are not run configs (orchestrator/schedules/)
            run_groups = ", ".join(g for g in groups if g != "hydra")
            out.append(Problem(key, value, f"a config group ({run_groups}); schedule is none: a schedule is run by "
                               "`specsweep-schedule fire|run` (files in orchestrator/schedules/)", tuple(overrides)))
            continue
        if (p := unknown_key_problem(key, value, tree, tuple(overrides))) is not None:
            out.append(p)
    return out + conflicting_override_problems(parsed, groups, selected_groups(), tuple(overrides))


@functools.cache
def selected_groups() -> dict[str, str]:
    """group -> option, as conf/config.yaml's defaults list selects them (`engine: reference`, ...)."""
    import importlib.resources

    import yaml

    defaults = yaml.safe_load((importlib.resources.files("conf") / "config.yaml").read_text())["defaults"]
    return {k: str(v) for d in defaults if isinstance(d, dict) for k, v in d.items() if not k.startswith("override")}
