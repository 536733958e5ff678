"""Every name of ours that prose mentions resolves: the repository paths (`orchestrator/config/schema.py`,
`tests/workers/test_http_client.py`, `file.py:line` by its file part) and dotted module names
(`workers.sglang.argv`, `orchestrator.results.store_layout.PARENT_TAG`: the module, then its top-level name, then a
class member) in README.md, docs/*.md (not docs/measurements/, a dated journal) and every docstring of the product,
tools/ and tests/; and each backticked test name (`test_...`, or a prefix ending in `...`) is a test function or a
test module.

A path is ours when its first folder is one of ours, from the repository root or from a folder holding the text
(`report/tables.py` in orchestrator/results/); other projects' paths (SGLang's `managers/scheduler.py`,
`sglang/srt/...`, MLflow's `mlflow/utils/...`) have a first folder we do not have and are not checked."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"orchestrator": ROOT / "orchestrator", "workers": ROOT / "workers",
            "specsweep_common": ROOT / "specsweep_common", "specsweep_kernels": ROOT / "kernels" / "specsweep_kernels",
            "specsweep_kernel_bench": ROOT / "kernels" / "specsweep_kernel_bench",
            "hydra_plugins": ROOT / "hydra_plugins", "tools": ROOT / "tools", "tests": ROOT / "tests"}
CODE = ("orchestrator", "workers", "specsweep_common", "hydra_plugins", "tools", "kernels", "tests")
EXT = r"(?:py|md|yaml|yml|json|txt|toml|sh|cfg|ini|csv)"
PATH = re.compile(r"(?<![\w./<>*{}$-])((?:\.?[\w-]+/)+(?:[\w.-]*\.%s|))(?![\w/*<>{}])" % EXT)
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.\w+)+)" % "|".join(PACKAGES))
TEST_NAME = re.compile(r"`(?:[\w/.]+::)?(test_\w+)(\.\.\.|\*)?")
# Paths named on purpose although they do not exist: (where, path) -> why.
ABSENT_ON_PURPOSE = {
    ("docs/schedule.md", "conf/schedule/"): "why schedules are not a Hydra config group",
    ("specsweep_common/builtin_models.py", "conf/model/tiny.yaml"): "the built-in models have no YAML",
    ("tests/test_packaging.py", "kernels/__init__.py"): "the file a broken wheel shipped",
    ("orchestrator/results/report/sections.py", "report/summary.md"): "an artifact path in MLflow, not a file here",
    ("orchestrator/load/run.py", "load/table.md"): "an artifact path in MLflow, not a file here",
    ("orchestrator/load/run.py", "load/report.md"): "an artifact path in MLflow, not a file here",
}

# Folders that a run makes (git-ignored): what they hold depends on what has run on this checkout, not on the code.
MADE_AT_RUN_TIME = {".pytest_cache", ".venv", ".venv-sglang", "mlruns", "multirun", "outputs", "test-artifacts",
                    "bench-results"}


def texts() -> Iterator[tuple[Path, str, Path | None]]:
    """(file, text, the folder its paths may be relative to): the docs, then every docstring of the code."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield doc, doc.read_text(), None
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            docs = [ast.get_docstring(n, clean=False) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            yield path, "\n".join(d for d in docs if d), path.parent


def _module_file(parts: list[str]) -> Path | None:
    base = PACKAGES.get(parts[0])
    if base is None:
        return None
    p = base.joinpath(*parts[1:])
    for candidate in (p.with_suffix(".py"), p / "__init__.py"):
        if candidate.is_file():
            return candidate
    return p if p.is_dir() else None


def _top_level(path: Path) -> dict[str, ast.AST | None]:
    """The names a module defines or imports at its top level (an `if`/`try` block's too); a package's modules."""
    if path.is_dir():
        return {c.stem: None for c in path.iterdir()}
    names: dict[str, ast.AST | None] = {}
    for stmt in ast.parse(path.read_text()).body:
        nodes = ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[n.name] = n
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    names.update((x.id, n) for x in ast.walk(t) if isinstance(x, ast.Name))
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update(((a.asname or a.name).split(".")[0], n) for a in n.names)
    if path.name == "__init__.py":
        names.update((c.stem, None) for c in path.parent.iterdir())
    return names


def dotted_resolves(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        module = _module_file(parts[:k])
        if module is None:
            continue
        rest = parts[k:]
        if not rest:
            return True
        names = _top_level(module)
        if rest[0] not in names:
            return False
        node = names[rest[0]]
        if len(rest) > 1 and isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                  ast.ClassDef))}
            members |= {x.id for n in node.body for x in ast.walk(n)
                        if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}
            return rest[1] in members
        return True
    return False


