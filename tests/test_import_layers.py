"""Imports run one way, and no module takes part in an import cycle.

- specsweep_common is the bottom: the standard library and itself only.
- workers/ and orchestrator/ sit above it and apart: workers/ never imports orchestrator/; the reference engine
  (workers/reference/) imports nothing else from workers/ (its adapter.py only the shared pieces below the engines).
- Inside workers/, three layers: the shared pieces (SHARED: the engine interface, the HTTP client, meta_info and
  /metrics reading, errors, derived figures), the engine folders (workers/<engine>/, which import only the shared
  pieces and their own folder, never another engine's), and the generic modules above them (runners, probes,
  prompts, process ownership), which reach an engine only through the registry (workers/registry.py).
  No module outside an engine folder names an engine kind, but the few in KIND_NAMERS.
- config reaches workers/ only through the registry of engine adapters (workers/registry.py), which carries each
  engine's plan-time rules (workers/<engine>/rules.py); results imports nothing from workers/.
- Inside orchestrator/, one package per concern, each importing only the packages below it:

      config      settings, schema, rules, Hydra jobs, the plan   imports no other orchestrator package
      results     MLflow layout, report, diagnosis                config
      execution   a plan executed on Ray                          config, results (and workers/)
      session     the sweep as the launcher runs it               config, results, execution
      schedules   cron schedules and their daemon                 config, results, execution (and workers/)
      tune        a search whose rounds are sweeps                config, results, execution, session
      load        bench_serving's load curves (after a tune)      config, results, execution, session, tune

  session and schedules sit side by side: neither imports the other. Only the command lines (orchestrator's
  `__main__`, `schedule`, `report`, the package's own `__init__`), the Hydra plugin (hydra_plugins/), tune (whose
  rounds are sessions' sweeps) and load (the same preflight before its servers) import session or schedules, and nothing imports a command line.
- Product code imports nothing from tools/ (the test helpers and benchmarks).
- The kernels' measurement tools (specsweep_kernel_bench: the benchmarks and SGLang's kernels loaded as peers) sit
  above the product: specsweep_kernels, what a server loads, never imports them, nor does the rest of the product
  but the few in KERNEL_BENCH_USERS.

Read from the source with ast: every import counts, lazy ones inside functions and `if TYPE_CHECKING:` ones
included (a cycle hidden behind a lazy import is still a cycle a reader has to hold in their head). Relative
imports are resolved, and `from package import module` is an edge to that module."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"specsweep_common": ROOT / "specsweep_common", "orchestrator": ROOT / "orchestrator",
            "workers": ROOT / "workers", "specsweep_kernels": ROOT / "kernels" / "specsweep_kernels",
            "specsweep_kernel_bench": ROOT / "kernels" / "specsweep_kernel_bench",
            "hydra_plugins": ROOT / "hydra_plugins", "tools": ROOT / "tools"}
OURS = (*PACKAGES, "conf")
# One folder per engine under workers/, each with its adapter and its plan-time rules.
ENGINE_FOLDERS = ("reference", "sglang", "stub")
# orchestrator's packages, bottom first, and the orchestrator packages each may import besides itself
LAYERS = {"config": set(), "results": {"config"}, "execution": {"config", "results"},
          "session": {"config", "results", "execution"}, "schedules": {"config", "results", "execution"},
          "tune": {"config", "results", "execution", "session"},
          "load": {"config", "results", "execution", "session", "tune"}}
PLANNING = "orchestrator.config"
# the command lines: `python -m orchestrator`, `python -m orchestrator.schedule`, `python -m orchestrator.report`
CLIS = {"orchestrator", *(f"orchestrator.{cli}" for cli in ("__main__", "schedule", "report"))}


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
    bad = {(m, i) for m, names in _imports("specsweep_common").items() for i in names
           if _top(i) != "specsweep_common" and _top(i) != "__future__" and _top(i) not in sys.stdlib_module_names}
    assert _imports("specsweep_common") and not bad


def test_workers_import_nothing_from_orchestrator():
    bad = {(m, i) for m, names in _imports("workers").items() for i in names if _top(i) == "orchestrator"}
    assert not bad


# An engine's adapter lives in the engine's folder and implements the interface of workers/adapter.py: the one
# import from workers/reference/ into the rest of workers/, and nothing in workers/reference/ imports the adapter.
REFERENCE_ADAPTER = "workers.reference.adapter"


def test_the_reference_engine_imports_nothing_else_from_workers():
    """workers/reference/ is a server on its own (`python -m workers.reference`): the runners and probes above it
    may use it, never the other way. Its adapter (REFERENCE_ADAPTER) may import the shared pieces (SHARED), and
    only it."""
    graph = _imports("workers")
    bad = {(m, i) for m, names in graph.items() if m.startswith("workers.reference")
           for i in names if _top(i) == "workers" and not i.startswith("workers.reference")
           and not (m == REFERENCE_ADAPTER and i in SHARED)}
    assert not bad
    assert not {m for m, names in graph.items() if m.startswith("workers.reference") and REFERENCE_ADAPTER in names}


# The shared pieces of workers/, below the engine folders: what an engine folder may import of the rest of workers/.
SHARED = {"workers.adapter", "workers.errors", "workers.http_client", "workers.meta_info", "workers.engine_counters",
          "workers.derived"}


def _engine_of(name: str) -> str | None:
    """The engine folder a module belongs to (`workers.sglang.argv` -> `sglang`); None outside them."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "workers" and parts[1] in ENGINE_FOLDERS else None


