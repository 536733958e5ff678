"""Developer tools, outside the product packages: the benchmarks behind `make bench-*` and the helpers the tests
and benchmarks share (`tools.testing`). Nothing in orchestrator/, workers/, specsweep_common/ or kernels/ imports
from here (tests/test_import_layers.py). Run from the repository root: `python -m tools.bench_engine`, ..."""
