"""Load curves: SGLang's bench_serving at several load levels against one configuration's live server, alone
(`specsweep +load=<name>`) or after a tune for each batch size's winner (docs/tune.md "Load curves").

    settings.py   `LoadSettings` (`hydra.sweeper.load`): the levels, the workload, the p99 limits; their checks
    curve.py      a level's figures from bench_serving's result line and the engine's per-request records; the
                  Pareto front; the MLflow metrics per level
    render.py     the table per configuration, the load-curve, Pareto and accept-length charts
    run.py        each curve as a Ray task on the server's node (workers/load_curve.py), recorded in MLflow
    entry.py      the Hydra sweeper's hand-off: the checks before anything starts, alone or after a tune
"""
