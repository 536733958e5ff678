"""Issue 31, session 15 (H200): the fixed costs around a batched MLA call (goal 3), A/B in one process.
Arms, each timed as one CUDA graph of the whole call (clean L2 flush), three rounds interleaved, medians:
  base      as on main: the call plans itself, attention launched after the plan drained, merge tiles of the rule
  planpdl   the attention kernel launched as the plan kernel's programmatic dependent (PLAN_PDL)
  given     the plan made outside the timed call (a step's plan shared by the layers, as the SGLang plugin runs)
  dv/2 dv/4 warps8 warps2   merge variants (on top of planpdl): the rule's Dv block halved / quartered, 8 / 2 warps
and the merge alone (one graph of just the merge launch after a call, partials hot in L2) per merge variant.
Every arm's output is checked against the fp32 reference (relative error) and against base's (max |diff|)."""
import statistics
import sys

import torch
import triton

from specsweep_kernels import verify_attention as va
from specsweep_kernels import verify_merge as vm
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us, ragged_mixes
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost

MERGE = {"dv": 1, "warps": 4}
real_tiles = vm.merge_tiles


def tiles(**kw):
    sc, dv = real_tiles(**kw)
    return sc, max(16, dv // MERGE["dv"])


def launch_merge(workspace, out, kv_indptr, prefix_lens, *, num_splits, block_n, use_indptr, single, pdl):
    batch, num_tokens, num_q_heads, dv = out.shape
    po, pl = workspace.part_out, workspace.part_lse
    block_sc, block_dv = tiles(dv=dv, num_splits=num_splits, batch=batch)
    vm._verify_merge_kernel[(batch * num_tokens * num_q_heads, triton.cdiv(dv, block_dv))](
        po, pl, out, kv_indptr, prefix_lens, workspace.req, batch, num_splits,
        po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        T=num_tokens, NUM_Q_HEADS=num_q_heads, BLOCK_N=block_n, BLOCK_DV=block_dv, BLOCK_SC=block_sc,
        USE_INDPTR=use_indptr, SINGLE_REQUEST=single, PDL=pdl, num_warps=MERGE["warps"],
        **({"launch_pdl": True} if pdl else {}))


vm._launch_merge = launch_merge
ARMS = {  # name: (PLAN_PDL, plan given, merge dv divisor, merge warps)
    "base": (False, False, 1, 4), "planpdl": (True, False, 1, 4), "given": (False, True, 1, 4),
    "dv/2": (True, False, 2, 4), "dv/4": (True, False, 4, 4), "warps8": (True, False, 1, 8),
    "warps2": (True, False, 2, 2),
}
reader = ReadStream(800 << 20)
rows = []
for heads in (8, 16):
    for mix, lens in ragged_mixes("1024/65536/3/200000,16r,64r"):
        for t in (4, 16):
            rows.append((heads, mix, lens, t, 16))
rows += [(16, "128k", [131072], 1, 1), (128, "128k", [131072], 1, 1), (8, "185k", [185000], 9, 1),
         (64, "32k", [32768], 4, 64)]
if len(sys.argv) > 1:
    rows = rows[int(sys.argv[1]):int(sys.argv[2])]
for heads, mix, lens, t, page in rows:
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=lens, num_tokens=t, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree="random" if t == 9 else "chain", seed=sum(lens) + 7 * t + page)
    ws = va.allocate_workspace(max_batch=len(lens), max_tokens=t, num_q_heads=heads, v_head_dim=512,
                                          device="cuda")
    args, addr = pr.attention_args(), pr.table_args()
    ref = verify_attention_reference(**args, **addr, v_head_dim=512)
    cfg, splits = va.verify_launch_params(**args, **addr, out=pr.new_out(), workspace=ws)
    fns, outs = {}, {}
    for name, (plan_pdl, given, dv_div, warps) in ARMS.items():
        if given and len(lens) == 1:
            continue
        out = pr.new_out()
        outs[name] = out
        plan = va.plan_verify(workspace=ws, block_n=cfg.block_n, num_splits=splits, prefix_lens=pr.lens) \
            if given else None

        def run(plan_pdl=plan_pdl, dv_div=dv_div, warps=warps, out=out, plan=plan):
            va.PLAN_PDL = plan_pdl
            MERGE["dv"], MERGE["warps"] = dv_div, warps
            va.verify_attention(**args, **addr, out=out, workspace=ws, plan=plan)
        run()
        torch.cuda.synchronize()
        fns[name] = run
    times = {name: [] for name in fns}
    merge_alone = {}
    for rnd in range(3):
        for name, fn in fns.items():
            va.PLAN_PDL = ARMS[name][0]
            MERGE["dv"], MERGE["warps"] = ARMS[name][2], ARMS[name][3]
            times[name].append(graph_us(fn)[0])
    for name in fns:
        if name in ("planpdl", "dv/2", "dv/4", "warps8", "warps2"):
            MERGE["dv"], MERGE["warps"] = ARMS[name][2], ARMS[name][3]
            fns[name]()
            torch.cuda.synchronize()
            single = len(lens) == 1
            merge_alone[name] = graph_us(lambda: launch_merge(ws, outs[name], pr.lens, pr.lens, num_splits=splits, block_n=cfg.block_n,
                                                              use_indptr=False, single=single,
                                                              pdl=False))[0]
    nb = sum(verify_cost(layout=layout, prefix_len=n, num_tokens=t, page_size=page)[0] for n in lens)
    fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
    base = statistics.median(times["base"])
    cells = []
    for name in fns:
        med = statistics.median(times[name])
        err = _rel_err(outs[name], ref)
        diff = (outs[name].float() - outs["base"].float()).abs().max().item()
        ma = f" merge {merge_alone[name]:.1f}" if name in merge_alone else ""
        cells.append(f"{name} {med:.1f} ({fl / med:.0%}, {med / base - 1:+.1%}, err {err:.1e}, d {diff:.0e}{ma})")
    print(f"ROW mla:{heads} {mix} T={t} page {page} P={splits} read {fl:.1f} | " + " | ".join(cells), flush=True)
