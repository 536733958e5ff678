"""`specsweep-report`: a sweep's report on demand, or two sweeps compared.

    specsweep-report <sweep name | parent run id> [--tracking-uri URI]
    specsweep-report --compare A B [--out DIR] [--tracking-uri URI]

With a sweep name it reports the latest parent run of that experiment (a stub-engine sweep's experiment is
`<sweep name>-stub`). The report covers every point of the sweep, resumed ones included (read_back.py).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from orchestrator.results.report.build import write_report
from orchestrator.results.report.read_back import ReportError, resolve_parent

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specsweep-report", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("target", nargs="?", help="sweep name (its latest parent run) or a parent run id")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="two sweeps or parent runs: per matching point the deltas, and one plot")
    parser.add_argument("--out", default="specsweep-compare", help="where --compare writes (default: %(default)s)")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    args = parser.parse_args(argv)
    if (args.target is None) == (args.compare is None):
        parser.error("give a sweep (or parent run id), or --compare A B")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.tracking_uri)
    try:
        if args.compare:
            from orchestrator.results.report.compare import print_compare, write_compare

            a, b = args.compare
            comparison, files = write_compare(client, a, b, Path(args.out))
            print_compare(comparison)
            log.info("compared: %s", ", ".join(map(str, files)))
            return 0
        parent_id, sweep = resolve_parent(client, args.target)
    except ReportError as e:
        log.error("%s", e)
        return 2
    report = write_report(client, parent_id, sweep=sweep)
    log.info("report logged to parent run %s: %s", parent_id, ", ".join(report.artifact_files))
    return 0
