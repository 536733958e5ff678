"""Every `file.py:line` the project cites (docs, README, code, configs, tests) points into a file that exists, with
the line inside it.

The project's claims about SGLang rest on citations of the pinned SGLang 0.5.23 source (and, where a text says so,
of the 0.5.10 and 0.5.18 copies `make setup` unpacks: the older wheel's names, the CPU release); a few cite Ray, MLflow, Hydra, Triton or this
repository. Each citation is resolved by path suffix (`sglang/srt/managers/x.py`, `managers/x.py` and `x.py` all
match `.../sglang/srt/managers/x.py`) against those trees; it holds when some match has at least as many lines as
the largest line number cited (`x.py:12`, `x.py:12-30`, `x.py:490,522-526`). This catches a citation of a file
SGLang moved or renamed, a typo in a path, and a line past the end. Whether the cited line says what the text
claims is the per-topic tests' business (`tests/workers/test_metric_conformance.py::test_cited_sglang_lines_hold`
and its siblings pin those lines by their text)."""

from __future__ import annotations

import collections
import os
import re
import sys
from pathlib import Path

import pytest

from tests.workers.sglang.source import package_dir, sglang_root

ROOT = Path(__file__).resolve().parents[1]
CITING = ("README.md", "docs", "orchestrator", "workers", "kernels", "specsweep_common", "tools", "tests", "conf")
SUFFIXES = {".md", ".py", ".yaml", ".toml", ".txt"}
CITATION = re.compile(r"(?<![\w/.\-])((?:[\w.\-]+/)*[\w\-]+\.py):(\d+(?:[-–]\d+)?(?:,\d+(?:[-–]\d+)?)*)")


def _trees() -> list[Path]:
    trees = [p for p in map(package_dir, ("sglang", "ray", "mlflow", "hydra", "omegaconf", "triton")) if p]
    others = [Path(sys.prefix) / f"sglang-{v}" / "sglang" for v in ("0.5.10", "0.5.18")]
    return trees + [old for old in others if old.is_dir()] + [ROOT]


def _index(trees: list[Path]) -> dict[str, list[Path]]:
    """basename -> every .py file of that name in the trees (this repository's own files outside its venv)."""
    by_name: dict[str, list[Path]] = collections.defaultdict(list)
    for tree in trees:
        for folder, dirs, names in os.walk(tree):
            if tree == ROOT:
                dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "mlruns", "outputs")]
            for name in names:
                if name.endswith(".py"):
                    by_name[name].append(Path(folder) / name)
    return by_name


def _citing_files() -> list[Path]:
    out: list[Path] = []
    for entry in CITING:
        path = ROOT / entry
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += [p for p in sorted(path.rglob("*")) if p.suffix in SUFFIXES and p.is_file()
                    and "__pycache__" not in p.parts]
    return out


def _citations() -> list[tuple[str, str, int]]:
    """(where, cited path, largest cited line) for every citation in the project's files."""
    found = []
    for path in _citing_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in CITATION.finditer(line):
                last = max(int(n) for n in re.split(r"[-–,]", match.group(2)))
                found.append((f"{path.relative_to(ROOT)}:{number}", match.group(1), last))
    return found


@pytest.mark.skipif(sglang_root() is None, reason="needs the pinned SGLang source (make setup installs it)")
def test_every_cited_file_and_line_exists():
    index = _index(_trees())
    lengths: dict[Path, int] = {}
    citations = _citations()
    assert len(citations) >= 250  # 278 on 2026-12-03: the pattern still finds the project's citations
    broken = []
    for where, cited, last in citations:
        matches = [p for p in index.get(cited.rsplit("/", 1)[-1], []) if p.as_posix().endswith("/" + cited)]
        if not matches:
            broken.append(f"{where}: {cited} is no file in SGLang 0.5.23 / 0.5.10, Ray, MLflow, Hydra, Triton or here")
            continue
        for p in matches:
            if p not in lengths:
                lengths[p] = p.read_bytes().count(b"\n") + 1
        if all(lengths[p] < last for p in matches):
            broken.append(f"{where}: {cited}:{last} is past the end ({max(lengths[p] for p in matches)} lines)")
    assert not broken, "\n".join(broken)


def test_the_pattern_reads_every_citation_form():
    line = ("see sglang/srt/a/b.py:12, managers/c.py:3-9 and d.py:490,522-526; not e.pyc:3 nor x/f.py:: nor "
            "https://host/g.py:80")
    got = [(m.group(1), m.group(2)) for m in CITATION.finditer(line)]
    assert got == [("sglang/srt/a/b.py", "12"), ("managers/c.py", "3-9"), ("d.py", "490,522-526")]
