"""`python -m workers.reference --model-path tiny --load-format dummy --port N ...` (see --help)."""
from __future__ import annotations

import logging

from .args import parse_args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import run_server  # heavy imports (torch, fastapi) after the flags are valid

    run_server(args)


if __name__ == "__main__":
    main()
