"""Imports run one way (#16): specsweep_vocab at the bottom, workers/ and orchestrator/ above it and apart, and
inside orchestrator/ the planning modules below execution, the CLIs at the top. Read from the source with ast,
lazy imports inside functions included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("specsweep_vocab", "orchestrator", "workers", "specsweep_kernels", "hydra_plugins", "conf")
PLANNING = {"orchestrator.settings", "orchestrator.schema", "orchestrator.validate", "orchestrator.plan",
            "orchestrator.diagnosis"}
CLIS = {"orchestrator.__main__", "orchestrator.schedule"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "kernels" if path.is_relative_to(ROOT / "kernels") else ROOT)
    return ".".join(rel.with_suffix("").parts)


def _imports(package: str) -> dict[str, set[str]]:
    """module -> every absolute module it imports (`from a import b` gives `a`)."""
    base = ROOT / "kernels" / package if package == "specsweep_kernels" else ROOT / package
    out: dict[str, set[str]] = {}
    for path in sorted(base.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        out[_module_name(path)] = names
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


def test_vocab_imports_only_the_standard_library_and_itself():
    bad = {(m, i) for m, names in _imports("specsweep_vocab").items() for i in names
           if _top(i) != "specsweep_vocab" and _top(i) != "__future__" and _top(i) not in sys.stdlib_module_names}
    assert _imports("specsweep_vocab") and not bad


def test_workers_import_nothing_from_orchestrator():
    bad = {(m, i) for m, names in _imports("workers").items() for i in names if _top(i) == "orchestrator"}
    assert not bad


def test_kernels_import_nothing_from_orchestrator_or_workers():
    bad = {(m, i) for m, names in _imports("specsweep_kernels").items() for i in names
           if _top(i) in ("orchestrator", "workers")}
    assert not bad


def test_planning_imports_only_planning_and_the_vocabulary():
    graph = _imports("orchestrator")
    assert PLANNING <= graph.keys()
    bad = {(m, i) for m in PLANNING for i in graph[m]
           if _top(i) in OURS and _top(i) != "specsweep_vocab" and i not in PLANNING}
    assert not bad


def test_settings_is_the_bottom_of_orchestrator_and_the_clis_its_top():
    graph = _imports("orchestrator")
    assert not {i for i in graph["orchestrator.settings"] if _top(i) in OURS}
    bad = {(m, i) for m, names in graph.items() for i in names if i in CLIS and m not in CLIS}
    assert not bad
