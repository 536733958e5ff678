"""`python -m workers.sglang.launch <sglang flags>`: `sglang.launch_server` with the kernel plugin registered.

Registration happens at module top level on purpose: SGLang spawns its scheduler processes (`spawn` start
method), which re-import the parent's `__main__` as `__mp_main__`, so top-level code runs in every one of them
(code under `if __name__ == "__main__"` would not). SGLang 0.5.10 has no
plugin entry points, so this is how it gets `specsweep_verify`; on >= 0.5.16 `load_plugins()` registers it
as well (idempotent). workers/sglang/argv.py emits this module for `attention=specsweep_verify`.
"""

from __future__ import annotations

import os
import sys

import specsweep_kernels.sglang_plugin

specsweep_kernels.sglang_plugin.register()


def main(argv: list[str]) -> None:
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:  # 0.5.10
        load_plugins = None
    if load_plugins is not None:
        load_plugins()
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
