"""Issue 31, session 15 (H200): REMAINDER_BESIDE A/B in one process: batch-1 MLA calls whose last 64-row m-block
holds <= 32 real rows, their full m-blocks on the 64-row Gluon kernel and the rest on the narrow kernel beside it
(on) against one more padded 64-row m-block (off). Each arm a CUDA graph of the whole call (clean L2 flush),
medians of 3 interleaved rounds; both arms checked against the fp32 reference, each arm on a workspace of its own poisoned with NaN.
Ran (run 18) before remainder_beside took the page size: then every page size ran the remainder beside; since, only
page 1 does (this run's page-64 rows are why), so a re-run's page-64 "beside" arm is the padded path."""
import statistics

import torch

from specsweep_kernels import verify_attention as va
from specsweep_kernels import verify_mla_sm90 as g
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost

reader = ReadStream(800 << 20)
shapes = [(8, t, n, p, tree) for n in (65536, 185000, 262144) for p in (1, 64) for t, tree in
          ((9, "random"), (12, "random"), (17, "random"))]
shapes += [(16, t, n, 1, tree) for n in (65536, 185000) for t, tree in ((5, "chain"), (9, "random"), (17, "random"))]
for heads, t, n, page, tree in shapes:
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[n], num_tokens=t, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree=tree, seed=n + 7 * t + page)
    args, addr = pr.attention_args(), pr.table_args()
    ref = verify_attention_reference(**args, **addr, v_head_dim=512)
    fns, errs = {}, {}
    for on in (True, False):
        out = pr.new_out()
        ws = va.allocate_workspace(max_batch=1, max_tokens=t, num_q_heads=heads, v_head_dim=512, device="cuda")
        ws.part_out.fill_(float("nan"))  # its own workspace: no partial of the other arm can stand in

        def fn(on=on, out=out, ws=ws):
            g.REMAINDER_BESIDE = on
            va.verify_attention(**args, **addr, out=out, workspace=ws)
        fn()
        torch.cuda.synchronize()
        errs[on] = _rel_err(out, ref)
        fns[on] = fn
    times = {True: [], False: []}
    for _ in range(3):
        for on, fn in fns.items():
            g.REMAINDER_BESIDE = on
            times[on].append(graph_us(fn)[0])
    nb = verify_cost(layout=layout, prefix_len=n, num_tokens=t, page_size=page)[0]
    fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    g.REMAINDER_BESIDE = True
    print(f"ROW mla:{heads} {n // 1000}k T={t} {tree} page {page} rows {t * heads} rest "
          f"{g.remainder_beside(t, heads, 1, 1)}: read {fl:.1f} | beside {on:.1f} ({fl / on:.0%}, err {errs[True]:.1e}) "
          f"| padded {off:.1f} ({fl / off:.0%}, err {errs[False]:.1e}) | {on / off - 1:+.1%}", flush=True)
