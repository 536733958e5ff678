"""Imports run one way (#16, #33): specsweep_vocab at the bottom, workers/ and orchestrator/ above it and apart, and
inside orchestrator/ the planning modules below execution, the CLIs at the top; the reference engine
(workers/reference/) below the rest of workers/; and no module takes part in an import cycle.

Read from the source with ast: every import counts, lazy ones inside functions and `if TYPE_CHECKING:` ones
included (a cycle hidden behind a lazy import is still a cycle a reader has to hold in their head). Relative
imports are resolved, and `from package import module` is an edge to that module."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"specsweep_vocab": ROOT / "specsweep_vocab", "orchestrator": ROOT / "orchestrator",
            "workers": ROOT / "workers", "specsweep_kernels": ROOT / "kernels" / "specsweep_kernels",
            "hydra_plugins": ROOT / "hydra_plugins", "benchmarks": ROOT / "benchmarks"}
OURS = (*PACKAGES, "conf")
PLANNING = {"orchestrator.config.settings", "orchestrator.config.run_config", "orchestrator.config.schema", "orchestrator.config.validate",
            "orchestrator.config.plan", "orchestrator.results.diagnosis"}
CLIS = {"orchestrator.__main__", "orchestrator.schedule"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base in PACKAGES.values():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base.parent).with_suffix("")
            out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


MODULES = _modules()


def _imports_of(name: str, path: Path) -> set[str]:
    """Every absolute module name `name` imports; `from a import b` gives `a.b` when that is a module, else `a`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    names.discard(name)
    return names


GRAPH = {name: _imports_of(name, path) for name, path in MODULES.items()}


def _imports(package: str) -> dict[str, set[str]]:
    return {m: names for m, names in GRAPH.items() if _top(m) == package}


def _top(name: str) -> str:
    return name.split(".")[0]


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted: the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return cycles


def test_the_cycle_finder_finds_cycles_through_lazy_and_relative_imports():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}, "b": set()}
    assert import_cycles(graph) == [["a.x", "a.y", "a.z"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert len(MODULES) > 50
    assert import_cycles(GRAPH) == []


def test_vocab_imports_only_the_standard_library_and_itself():
    bad = {(m, i) for m, names in _imports("specsweep_vocab").items() for i in names
           if _top(i) != "specsweep_vocab" and _top(i) != "__future__" and _top(i) not in sys.stdlib_module_names}
    assert _imports("specsweep_vocab") and not bad


def test_workers_import_nothing_from_orchestrator():
    bad = {(m, i) for m, names in _imports("workers").items() for i in names if _top(i) == "orchestrator"}
    assert not bad


def test_the_reference_engine_imports_nothing_else_from_workers():
    """workers/reference/ is a server on its own (`python -m workers.reference`): the runners and probes above it
    may use it, never the other way."""
    bad = {(m, i) for m, names in _imports("workers").items() if m.startswith("workers.reference")
           for i in names if _top(i) == "workers" and not i.startswith("workers.reference")}
    assert not bad


def test_product_packages_import_nothing_from_the_benchmarks():
    bad = {(m, i) for m, names in GRAPH.items() if _top(m) != "benchmarks" for i in names if _top(i) == "benchmarks"}
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
    assert not {i for i in graph["orchestrator.config.settings"] if _top(i) in OURS}
    bad = {(m, i) for m, names in graph.items() for i in names if i in CLIS and m not in CLIS}
    assert not bad