def test_no_module_outside_the_engine_folders_imports_one_but_the_registry():
    """Generic workers/ modules, orchestrator/, specsweep_common, the kernels and the Hydra plugin reach an engine
    only through the registry's adapters (tools/, the benchmarks of the reference engine, are not the product)."""
    bad = {(m, i) for m, names in GRAPH.items() if _engine_of(m) is None and _top(m) != "tools"
           for i in names if _engine_of(i) is not None and m != ENGINE_REGISTRY}
    assert not bad


# Engine modules that a generic module runs as a command (`python -m <module>`) rather than imports, each for a reason:
ENGINE_COMMANDS = {
    # SGLang's own load generator is the client of every engine's load curve, whichever engine serves
    ("workers.load_curve", "workers.sglang.bench_serving"),
}
ENGINE_MODULE_NAME = re.compile(r"workers\.(?:" + "|".join(ENGINE_FOLDERS) + r")(?:\.\w+)+")


def test_no_generic_module_runs_an_engine_module_by_name_but_the_listed_ones():
    """A module name in a string (an argv's `-m workers.sglang.bench_serving`) is a dependency the import graph does not see."""
    named = set()
    for m, path in MODULES.items():
        if _engine_of(m) is None and _top(m) not in ("tools", "specsweep_kernels") and m != ENGINE_REGISTRY:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and ENGINE_MODULE_NAME.fullmatch(node.value):
                    named.add((m, node.value))
    assert named == ENGINE_COMMANDS


def test_no_engine_folder_imports_another():
    bad = {(m, i) for m, names in GRAPH.items() if _engine_of(m) for i in names if _engine_of(i) not in (None, _engine_of(m))}
    assert not bad


def test_no_arrow_runs_back_up_inside_workers():
    """Engine folders import of the rest of workers/ only the shared pieces; the shared pieces import only each other
    (not an engine folder, not the registry, not the runners or probes above the engines)."""
    assert SHARED <= set(MODULES)
    bad = {(m, i) for m, names in _imports("workers").items() if _engine_of(m) or m in SHARED
           for i in names if _top(i) == "workers" and _engine_of(i) != _engine_of(m) and i not in SHARED}
    assert not bad


