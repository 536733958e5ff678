"""`python -m workers.reference --model-path tiny --load-format dummy --port N ...` (see --help)."""
from __future__ import annotations

import logging
import os
import sys

from .args import parse_args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import run_server  # heavy imports (torch, fastapi) after the flags are valid

    run_server(args)  # returns after a graceful shutdown (SIGTERM / SIGINT); a failed start raises SystemExit


def _exit_fast() -> None:
    """The server has shut down gracefully: flush what is buffered, then skip the interpreter's teardown
    (≈ 0.5 s with torch loaded on a 2-core VM) — the orchestrator waits for this process to go away."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _exit_fast()
