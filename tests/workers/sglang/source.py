"""Run pieces of the installed SGLang's own code on CPU, where its modules cannot be imported here.

SGLang 0.5.23 is installed with --no-deps: `sglang.srt.managers.{tokenizer_manager,schedule_batch,...}` fail to
import (uvloop, torchvision). Their counting code is plain Python, so this helper reads the installed source file,
takes the named top-level definitions or class methods out of it (ast), compiles them as they are (with the file's
own `from __future__ import annotations`) and executes them in a namespace the test supplies: `get_spec`, the few
collaborators a method touches, and nothing else. The code that runs is SGLang's own, byte for byte; only its
module-level imports are replaced by what the caller passes.

    ns = sglang_defs("srt/managers/schedule_batch.py", ["FINISH_LENGTH", "Req.update_finish_state"], {...})
    ns["Req.update_finish_state"](req)

`sglang_line(rel, text)`: the 1-based line where `text` first occurs in sglang/<rel> (tests pin the lines the
project's comments cite).
"""

from __future__ import annotations

import __future__
import ast
import importlib.util
from pathlib import Path
from typing import Any, Iterable


def package_dir(name: str) -> Path | None:
    """The installed package's folder, found without importing it (None where it is not installed)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def sglang_root() -> Path | None:
    return package_dir("sglang")


def _source(rel: str) -> tuple[str, ast.Module]:
    root = sglang_root()
    if root is None:
        raise FileNotFoundError("sglang is not installed")
    text = (root / rel).read_text(encoding="utf-8")
    return text, ast.parse(text)


def _find(tree: ast.Module, qualname: str) -> ast.stmt:
    owner, _, name = qualname.rpartition(".")
    body: list[ast.stmt] = tree.body
    if owner:
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            raise LookupError(f"no class {owner} in the SGLang source")
        body = cls.body
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
    raise LookupError(f"no definition {qualname} in the SGLang source")


def sglang_defs(rel: str, qualnames: Iterable[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute the definitions `qualnames` ("name" or "Class.method") of sglang/<rel> in `namespace` (their
    globals) and return {qualname: object}. Methods are returned as plain functions (a @property as the property)."""
    _, tree = _source(rel)
    out: dict[str, Any] = {}
    for qualname in qualnames:
        node = _find(tree, qualname)
        name = node.name  # type: ignore[attr-defined]
        code = compile(ast.Module(body=[node], type_ignores=[]), f"sglang/{rel}", "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        had, before = name in namespace, namespace.get(name)
        exec(code, namespace)  # noqa: S102 - SGLang's own definition, from the installed wheel
        out[qualname] = namespace[name]
        if "." in qualname:  # a method: keep it out of the shared globals
            if had:
                namespace[name] = before
            else:
                del namespace[name]
    return out


def sglang_line(rel: str, text: str) -> int:
    source, _ = _source(rel)
    index = source.find(text)
    if index < 0:
        raise LookupError(f"{text!r} is not in sglang/{rel}")
    return source.count("\n", 0, index) + 1