# The modules outside the engine folders that name an engine kind, each for a reason:
KIND_NAMERS = {
    # the one list of engines and their adapters
    "workers.registry",
    # the kinds' declaration, with the kind-level facts code reading a stored run needs without the adapters
    # (`EngineKind.simulated`, `.loads_kernel_plugin`) and which engines run on GPUs (`ServerSpec.on_gpu`)
    "specsweep_common.spec",
}
KIND_NAME = re.compile(r"EngineKind\.(?:" + "|".join(e.upper() for e in ENGINE_FOLDERS) + r")\b"
                       r"|[=!]=\s*[\"'](?:" + "|".join(ENGINE_FOLDERS) + r")[\"']")


def test_nothing_outside_the_engine_folders_names_an_engine_kind():
    """A new engine is a folder and a registry line: no generic check branches on a kind, and no orchestrator
    module compares a recorded engine name (tools/ benchmarks, which pick engines, are not the product)."""
    assert KIND_NAME.search("kind is EngineKind.STUB") and KIND_NAME.search('engine == "sglang"')
    naming = {m for m, path in MODULES.items() if _engine_of(m) is None and _top(m) != "tools"
              and m not in KIND_NAMERS and KIND_NAME.search(path.read_text())}
    assert not naming


def test_product_packages_import_nothing_from_tools():
    bad = {(m, i) for m, names in GRAPH.items() if _top(m) != "tools" for i in names if _top(i) == "tools"}
    assert _imports("tools") and not bad


def test_kernels_import_nothing_from_orchestrator_or_workers():
    bad = {(m, i) for package in ("specsweep_kernels", KERNEL_BENCH) for m, names in _imports(package).items()
           for i in names if _top(i) in ("orchestrator", "workers")}
    assert not bad


# kernels/specsweep_kernel_bench/: it times the kernels of specsweep_kernels and imports SGLang's own as peers, which
# a server running the plugin never needs. The product modules that import it anyway, each for a reason:
KERNEL_BENCH = "specsweep_kernel_bench"
KERNEL_BENCH_USERS = {
    # the kernel sweep's job (`job: kernel`, each shape run in a process of its own: `python -m workers.kernel_job
    # --one`) is a benchmark itself: on CUDA it times each shape with the bench's CUDA-graph timing (bench.graph_us)
    "workers.kernel_job",
}


def test_the_product_imports_nothing_from_the_kernel_benchmarks():
    """specsweep_kernels (the kernels and the SGLang plugin a server loads) never imports specsweep_kernel_bench,
    and the rest of the product only in KERNEL_BENCH_USERS; tools/ (benchmarks and test helpers) may."""
    bad = {(m, i) for m, names in GRAPH.items()
           if _top(m) not in (KERNEL_BENCH, "tools") and m not in KERNEL_BENCH_USERS
           for i in names if _top(i) == KERNEL_BENCH}
    assert _imports(KERNEL_BENCH) and not bad
    # each exception still imports it: a stale entry would let a new importer of that name through unseen
    assert all(any(_top(i) == KERNEL_BENCH for i in GRAPH[m]) for m in KERNEL_BENCH_USERS)


