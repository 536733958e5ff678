"""Issue 31, session 15 (H200): can 72 rows (8 heads x a 9-node tree, 185k page 1) run as their 64-row m-block on
the 64-row Gluon kernel beside their last 8 rows on the narrow (swapped) kernel, the two kernels side by side on
disjoint SMs (two streams in one CUDA graph), instead of two 64-row m-blocks (the second all but 8 rows padding)?
Timing only: the 8-row call here sees new token 8 alone (its tree row is not the real one), so only the prefix
work is representative; the 64-row part is checked against the reference of the first 8 tokens.
Arms: the call as shipped (P from the picker), the 64-row part alone and the 8-row part alone at several P, and
the two side by side for (P_a, P_b) pairs; each a CUDA graph (clean L2 flush), medians of 3 interleaved rounds."""
import statistics

import torch

from specsweep_kernels import verify_attention as va
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost

reader = ReadStream(800 << 20)
for heads, t_all, n in ((8, 9, 185000), (8, 12, 185000), (8, 9, 65536), (16, 5, 185000)):
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[n], num_tokens=t_all, page_size=1, dtype=torch.bfloat16,
                      device="cuda", tree="random", seed=n + 7 * t_all + 1)
    args, addr = pr.attention_args(), pr.table_args()
    t_a = 64 // heads
    ws = va.allocate_workspace(max_batch=1, max_tokens=t_all, num_q_heads=heads, v_head_dim=512, device="cuda")
    ws_a = va.allocate_workspace(max_batch=1, max_tokens=t_all, num_q_heads=heads, v_head_dim=512, device="cuda")
    ws_b = va.allocate_workspace(max_batch=1, max_tokens=t_all, num_q_heads=heads, v_head_dim=512, device="cuda")
    out = pr.new_out()
    out_a = torch.empty_like(out[:, :t_a])
    out_b = torch.empty_like(out[:, t_a:])

    def part(lo, hi):
        a = dict(args)
        a["q"] = args["q"][:, lo:hi]
        a["k_new"] = args["k_new"][:, lo:hi]
        a["tree_mask"] = args["tree_mask"][:, lo:hi, lo:hi].contiguous()
        return a
    args_a, args_b = part(0, t_a), part(t_a, t_all)

    def call_a(p):
        return lambda: va.verify_attention(**args_a, **addr, out=out_a, workspace=ws_a, num_splits=p)

    def call_b(p):
        return lambda: va.verify_attention(**args_b, **addr, out=out_b, workspace=ws_b, num_splits=p)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def side(pa, pb):
        fa, fb = call_a(pa), call_b(pb)

        def fn():
            cur = torch.cuda.current_stream()
            s1.wait_stream(cur)
            s2.wait_stream(cur)
            with torch.cuda.stream(s1):
                fa()
            with torch.cuda.stream(s2):
                fb()
            cur.wait_stream(s1)
            cur.wait_stream(s2)
        return fn
    arms = {"shipped": lambda: va.verify_attention(**args, **addr, out=out, workspace=ws)}
    for p in (66, 100, 132):
        arms[f"a{p}"] = call_a(p)
    for p in (32, 48, 66, 132):
        arms[f"b{p}"] = call_b(p)
    for pa, pb in ((66, 66), (84, 48), (92, 40), (100, 32), (132, 132), (110, 22)):
        arms[f"a{pa}|b{pb}"] = side(pa, pb)
    for fn in arms.values():
        fn()
    torch.cuda.synchronize()
    ref = verify_attention_reference(**args_a, **addr, v_head_dim=512)
    arms["a100"]()
    torch.cuda.synchronize()
    err_a = _rel_err(out_a, ref)
    times = {k: [] for k in arms}
    for _ in range(3):
        for k, fn in arms.items():
            times[k].append(graph_us(fn)[0])
    nb = verify_cost(layout=layout, prefix_len=n, num_tokens=t_all, page_size=1)[0]
    fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
    cells = " | ".join(f"{k} {statistics.median(v):.1f}" for k, v in times.items())
    print(f"ROW mla:{heads} T={t_all} {n // 1000}k page 1: read {fl:.1f} us, err(64-row part) {err_a:.1e} | {cells}",
          flush=True)
