"""Issue 31, session 14 (H200): where a ragged MLA call at T = 4 spends its time (goal 3): each of the calls'
kernels (plan, attention, merge) under ncu (duration, DRAM bytes, tensor ops; caches flushed before each kernel,
no programmatic overlap), after the call's CUDA-graph time and its read stream were printed (clean L2 flush).
Run as `ncu --profile-from-start off ... python exp_ncu_ragged.py`: one call of each row is profiled."""
import torch
from specsweep_kernels.bench import bench_layout, graph_us, ragged_mixes
from specsweep_kernels.problems import make_problem
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention

reader = ReadStream(800 << 20)
for heads in (8, 16):
    for mix, lens in ragged_mixes("1024/65536/3/200000,16r,64r"):
        layout = bench_layout(f"mla:{heads}")
        pr = make_problem(layout=layout, prefix_lens=lens, num_tokens=4, page_size=16, dtype=torch.bfloat16,
                          device="cuda", seed=sum(lens) + 7 * 4 + 16)
        ws = allocate_workspace(max_batch=len(lens), max_tokens=4, num_q_heads=heads, v_head_dim=512, device="cuda")
        out = pr.new_out()
        run = lambda: verify_attention(**pr.attention_args(), **pr.table_args(), out=out, workspace=ws)  # noqa
        run()
        us = graph_us(run)[0]
        nb = sum(verify_cost(layout=layout, prefix_len=n, num_tokens=4, page_size=16)[0] for n in lens)
        fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
        torch.cuda.synchronize()
        print(f"ROW mla:{heads} {mix} T=4 page 16: graph {us:.1f} us, read stream {fl:.1f} us ({fl / us:.0%}), "
              f"{nb / 1e6:.0f} MB", flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
