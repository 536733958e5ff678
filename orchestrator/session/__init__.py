"""The sweep as the launcher runs it: Hydra's jobs validated and planned (launcher.py), the preflight, resume and
claims on the MLflow store and the execution (sweep.py), and what happened to each job (outcomes.py). Only the
command lines and the Hydra plugin import it."""
