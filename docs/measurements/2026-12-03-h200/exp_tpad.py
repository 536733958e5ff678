"""Issue 31 goal 1, H200: is a partial last m-block slow because of T itself? The same chain problem run at its
real T and at the T that fills the last 64-row m-block (the extra tokens come after the real ones in the chain,
so the real tokens never see them: their outputs are the real-T call's). Compiled registers / spills of each."""
import torch
from specsweep_kernels import verify_attention as va
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention

reader = ReadStream(400 << 20)
for heads, t, t_pad, prefix, page in ((8, 9, 16, 185000, 1), (8, 12, 16, 185000, 1), (16, 9, 12, 185000, 1),
                                      (8, 17, 24, 185000, 1), (8, 9, 16, 262144, 64), (8, 9, 16, 65536, 1),
                                      (16, 17, 20, 185000, 1)):
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[prefix], num_tokens=t_pad, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree="chain", seed=prefix + t)
    full, addr = pr.attention_args(), pr.table_args()
    real = dict(full, q=full["q"][:, :t].contiguous(), k_new=full["k_new"][:, :t].contiguous(),
                tree_mask=full["tree_mask"][:, :t, :t].contiguous())
    ref = verify_attention_reference(**real, **addr, v_head_dim=512)
    nb = verify_cost(layout=layout, prefix_len=prefix, num_tokens=t, page_size=page)[0]
    fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
    line = []
    for name, a, tt in (("real T", real, t), ("padded T", full, t_pad)):
        ws = allocate_workspace(max_batch=1, max_tokens=tt, num_q_heads=heads, v_head_dim=512, device="cuda")
        out = torch.full((1, tt, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        run = lambda: verify_attention(**a, **addr, out=out, workspace=ws)  # noqa: E731
        run()
        c = va._last_compiled
        err = _rel_err(out[:, :t], ref)
        us = sorted(graph_us(run)[0] for _ in range(3))[1]
        line.append(f"{name} {tt}: {us:.1f}us {fl / us:.0%} err {err:.1e} regs {c.n_regs} spills {c.n_spills} "
                    f"smem {c.metadata.shared // 1024}KB")
    print(f"mla:{heads} T={t} {prefix // 1000}k page={page} read {fl:.1f}us | " + " | ".join(line), flush=True)
