"""Tuning: a sweep whose points a searcher chooses, and the answer per batch size (docs/tune.md).

    settings.py   `TuneSettings`: the search space, the workload (batch sizes, contexts), the budget, the limits
    space.py      the conditioned space: candidates (one server configuration each), their workload jobs
    robust.py     winners that survive noise: median - 1.4826 MAD, the 1 % tie rule, separability
    answer.py     the table per batch size, the load curves, SGLang's adaptive-config JSON and launch commands
    study.py      the Optuna study (RDB storage beside the MLflow store): ask, tell, resume
    search.py     the loop: rounds of trials run as sweeps (one server start per configuration), pruning, the
                  leaders' repeats, the answer recorded on the tune's MLflow run
    loop.py       the ask/tell loop and the leaders, engine-free (the benchmark replays it)
    rounds.py     its edge: each round through session.sweep.sweep_plan, the tune's MLflow run, records read back
    entry.py      the Hydra sweeper's hand-off (and why Optuna directly, not hydra-optuna-sweeper)

The Hydra side is the `specsweep` sweeper (`hydra_plugins/specsweep_launcher`) with its `tune` section set by a
`conf/tune/<name>.yaml`: `specsweep +tune=<name>`.
"""
