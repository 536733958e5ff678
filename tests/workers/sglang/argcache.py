"""SGLang's verdict on launch argv, remembered between runs in pytest's cache (`.pytest_cache/`, git-ignored).

    check_argv(cases, *, cache, label, models, sglang_path=None) -> ({id: result} plus "_header", ran)
        cases: [(id, argv, env)]; each case goes to `python -m workers.sglang.argcheck` (SGLang's own parser and
        resolver, in a process of its own) unless the cache holds its result under the same inputs; `ran` is
        the number of cases SGLang was asked about this time.

What decides a result, and so makes up its key:
- per case: the argv and env, with the `models` directory (a per-run temp dir) written as `{MODELS}`;
- per call (the fingerprint; any change drops every cached result of that label): the config.json files under
  `models` (what SGLang reads of a model), the installed SGLang (version and location, or `sglang_path`'s), the
  transformers and torch versions SGLang resolves with, and the source of the argcheck module and of the module
  that builds the argv (found by import, wherever they live).
conf/ and our rules reach SGLang only through the argv and the config.json files, so they are covered by the
per-case key: a conf or rule change that changes an argv re-runs that case. Our own verdict (validate_run) and
the expected values are computed afresh on every run; only SGLang's answer is remembered.

A clean checkout (CI) has no cache and runs every case; `SPECSWEEP_SGLANG_CACHE=off` or `pytest --cache-clear`
does too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ARGCHECK_MODULE = "workers.sglang.argcheck"
ROOT = Path(__file__).resolve().parents[3]
PLACEHOLDER = "{MODELS}"


def _sha(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _version(dist: str, path: Path | None = None) -> str:
    if path is not None:
        found = sorted(path.glob(f"{dist}-*.dist-info"))
        return found[-1].name if found else f"{dist}: none at {path}"
    try:
        return f"{dist}=={importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist}: none"


def _source(module: str) -> bytes:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"{module} not found")
    return Path(spec.origin).read_bytes()


def fingerprint(models: Path, sglang_path: Path | None) -> str:
    """What every case of one call shares."""
    from workers.sglang.argv import build_sglang_argv  # the argv builder (its module found by import)

    sglang_dir = spec.origin if (spec := importlib.util.find_spec("sglang")) else None
    configs = [(str(p.relative_to(models)), p.read_bytes()) for p in sorted(models.rglob("config.json"))]
    return _sha(_version("sglang", sglang_path), str(sglang_path or sglang_dir), _version("transformers"),
                _version("torch"), _source(ARGCHECK_MODULE), Path(inspect.getfile(build_sglang_argv)).read_bytes(),
                json.dumps([(name, _sha(data)) for name, data in configs]))


def _cache_enabled() -> bool:
    return os.environ.get("SPECSWEEP_SGLANG_CACHE", "on").lower() not in ("off", "0", "false", "no")


def _run_argcheck(cases: list[tuple[str, list[str], dict[str, str]]], sglang_path: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", ARGCHECK_MODULE]
    if sglang_path:
        cmd += ["--sglang-path", str(sglang_path)]
    stdin = "".join(json.dumps({"id": cid, "argv": argv, "env": env}) + "\n" for cid, argv, env in cases)
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"argcheck failed:\n{proc.stderr[-3000:]}"
    header, results = lines[0], {r["id"]: r for r in lines[1:]}
    assert len(results) == len(cases), proc.stderr[-3000:]
    return {"_header": header, **results}


def check_argv(cases, *, cache, label: str, models: Path,
               sglang_path: Path | None = None) -> tuple[dict[str, Any], int]:
    """SGLang's result per case id (plus "_header"), from the cache where the inputs are unchanged."""
    root = str(models)

    def key(argv: list[str], env: dict[str, str]) -> str:
        return _sha(json.dumps([argv, env], sort_keys=True).replace(root, PLACEHOLDER))

    cases = list(cases)
    keys = {cid: key(argv, env) for cid, argv, env in cases}
    assert len(keys) == len(cases), "case ids must be unique"
    fp = fingerprint(models, sglang_path)
    entry = f"specsweep/sglang-argcheck/{label}"
    stored = cache.get(entry, None) if cache is not None and _cache_enabled() else None
    known: dict[str, Any] = stored["results"] if stored and stored.get("fingerprint") == fp else {}
    header = stored["header"] if known else None
    missing = [c for c in cases if keys[c[0]] not in known]
    if missing:
        fresh = _run_argcheck(missing, sglang_path)
        header = fresh.pop("_header")
        for cid, result in fresh.items():
            known[keys[cid]] = json.loads(json.dumps(result).replace(root, PLACEHOLDER))
    results = {cid: json.loads(json.dumps(known[keys[cid]]).replace(PLACEHOLDER, root)) for cid, _, _ in cases}
    if cache is not None:
        cache.set(entry, {"fingerprint": fp, "header": header,
                          "results": {keys[cid]: known[keys[cid]] for cid, _, _ in cases}})
    return {"_header": header, **results}, len(missing)
