"""What a sweep leaves in MLflow and what is read back from it: whether the store answers (store_probe.py), the
tracker (experiment, parent and child runs, claims; tracking.py, with store_lock.py, drivers.py and provenance.py),
the UI's view of a sweep (ui_view.py), the report (report/) and the diagnosis (diagnosis.py). Imports config/ and specsweep_common, never execution/ or session/."""
