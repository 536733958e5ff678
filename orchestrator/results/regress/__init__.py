"""Regressions: each grid point compared with its own history (docs/schedule.md, "Regressions").

Modules, bottom to top: `verdict` (pure per-metric verdicts), `changepoints` (ruptures), `history` (MLflow: parents,
children by `point_key`, the baseline), `attribution` (what differs, patterns across the grid, the oracle rule),
`baseline_compare` (verdicts + attribution over a loaded history), `section` (the report's "Changes since"
section, tags, plots), `timeline` (`specsweep-report --history`), `alert` (`on_regression`, the CI marker).
"""
