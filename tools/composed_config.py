"""conf/ composed by Hydra (and converted by our schema), for tests and benchmarks.

    compose_config(*overrides) -> DictConfig; compose_run(*overrides, cwd=ROOT) -> RunConfig
        compose_config once per distinct overrides in a process (a copy); compose_run's resolved config also kept
        on disk (.pytest_cache/) until conf/, the config schema or Hydra change

Imported by tests/ and the benchmarks only, never by product code.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> Any:
    from hydra import compose, initialize_config_module

    from orchestrator.config.schema import register_configs

    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


def compose_config(*overrides: str) -> Any:
    """conf/config.yaml with these overrides (Hydra's compose), composed once per distinct overrides; a copy."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.lru_cache(maxsize=1)
def _compose_cache_dir() -> Path | None:
    """.pytest_cache/specsweep-compose/<fingerprint>/: composed configs of this conf/ tree, config schema and Hydra;
    None when SPECSWEEP_COMPOSE_CACHE=off. Older fingerprints' folders are removed."""
    import importlib.metadata
    import inspect
    import shutil

    from orchestrator.config.schema import register_configs

    if os.environ.get("SPECSWEEP_COMPOSE_CACHE", "on").lower() in ("off", "0", "false", "no"):
        return None
    h = hashlib.sha256()
    sources = [*sorted((ROOT / "conf").rglob("*.yaml")), *sorted(Path(inspect.getfile(register_configs)).parent.glob("*.py")),
               *sorted((ROOT / "specsweep_common").glob("*.py"))]
    for path in sources:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("hydra-core", "omegaconf"):
        h.update(importlib.metadata.version(dist).encode())
    base = ROOT / ".pytest_cache" / "specsweep-compose"
    folder = base / h.hexdigest()[:16]
    if base.is_dir():
        for old in base.iterdir():
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _resolved(overrides: tuple[str, ...]) -> dict[str, Any]:
    """The composed config, resolved, without `hydra` (all `to_run_config` reads), from the on-disk cache when
    conf/, the config schema and Hydra are unchanged (`_compose_cache_dir`); composed by Hydra otherwise."""
    from omegaconf import OmegaConf

    folder = _compose_cache_dir()
    path = folder / (hashlib.sha256(json.dumps(overrides).encode()).hexdigest() + ".json") if folder else None
    if path is not None and path.exists():
        return json.loads(path.read_text())
    container: dict[str, Any] = OmegaConf.to_container(_composed(overrides), resolve=True)  # type: ignore[assignment]
    container.pop("hydra", None)
    if path is not None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(container))
        os.replace(tmp, path)
    return container


@functools.lru_cache(maxsize=None)
def compose_run(*overrides: str, cwd: str = str(ROOT)) -> Any:
    """`to_run_config` of conf/ composed with these overrides: the frozen RunConfig, built once per overrides and
    cwd in a process, and composed by Hydra once per overrides until conf/, the config schema (orchestrator/config/)
    or Hydra change: the resolved config is kept in .pytest_cache/specsweep-compose/ (git-ignored; a clean
    checkout composes everything; SPECSWEEP_COMPOSE_CACHE=off turns it off). A ConfigError is raised every time."""
    from omegaconf import OmegaConf

    from orchestrator.config.schema import to_run_config

    return to_run_config(OmegaConf.create(_resolved(tuple(overrides))), tuple(overrides), cwd=cwd)
