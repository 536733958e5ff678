"""Measurement tools for the verify-attention kernels of `specsweep_kernels`, kept out of that package.

- `bench`: the checked, timed grid beside the torch reference and SGLang's kernels (`make bench-kernels`);
  its CUDA-graph timing (`bench.graph_us`) is also what a kernel sweep's jobs time with (workers/kernel_job.py).
- `bench_workload`: the verify workload grid against ceilings measured in the same run (`make bench-kernels-workload`).
- `breakdown`: where a batch-1 call's time goes, the call and its merge apart (`make bench-kernels-breakdown`).
- `sglang_peer`: SGLang's own attention kernels loaded as peers to compare against, from a wheel or a source folder.

`specsweep_kernels` is what a server loads (the SGLang plugin and the kernels it dispatches to); it never imports
this package. These modules import SGLang's kernels and time ours, which a server does not need, so they sit in
their own package beside it (tests/test_import_layers.py holds the rule).
"""
