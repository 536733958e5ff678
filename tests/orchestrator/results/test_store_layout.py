"""The MLflow store's layout is named once, in orchestrator/results/store_layout.py: no other module of the product
or of tools/ spells one of its distinctive names in code (docstrings may name them)."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.results import store_layout

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("orchestrator", "workers", "specsweep_common", "hydra_plugins", "tools")
LAYOUT = ROOT / "orchestrator" / "results" / "store_layout.py"
# the names no other module may spell: MLflow's own tags, ours with a dot, the artifact
DISTINCTIVE = (store_layout.PARENT_TAG, store_layout.EXPERIMENT_KIND_TAG, store_layout.VIEW_TAG_PREFIX,
               store_layout.RUN_TYPE_TAG, store_layout.ROLE_TAG, store_layout.AXES_TAG,
               store_layout.RUN_HASHES_ARTIFACT)


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of a module that is not a docstring (f-strings' literal parts included)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def spellings(path: Path, names: tuple[str, ...], root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{n.lineno} {name!r}" for n in _code_strings(ast.parse(path.read_text()))
            for name in names if name in n.value]


def test_the_checker_finds_a_spelling_in_code_and_not_in_a_docstring(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text('"""mlflow.parentRunId in prose"""\nTAG = "mlflow.parentRunId"\n'
                 'q = f"tags.`mlflow.parentRunId` = {1}"\n\n\ndef g():\n    """run_hashes.txt, again prose"""\n')
    assert [s.split()[0] for s in spellings(f, DISTINCTIVE, tmp_path)] == ["probe.py:2", "probe.py:3"]


def test_no_other_module_spells_the_store_layout():
    assert "mlflow.parentRunId" in DISTINCTIVE
    found = [s for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")) if path != LAYOUT
             for s in spellings(path, DISTINCTIVE)]
    assert not found, "spell these through orchestrator.results.store_layout:\n" + "\n".join(found)
