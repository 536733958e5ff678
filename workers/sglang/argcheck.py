"""Check SGLang launch argv with the installed SGLang's own parser, in a process of its own.

    python -m workers.sglang.argcheck [--sglang-path DIR] [--parse-only] < cases.jsonl > results.jsonl

Each input line is `{"id": str, "argv": [flags...], "env": {NAME: VALUE}}` (argv without the interpreter and
`-m module`); each output line is `{"id", "ok", "stage", "error", "resolved"}` (`resolved`: the
`workers.sglang.argv.SERVER_INFO_FIELDS` SGLang's /server_info would report) with stage one of `parse` (argparse:
unknown flag, bad choice, bad type), `resolve` (`ServerArgs.resolve_once()` + `check_server_args()` on >= 0.5.16;
0.5.10 validates inside `prepare_server_args`) or `done`. `--sglang-path` puts another SGLang (an unpacked
`pip install --no-deps --target DIR sglang==X`) first on sys.path.

Why a separate process: importing `sglang` patches `transformers` and reads hardware at import; none of that
may leak into the process that runs the rest of the tests or the orchestrator. On a CPU machine the argv must
carry `--device cuda` and model paths must be directories with a `config.json` (`sglang/srt/server_args.py:668` prepare_server_args);
the resolved values are then those of a GPU-less host (a syntax and cross-field check, not an H200's choices).

`torchvision` is only imported by SGLang's multimodal configs; a CPU venv whose torch has no matching
torchvision wheel gets a stub module here (and only here) so that `resolve_once()` can import them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import logging
import os
import sys
import types
from typing import Any

from workers.sglang.argv import SERVER_INFO_FIELDS

logger = logging.getLogger(__name__)


class _Anything:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> "_Anything":
        return _Anything()

    def __getattr__(self, name: str) -> "_Anything":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any `torchvision[.x]` import yields an empty package whose attributes are inert placeholders."""

    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)

        def attr(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return _Anything

        module.__getattr__ = attr  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:
        module.__path__ = []


def prepare_sglang_imports(sglang_path: str | None) -> None:
    """Make SGLang importable in this process: its tree first on sys.path when given, and the torchvision stub
    where no real torchvision is installed. Call before the first `import sglang...`."""
    if sglang_path:
        sys.path.insert(0, sglang_path)
    # transformers decides once, at import, whether torchvision exists: let it see the truth first.
    import transformers.utils.import_utils  # noqa: F401

    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _StubFinder())


def _register_plugins() -> None:
    """Our plugin (as workers/sglang/launch does) and, where SGLang has them, all entry-point plugins."""
    import specsweep_kernels.sglang_plugin

    specsweep_kernels.sglang_plugin.register()
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:  # 0.5.10: no plugin framework
        return
    load_plugins()


def check_one(argv: list[str], env: dict[str, str], parse_only: bool) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    stage, err = "parse", io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            server_args = prepare_server_args(list(argv))  # 0.5.10: also runs the full validation
            stage = "resolve"
            if not parse_only and hasattr(server_args, "resolve_once"):
                server_args.resolve_once()
                server_args.check_server_args()
        # What /server_info will report: 0.5.23 resolves into a view (`resolved_dict()`, the raw fields keep the
        # input); 0.5.10 resolved in place.
        values = server_args.resolved_dict() if hasattr(server_args, "resolved_dict") else vars(server_args)
        resolved = {k: _plain(values.get(k)) for k in SERVER_INFO_FIELDS}
        return {"ok": True, "stage": "done", "error": "", "resolved": resolved}
    except SystemExit as e:  # argparse
        return {"ok": False, "stage": stage, "error": err.getvalue().strip()[-2000:] or f"exit {e.code}",
                "resolved": {}}
    except Exception as e:  # noqa: BLE001 - every SGLang rejection is a result here, not a crash
        return {"ok": False, "stage": stage, "error": f"{type(e).__name__}: {e}"[-2000:], "resolved": {}}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-path", help="a directory with another SGLang version, put first on sys.path")
    parser.add_argument("--parse-only", action="store_true", help="skip resolve_once()/check_server_args()")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    prepare_sglang_imports(args.sglang_path)
    import sglang

    version = getattr(sglang, "__version__", "?")
    _register_plugins()
    out = sys.stdout
    out.write(json.dumps({"sglang_version": version, "sglang_file": sglang.__file__}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        with contextlib.redirect_stdout(sys.stderr):  # SGLang prints; stdout carries only results
            result = check_one(case["argv"], case.get("env", {}), args.parse_only)
        out.write(json.dumps({"id": case["id"], **result}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
