"""A sweep's report: the points read back from MLflow (load.py), tables and the pivot (tables.py), plots
(plots.py), the Markdown sections (sections.py: one function per section), the report logged on the parent run
(build.py), two sweeps compared (compare.py) and the `specsweep-report` command (cli.py)."""

from orchestrator.results.report.build import Report, print_report, write_report
from orchestrator.results.report.cli import main
from orchestrator.results.report.load import (PARENT_TAG, RUN_HASHES_ARTIFACT, ChildRun, ReportError,
                                              load_children, resolve_parent, row_from_run, sweep_run_hashes)
from orchestrator.results.report.sections import SECTIONS, ReportContext, Section
from orchestrator.results.report.tables import KERNEL_COLUMNS, KERNEL_METRICS, TABLE_COLUMNS, TABLE_METRICS

__all__ = ["KERNEL_COLUMNS", "KERNEL_METRICS", "PARENT_TAG", "RUN_HASHES_ARTIFACT", "SECTIONS", "TABLE_COLUMNS",
           "TABLE_METRICS", "ChildRun", "Report", "ReportContext", "ReportError", "Section", "load_children", "main",
           "print_report", "resolve_parent", "row_from_run", "sweep_run_hashes", "write_report"]
