"""The bottom of the import graph: the vocabulary that the driver (orchestrator/) and the node side (workers/)
both speak. Modules here import only the standard library and each other; nothing here imports orchestrator,
workers or specsweep_kernels."""
