"""A plan executed on Ray: `execute.execute_plan` over the Ray connection (ray_connection.py, local_ray.py), the actors
around workers' runners (actors.py), the driver loop (driver.py), results to MLflow and the report (recording.py),
Ctrl-C and SIGTERM (signals.py), the counters (stats.py), the checks that the plan fits (preflight.py) and the
progress line (progress.py). Imports config/ and results/, never session/."""
