"""What to run, decided before anything starts: the settings, the typed schema of every config key, the rules a
run config must satisfy (validate.py), Hydra jobs to validated RunConfigs (jobs.py), and the plan they expand to
(plan.py: server groups of runs). Pure: no Ray, MLflow or engine; imports only specsweep_common and itself."""
