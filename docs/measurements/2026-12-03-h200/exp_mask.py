"""Issue 31, H200: the 64-row Gluon kernel with its tree mask live across the prefix loop (old) vs loaded per tile in
the new-token programs' branch (MASK_IN_BRANCH), A/B in one process (ABAB x 3, medians of graph replays after a
clean L2 flush), with compiled registers / spills of each and the read-stream floor of each row."""
import torch
from specsweep_kernels import verify_attention as va
from specsweep_kernels import verify_mla_sm90 as g
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us, ragged_mixes
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention

reader = ReadStream(800 << 20)
mixes = dict(ragged_mixes("1024/65536/3/200000,16r,64r"))
rows = [(8, t, [185000], 1, "tree" if t in (9, 12, 17) else "chain") for t in (8, 9, 12, 16, 17)]
rows += [(16, 4, [185000], 1, "chain"), (16, 9, [185000], 1, "tree"), (8, 9, [262144], 64, "tree"),
         (8, 9, [65536], 1, "tree"), (64, 1, [131072], 64, "chain"), (128, 4, [131072], 1, "chain"),
         (128, 16, [32768], 1, "chain")]
rows += [(16, 4, lens, 16, "chain") for lens in mixes.values()] + [(16, 16, mixes["16× rand Σ164k"], 16, "chain")]
for heads, t, lens, page, tree in rows:
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=lens, num_tokens=t, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree=tree, seed=sum(lens) + 7 * t + page)
    args, addr = pr.attention_args(), pr.table_args()
    ws = allocate_workspace(max_batch=len(lens), max_tokens=t, num_q_heads=heads, v_head_dim=512, device="cuda")
    ref = verify_attention_reference(**args, **addr, v_head_dim=512)
    nb = sum(verify_cost(layout=layout, prefix_len=n, num_tokens=t, page_size=page)[0] for n in lens)
    fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
    res, info, err = {False: [], True: []}, {}, {}
    for rep in range(3):
        for mib in (False, True):
            g.MASK_IN_BRANCH = mib
            out = pr.new_out()
            run = lambda: verify_attention(**args, **addr, out=out, workspace=ws)  # noqa: E731
            run()
            c = va._last_compiled
            info[mib] = f"regs {c.n_regs} spills {c.n_spills}"
            err[mib] = _rel_err(out, ref)
            res[mib].append(graph_us(run)[0])
    g.MASK_IN_BRANCH = True
    med = {k: sorted(v)[1] for k, v in res.items()}
    label = f"{lens[0] // 1000}k" if len(lens) == 1 else f"B={len(lens)} Σ{sum(lens) // 1000}k"
    print(f"mla:{heads} T={t} {tree} {label} page={page} read {fl:.1f}us | old {med[False]:.1f}us {fl / med[False]:.0%} "
          f"err {err[False]:.1e} {info[False]} | branch {med[True]:.1f}us {fl / med[True]:.0%} err {err[True]:.1e} "
          f"{info[True]} | {med[True] / med[False] - 1:+.1%}  raw old {[round(x, 1) for x in res[False]]} "
          f"new {[round(x, 1) for x in res[True]]}", flush=True)
