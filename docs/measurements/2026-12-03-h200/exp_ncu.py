"""Issue 31, session 14 (H200): one call of each shape between cudaProfilerStart / Stop, for
`ncu --profile-from-start off` (DRAM bytes, L2 hit rate, L2 sectors read by the SMs, tensor ops): does the second
m-block's pass over the KV come from L2 or from HBM, and how busy are the tensor cores. Each shape profiles two
kernels in this order: the attention kernel, then the merge."""
import torch
from specsweep_kernels.bench import bench_layout
from specsweep_kernels.bench_workload import portable_config
from specsweep_kernels.problems import make_problem
from specsweep_kernels.roofline import verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention
from specsweep_kernels.verify_targets import SM120

SHAPES = [("gluon", 8, 8, "chain"), ("gluon", 8, 9, "random"), ("gluon", 8, 16, "chain"), ("gluon", 16, 1, "chain"),
          ("triton", 8, 1, "chain"), ("triton", 8, 9, "random")]
for impl, heads, t, tree in SHAPES:
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[185000], num_tokens=t, page_size=1, dtype=torch.bfloat16,
                      device="cuda", tree=tree, seed=185000 + 7 * t + 1)
    ws = allocate_workspace(max_batch=1, max_tokens=t, num_q_heads=heads, v_head_dim=512, device="cuda")
    config = portable_config(layout, t, SM120.smem_per_block) if impl == "triton" else None
    out = pr.new_out()
    kw = dict(**pr.attention_args(), **pr.table_args(), out=out, workspace=ws,
              impl="auto" if impl == "gluon" else "triton", config=config)
    verify_attention(**kw)
    torch.cuda.synchronize()
    nb, flops, kv = verify_cost(layout=layout, prefix_len=185000, num_tokens=t, page_size=1)
    print(f"SHAPE {impl} mla:{heads} T={t} {tree} rows={heads * t} kv {kv / 1e6:.1f} MB min bytes {nb / 1e6:.1f} MB "
          f"flops {flops / 1e9:.2f} G", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    verify_attention(**kw)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
