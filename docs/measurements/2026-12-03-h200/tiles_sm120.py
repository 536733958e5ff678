"""Run 3 (2026-12-03, H200): portable-kernel tiles that fit sm_120's 99 KB a block, timed on 32-row and 72-row
shapes with the split count the occupancy rule gives (num_splits=None), clean L2, CUDA-graph medians; each tile's
time is taken twice (two passes over the list) to show the spread. Run with PYTHONPATH=kernels:. on a GPU;
argument run3 (default) or run4 (the same the picker's change was checked with)."""
import torch

from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention, verify_launch_params
from specsweep_kernels.verify_config import VerifyConfig as C

import sys

CASES = {"run3": [
    ("gqa", 131072, 8, [C(32, 64, 8, 3), C(32, 64, 4, 3), C(64, 64, 8, 3), C(32, 128, 4, 3), C(32, 64, 4, 2)]),
    ("gqa", 131072, 16, [C(64, 64, 8, 3), C(64, 128, 8, 3), C(64, 64, 4, 3)]),
    ("mla:16", 185000, 2, [C(32, 32, 8, 2), C(32, 32, 4, 2), C(16, 64, 4, 2)]),
    ("mla:8", 185000, 4, [C(32, 32, 8, 2), C(32, 32, 4, 2), C(16, 64, 4, 2)]),
    ("mla:8", 185000, 9, [C(32, 32, 4, 2), C(16, 64, 4, 2)]),
    ("mla:16", 185000, 4, [C(32, 32, 4, 2), C(16, 64, 4, 2)]),
], "run4": [  # the picker's new 99 KB choices against the old ones, and the row counts run 3 did not reach
    ("gqa", 131072, 4, [C(16, 128, 4, 2), C(16, 64, 8, 3)]),
    ("gqa", 131072, 8, [C(32, 128, 4, 2), C(32, 128, 4, 3)]),
    ("gqa", 131072, 32, [C(128, 64, 4, 3), C(128, 64, 8, 3)]),
    ("gqa", 131072, 64, [C(128, 64, 4, 3), C(128, 64, 8, 3)]),
    ("mla:8", 185000, 16, [C(16, 64, 4, 2), C(32, 32, 4, 2)]),
    ("mla:8", 185000, 17, [C(16, 64, 4, 2), C(32, 32, 4, 2)]),
    ("mla:16", 185000, 9, [C(16, 64, 4, 2), C(32, 32, 4, 2)]),
]}[sys.argv[1] if len(sys.argv) > 1 else "run3"]
for name, prefix, tokens, configs in CASES:
    layout = bench_layout(name)
    p = make_problem(layout=layout, prefix_lens=[prefix], num_tokens=tokens, page_size=1, dtype=torch.bfloat16,
                     device="cuda", seed=3)
    args, addr = p.attention_args(), p.table_args()
    ws = allocate_workspace(max_batch=1, max_tokens=tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device="cuda")
    ref = verify_attention_reference(**args, **addr, v_head_dim=layout.v_head_dim)
    times = {c: [] for c in configs}
    for _ in range(2):
        for c in configs:
            out = p.new_out()
            run = lambda: verify_attention(**args, **addr, out=out, workspace=ws, config=c, impl="triton")  # noqa
            run()
            err = _rel_err(out, ref)
            times[c].append(graph_us(run)[0])
    for c in configs:
        _, splits = verify_launch_params(**args, **addr, out=out, workspace=ws, config=c, impl="triton")
        print(f"{name} L={prefix} T={tokens} m{c.block_m} n{c.block_n} w{c.num_warps} s{c.num_stages} P={splits}: "
              f"{' / '.join(f'{t:.1f}' for t in times[c])} us err {err:.1e}", flush=True)
