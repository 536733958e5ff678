"""A sweep's report: the points read back from MLflow (read_back.py), tables and the pivot (tables.py), plots
(plots.py), the Markdown sections (sections.py: one function per section), the report logged on the parent run
(build.py), two sweeps compared (compare.py) and the `specsweep-report` command (cli.py)."""
