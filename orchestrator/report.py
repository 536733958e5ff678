"""The `specsweep-report` command (= `python -m orchestrator.report`): a sweep's report, on demand.

    specsweep-report <sweep name | parent run id> [--tracking-uri URI]
    specsweep-report --history <sweep name> [--tracking-uri URI]    # each metric over time, per grid point
    specsweep-report --compare A B [--out DIR]

The report itself (table, plots, `diagnosis.md` on the parent run) is `orchestrator/results/report/`; a sweep
writes it at its end without this command. `--history` is `orchestrator/results/regress/timeline.py`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from orchestrator.results.report.cli import main as report_main

log = logging.getLogger(__name__)


def history_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="specsweep-report --history",
                                     description="each metric over time, per grid point, with its change points")
    parser.add_argument("--history", required=True, metavar="SWEEP", help="sweep name")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from mlflow.tracking import MlflowClient

    from orchestrator.results.regress.history import load_history
    from orchestrator.results.regress.timeline import experiment_for_sweep, render_history

    client = MlflowClient(tracking_uri=args.tracking_uri)
    try:
        exp_id, _ = experiment_for_sweep(client, args.history)
    except ValueError as e:
        log.error("%s", e)
        return 2
    sys.stdout.write(render_history(load_history(client, exp_id)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--history" or a.startswith("--history=") for a in args):
        return history_main(args)
    return report_main(args)


__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
