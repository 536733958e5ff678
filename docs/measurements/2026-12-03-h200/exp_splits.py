"""Split-count sweeps (issue 31 goals 2 and 3), H200: ragged MLA T=4 on the Gluon kernel and batch-1 MLA on the
portable kernel with its sm_120 tile; each row's read-stream floor measured in the same run."""
import math, sys, time
import torch
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us, ragged_mixes
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention, verify_launch_params
from specsweep_kernels.bench_workload import portable_config
from specsweep_kernels.verify_targets import SM120

reader = ReadStream(800 << 20)
def floor(layout, lens, t, page):
    nb = sum(verify_cost(layout=layout, prefix_len=n, num_tokens=t, page_size=page)[0] for n in lens)
    return min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)

def sweep(name, lens, t, page, impl, mults):
    layout = bench_layout(name)
    pr = make_problem(layout=layout, prefix_lens=lens, num_tokens=t, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree="chain", seed=sum(lens) + t)
    args, addr = pr.attention_args(), pr.table_args()
    ws = allocate_workspace(max_batch=len(lens), max_tokens=t, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device="cuda", max_splits=4 * 132 * 4)
    ref = verify_attention_reference(**args, **addr, v_head_dim=layout.v_head_dim)
    cfg = portable_config(layout, t, SM120.smem_per_block) if impl == "triton" else None
    out = pr.new_out()
    _, p0 = verify_launch_params(**args, **addr, out=out, workspace=ws, impl=impl, config=cfg)
    fl = floor(layout, lens, t, page)
    res = []
    for m in mults:
        p = max(1, int(round(p0 * m)))
        out = pr.new_out()
        run = lambda: verify_attention(**args, **addr, out=out, workspace=ws, impl=impl, config=cfg, num_splits=p)
        try:
            run(); err = _rel_err(out, ref); us, _ = graph_us(run)
            res.append(f"P={p}({m}x) {us:.1f}us {fl/us:.0%} err {err:.1e}")
        except Exception as e:
            res.append(f"P={p} {type(e).__name__} {str(e)[:80]}")
    print(f"{impl:6s} {name} B={len(lens)} T={t} page={page} read {fl:.1f}us cfg={cfg}: " + " | ".join(res), flush=True)

mixes = ragged_mixes("1024/65536/3/200000,16r,64r")
for heads in (8, 16):
    for mix, lens in mixes:
        sweep(f"mla:{heads}", lens, 4, 16, "auto", (0.5, 0.75, 1, 1.5, 2, 3))
for name, t in (("mla:8", 1), ("mla:16", 1), ("mla:16", 2), ("mla:8", 4), ("mla:8", 9), ("mla:16", 4)):
    sweep(name, [185000], t, 1, "triton", (0.5, 1, 1.5, 2, 3, 4))
