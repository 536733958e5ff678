"""specsweep's orchestrator: from Hydra's configs to MLflow, one package per concern, each importing only those
below it (tests/test_import_layers.py holds the order):

    config/      what to run: the settings, the schema, the rules (validate.py), Hydra jobs to RunConfigs, the plan
    results/     what a sweep leaves in MLflow: the tracker (layout, claims, store lock), the report, the diagnosis
    execution/   a plan executed on Ray: connecting Ray, actors, driver loop, recording, signals, preflight, progress
    session/     the sweep as the launcher runs it: preflight, resume and claims, execution, each job's outcome
    schedules/   cron schedules (the shipped *.yaml) and the daemon that submits them as Ray Jobs
    tune/        a search whose rounds are sweeps: Optuna picks the configurations, the answer per batch size

On top, the command lines only: `__main__.py` (`specsweep`, `python -m orchestrator`), `schedule.py`
(`specsweep-schedule`) and `report.py` (`specsweep-report`); the Hydra plugin (hydra_plugins/specsweep_launcher)
calls `session.launcher`, and its tune sweeper `tune.entry`.

Verbs, one level each: Hydra *launches* the jobs (`session.launcher.launch`, Hydra's `Launcher.launch`); the session
*runs* a sweep or a single run (`session.sweep.sweep_plan`, `session.launcher.run_single`); the execution layer
*executes* a plan on Ray (`execution.execute.execute_plan`); a *run* is one grid point (RunSpec, RunResult, an MLflow
child run).
"""
