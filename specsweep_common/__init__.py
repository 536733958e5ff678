"""The bottom of the import graph: what the driver (orchestrator/) and the node side (workers/) have in
common: the specs, domains and SGLang facts both read. Modules here import only the standard library and each other; nothing here imports orchestrator,
workers or specsweep_kernels."""
