"""The `specsweep-report` command (= `python -m orchestrator.report`): a sweep's report, on demand.

    specsweep-report <sweep name | parent run id> [--tracking-uri URI]
    specsweep-report --compare A B [--out DIR]

The report itself (table, plots, `diagnosis.md` on the parent run) is `orchestrator/results/report/`; a sweep
writes it at its end without this command.
"""

from __future__ import annotations

import sys

from orchestrator.results.report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