def path_resolves(token: str, where: Path | None) -> bool | None:
    """True or False for a path of ours; None for another project's."""
    if token.startswith(("sglang/", "srt/", "python/", "./", "../")) or re.search(r"/[A-Z_]+\.\w+$", token):
        return None  # SGLang's tree (ours is always workers/sglang/), or a placeholder (conf/sweep/NAME.yaml)
    bases = [ROOT]
    while where is not None and where != ROOT:
        bases.append(where)
        where = where.parent
    first = token.split("/")[0]
    if first in MADE_AT_RUN_TIME:
        return None
    ours = [b for b in bases if (b / first).exists()]
    if not ours:
        return None
    return any((b / token).exists() for b in ours)


def stale_names(file: Path, text: str, where: Path | None, tests: set[str]) -> list[str]:
    rel = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else file.name
    out = []
    for m in PATH.finditer(text):
        if (rel, m.group(1)) not in ABSENT_ON_PURPOSE and path_resolves(m.group(1), where) is False:
            out.append(f"{rel}: path {m.group(1)}")
    for m in DOTTED.finditer(text):
        name = m.group(1).rstrip(".")
        if not re.search(r"\.%s$" % EXT, name) and not dotted_resolves(name):
            out.append(f"{rel}: module name {name}")
    for m in TEST_NAME.finditer(text):
        name, prefix = m.group(1), m.group(2) or name_is_prefix(m.group(1))
        if name not in tests and not (prefix and any(t.startswith(name) for t in tests)):
            out.append(f"{rel}: test {name}")
    return out


def name_is_prefix(name: str) -> str:
    return "_" if name.endswith("_") else ""


def _test_names() -> set[str]:
    names = {p.stem for top in CODE for p in (ROOT / top).rglob("test_*.py")}
    for p in (ROOT / "tests").rglob("*.py"):
        names |= {n.name for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.FunctionDef)
                  and n.name.startswith("test_")}
    return names


def test_the_checker_finds_stale_names_and_leaves_others_projects_alone(tmp_path):
    text = ("`orchestrator/config/schema.py:12`, `workers/sglang/argv.py`, `report/tables.py`, `workers/gone.py`,\n"
            "`managers/scheduler.py:5528`, `sglang/srt/layers/sampler.py:215`, `mlflow/utils/mlflow_tags.py`,\n"
            "workers.sglang.argv.build_sglang_argv, orchestrator.results.store_layout.PARENT_TAG, workers.gone,\n"
            "workers.sglang.argv.no_such_name, docs/orchestrator.md, `test_the_checker_finds_sta...`, `test_gone`\n")
    f = tmp_path / "note.md"
    found = stale_names(f, text, ROOT / "orchestrator" / "results", _test_names())
    assert found == ["note.md: path workers/gone.py", "note.md: module name workers.gone",
                     "note.md: module name workers.sglang.argv.no_such_name", "note.md: test test_gone"]


def test_every_name_in_the_docs_and_docstrings_resolves():
    tests = _test_names()
    found = [s for file, text, where in texts() for s in stale_names(file, text, where, tests)]
    assert not found, "stale names (fix the text, or the name):\n" + "\n".join(found)