def _layer(name: str) -> str | None:
    """The orchestrator package a module belongs to (`orchestrator.results.tracking` -> `results`); None for a
    command line."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_orchestrator_module_is_a_command_line_or_in_a_package():
    stray = {m for m in _imports("orchestrator") if _layer(m) is None and m not in CLIS}
    assert not stray


def test_orchestrator_packages_import_only_the_packages_below_them():
    graph = _imports("orchestrator")
    assert {_layer(m) for m in graph} >= set(LAYERS)
    bad = {(m, i) for m, names in graph.items() if _layer(m) is not None for i in names
           if _top(i) == "orchestrator" and _layer(i) != _layer(m) and _layer(i) not in LAYERS[_layer(m)]}
    assert not bad


# What the engine itself states is the authority at validation (its own rules, its argv parser, how it resolves a
# model path): config reaches an engine only through the registry of engine adapters (workers/registry.py), whose
# `EngineAdapter` carries each engine's plan-time rules and estimates (workers/<engine>/rules.py). Nothing else of
# workers/ is imported by config, and results imports nothing of workers/ at all.
ENGINE_REGISTRY = "workers.registry"


def test_config_imports_only_itself_and_specsweep_common():
    graph = _imports("orchestrator")
    config = {m for m in graph if m == PLANNING or m.startswith(PLANNING + ".")}
    assert {"orchestrator.config.settings", "orchestrator.config.schema", "orchestrator.config.validate",
            "orchestrator.config.plan"} <= config
    bad = {(m, i) for m in config for i in graph[m]
           if _top(i) in OURS and _top(i) != "specsweep_common" and not i.startswith(PLANNING)
           and not (_layer(m) == "config" and i == ENGINE_REGISTRY)}
    assert not bad


def test_config_reaches_workers_only_through_the_engine_registry_and_results_not_at_all():
    graph = _imports("orchestrator")
    bad = {(m, i) for m, names in graph.items() if _layer(m) in ("config", "results")
           for i in names if _top(i) == "workers" and not (_layer(m) == "config" and i == ENGINE_REGISTRY)}
    assert not bad
    # the rules moved to the engines: config does reach them, through the registry, and names no engine kind
    assert any(ENGINE_REGISTRY in names for m, names in graph.items() if _layer(m) == "config")


def test_the_engine_registry_imports_only_the_interface_and_the_engines_adapters():
    """The registry is the seam: it imports the interface and one adapter per engine folder, no process owner,
    probe or HTTP client (the config layer imports it to validate a grid)."""
    engines = {i for i in GRAPH[ENGINE_REGISTRY] if _top(i) == "workers"}
    assert engines == {"workers.adapter", *(f"workers.{e}.adapter" for e in ENGINE_FOLDERS)}



def test_every_engine_folder_has_an_adapter_and_its_rules():
    assert {f"workers.{e}.{m}" for e in ENGINE_FOLDERS for m in ("adapter", "rules")} <= set(MODULES)


ENGINE_KIND_NAMES = ("EngineKind.SGLANG", "EngineKind.REFERENCE", "EngineKind.STUB")


def test_the_config_rules_name_no_engine():
    """The generic checks branch on no engine kind: an engine's rules are its own (workers/<engine>/rules.py)."""
    for name in ("validate", "context", "engine_args", "model_facts", "plan"):
        text = MODULES[f"orchestrator.config.{name}"].read_text()
        assert not [k for k in ENGINE_KIND_NAMES if k in text], name


def test_only_the_command_lines_import_the_session_and_the_schedules():
    bad = {(m, i) for m, names in GRAPH.items() for i in names
           if _top(i) == "orchestrator" and _layer(i) in ("session", "schedules")
           and _layer(m) != _layer(i) and m not in CLIS and _top(m) != "hydra_plugins"
           and not (_layer(m) in ("tune", "load") and _layer(i) == "session")}
    assert not bad


def test_settings_is_the_bottom_of_orchestrator_and_the_clis_its_top():
    graph = _imports("orchestrator")
    # specsweep_common (the declared domains) is below every layer
    assert not {i for i in graph["orchestrator.config.settings"] if _top(i) in OURS and _top(i) != "specsweep_common"}
    bad = {(m, i) for m, names in GRAPH.items() for i in names if i in CLIS and m not in CLIS}
    assert not bad


# No product module outside kernels/ is longer than this: past it, a module holds several jobs.
MAX_MODULE_LINES = 450
# Known exceptions, each with its owner; remove the entry when the module is split.
LONG_MODULES: set[str] = set()


def test_no_product_module_outside_kernels_is_longer_than_the_limit():
    """Every module of the product packages (specsweep_common, orchestrator, workers, the Hydra plugin) outside kernels/
    has at most MAX_MODULE_LINES lines; tests/ and tools/ are not product code."""
    long = {}
    for name in ("specsweep_common", "orchestrator", "workers", "hydra_plugins"):
        for path in sorted(PACKAGES[name].rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            n = len(path.read_text().splitlines())
            if n > MAX_MODULE_LINES and rel not in LONG_MODULES:
                long[rel] = n
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
