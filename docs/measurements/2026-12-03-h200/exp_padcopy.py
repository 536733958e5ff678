"""Issue 31 goal 1, H200: the 64-row Gluon kernel's padded rows zero-filled (old) vs copies of real rows (pad_copy),
A/B in one process (ABAB, each the median of graph replays after a clean L2 flush), plus the data test (T = 16,
128 real rows, with tokens >= 9 of q zeroed) and the per-program bounds of a row split over two m-blocks (64 rows
and 8 rows at P = 65 against the default)."""
import torch
from specsweep_kernels import verify_mla_sm90 as g
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention, verify_launch_params

reader = ReadStream(400 << 20)

def setup(heads, t, prefix, page, tree="chain"):
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[prefix], num_tokens=t, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree=tree, seed=prefix + 7 * t + page)
    args, addr = pr.attention_args(), pr.table_args()
    ws = allocate_workspace(max_batch=1, max_tokens=t, num_q_heads=heads, v_head_dim=512, device="cuda")
    nb = verify_cost(layout=layout, prefix_len=prefix, num_tokens=t, page_size=page)[0]
    fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
    return pr, args, addr, ws, fl

def timed(pr, args, addr, ws, ref, **kw):
    out = pr.new_out()
    run = lambda: verify_attention(**args, **addr, out=out, workspace=ws, **kw)
    run()
    err = _rel_err(out, ref)
    return graph_us(run)[0], err

print("A/B pad_copy (old = zeros | new = copies), 4 alternations, median of each", flush=True)
for heads, t, prefix, page, tree in ((8, 9, 185000, 1, "tree"), (8, 9, 185000, 1, "chain"), (8, 12, 185000, 1, "tree"),
                                     (8, 17, 185000, 1, "tree"), (16, 9, 185000, 1, "tree"), (16, 17, 185000, 1, "tree"),
                                     (8, 9, 262144, 64, "tree"), (8, 9, 65536, 1, "tree"), (8, 16, 185000, 1, "chain"),
                                     (8, 8, 185000, 1, "chain")):
    pr, args, addr, ws, fl = setup(heads, t, prefix, page, tree)
    ref = verify_attention_reference(**args, **addr, v_head_dim=512)
    res = {False: [], True: []}
    errs = {}
    for rep in range(4):
        for pc in (False, True):
            g.PAD_COPY = pc
            us, errs[pc] = timed(pr, args, addr, ws, ref)
            res[pc].append(us)
    g.PAD_COPY = True
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    print(f"mla:{heads} T={t} {tree} {prefix // 1000}k page={page} read {fl:.1f}us | zeros {med[False]:.1f}us "
          f"{fl / med[False]:.0%} err {errs[False]:.1e} {[round(x, 1) for x in res[False]]} | copies {med[True]:.1f}us "
          f"{fl / med[True]:.0%} err {errs[True]:.1e} {[round(x, 1) for x in res[True]]} | {med[True] / med[False] - 1:+.1%}",
          flush=True)

print("data test: mla:8 T=16 185k page 1, 128 real rows; q of tokens >= 9 random vs zero", flush=True)
pr, args, addr, ws, fl = setup(8, 16, 185000, 1)
ref = verify_attention_reference(**args, **addr, v_head_dim=512)
us_r, e_r = timed(pr, args, addr, ws, ref)
args["q"][:, 9:] = 0
ref = verify_attention_reference(**args, **addr, v_head_dim=512)
us_z, e_z = timed(pr, args, addr, ws, ref)
us_r2, _ = timed(pr, args, addr, ws, ref)
print(f"random {us_r:.1f}us (err {e_r:.1e}) | tokens>=9 zero {us_z:.1f}us (err {e_z:.1e}), again {us_r2:.1f}us", flush=True)

print("bounds: one m-block's programs at P = 65 (what a 72-row call split into a 64-row and an 8-row m-block gives each)",
      flush=True)
for heads, t in ((8, 8), (8, 1), (16, 1)):
    pr, args, addr, ws, fl = setup(heads, t, 185000, 1)
    ref = verify_attention_reference(**args, **addr, v_head_dim=512)
    _, p0 = verify_launch_params(**args, **addr, out=pr.new_out(), workspace=ws)
    line = []
    for p in (p0, 65, 66):
        us, err = timed(pr, args, addr, ws, ref, num_splits=p)
        line.append(f"P={p} {us:.1f}us err {err:.1e}")
    print(f"mla:{heads} T={t} 185k page 1 read {fl:.1f}us: " + " | ".join(line), flush=True)
