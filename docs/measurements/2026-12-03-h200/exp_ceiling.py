"""Issue 31, session 14 (H200): what the kernels' loops cost, part by part, so that the ceiling of a loop that hides
the softmax under the matrix products (FA3's ping-pong) is measured, not guessed.

Variants are made from the shipped source by text replacement (written to /tmp/mlavar, imported as modules):
- full:     the kernel as shipped
- nosmx:    the online softmax's max / exp2 / rescale replaced by p = s * scale (no max, no exp2, alpha = 1): the
            time of the loop if the softmax were free (what perfect overlap could give at best)
- nosnope:  S = Q_pe K_pe^T only (the 512-dim S product left out: ~47% of the FLOPs)
- both:     nosmx + nosnope
The variants' outputs are wrong by construction; only `full` is checked against the fp32 reference.
Portable (Triton) kernel: full / nosmx on the tile the picker gives under sm_120's 99 KB.

    python exp_ceiling.py warm I/N    # compile shard I of N (short prefixes), time nothing
    python exp_ceiling.py time        # A/B/C/D x 2 in one process, medians of graph replays after a clean L2 flush
"""
import importlib.util
import os
import pathlib
import sys

import torch
from specsweep_kernels import verify_attention as va
from specsweep_kernels import verify_mla_sm90 as g
from specsweep_kernels import verify_triton as vt
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.bench_workload import portable_config
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention
from specsweep_kernels.verify_targets import SM120

G_SMX = ("""    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
""", """    m_new = m_i
    alpha = m_i * 0.0 + 1.0
    p = s * qk_scale
""")
G_SNOPE = [(f"""            s_tok = warpgroup_mma(q_nope, k_nope.index({i}).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q_pe, k_pe.index({i}).permute((1, 0)), s_tok, is_async=True)
""", f"""            s_tok = warpgroup_mma(q_pe, k_pe.index({i}).permute((1, 0)), s_zero, use_acc=False, is_async=True)
""") for i in (0, 1)]
T_SMX = ("""    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # qk_scale > 0: max commutes with the scaling
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
""", """    m_new = m_i
    alpha = m_i * 0.0 + 1.0
    p = qk * qk_scale
""")
G_VARIANTS = {"full": [], "nosmx": [G_SMX], "nosnope": G_SNOPE, "both": [G_SMX] + G_SNOPE}
T_VARIANTS = {"full": [], "nosmx": [T_SMX]}
VAR_DIR = pathlib.Path("/tmp/mlavar")


def variant(module, name: str, reps) -> object:
    src = pathlib.Path(module.__file__).read_text()
    for old, new in reps:
        assert src.count(old) == 1, (name, old[:60])
        src = src.replace(old, new)
    VAR_DIR.mkdir(exist_ok=True)
    path = VAR_DIR / f"{module.__name__.rsplit('.', 1)[1]}_{name}.py"
    if not path.exists() or path.read_text() != src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)  # atomic: the warm shards build the same files at once
    spec = importlib.util.spec_from_file_location(f"var_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


GLUON = {k: variant(g, k, v) for k, v in G_VARIANTS.items()}
TRITON = {k: variant(vt, k, v) for k, v in T_VARIANTS.items()}
# (impl, heads, T, prefix, page, tree)
SHAPES = [("gluon", 8, 8, 185000, 1, "chain"), ("gluon", 8, 9, 185000, 1, "random"), ("gluon", 8, 16, 185000, 1, "chain"),
          ("gluon", 8, 17, 185000, 1, "random"), ("gluon", 16, 4, 185000, 1, "chain"), ("gluon", 128, 4, 131072, 1, "chain"),
          ("triton", 8, 1, 185000, 1, "chain"), ("triton", 8, 4, 185000, 1, "chain"), ("triton", 8, 9, 185000, 1, "random")]


def setup(impl, heads, t, prefix, page, tree):
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[prefix], num_tokens=t, page_size=page, dtype=torch.bfloat16,
                      device="cuda", tree=tree, seed=prefix + 7 * t + page)
    ws = allocate_workspace(max_batch=1, max_tokens=t, num_q_heads=heads, v_head_dim=512, device="cuda")
    config = portable_config(layout, t, SM120.smem_per_block) if impl == "triton" else None
    return layout, pr, ws, config


def use(impl, mod):
    if impl == "gluon":
        va._gluon_mla = lambda: mod
    else:
        va._verify_attention_kernel = mod._verify_attention_kernel


def main():
    mode = sys.argv[1]
    shapes = SHAPES
    if mode == "warm":
        i, n = (int(x) for x in sys.argv[2].split("/"))
        jobs = [(s, v) for s in SHAPES for v in (G_VARIANTS if s[0] == "gluon" else T_VARIANTS)][i::n]
        for (impl, heads, t, prefix, page, tree), v in jobs:
            layout, pr, ws, config = setup(impl, heads, t, 4096, page, tree)
            use(impl, (GLUON if impl == "gluon" else TRITON)[v])
            out = pr.new_out()
            verify_attention(**pr.attention_args(), **pr.table_args(), out=out, workspace=ws,
                             impl="auto" if impl == "gluon" else "triton", config=config)
            torch.cuda.synchronize()
        return
    reader = ReadStream(400 << 20)
    for impl, heads, t, prefix, page, tree in shapes:
        layout, pr, ws, config = setup(impl, heads, t, prefix, page, tree)
        args, addr = pr.attention_args(), pr.table_args()
        ref = verify_attention_reference(**args, **addr, v_head_dim=512)
        nb, flops, _ = verify_cost(layout=layout, prefix_len=prefix, num_tokens=t, page_size=page)
        fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
        mods = GLUON if impl == "gluon" else TRITON
        res, info = {k: [] for k in mods}, {}
        err = None
        for _rep in range(2):
            for name, mod in mods.items():
                use(impl, mod)
                out = pr.new_out()
                run = lambda: verify_attention(**args, **addr, out=out, workspace=ws,  # noqa: E731,B023
                                               impl="auto" if impl == "gluon" else "triton", config=config)
                run()
                c = va._last_compiled
                info[name] = f"r{c.n_regs}/s{c.n_spills}"
                if name == "full":
                    err = _rel_err(out, ref)
                res[name].append(graph_us(run)[0])
        use(impl, GLUON["full"] if impl == "gluon" else TRITON["full"])
        med = {k: min(v) for k, v in res.items()}
        cfg = "" if config is None else f" tile m{config.block_m} n{config.block_n} w{config.num_warps} s{config.num_stages}"
        print(f"{impl}{cfg} mla:{heads} T={t} {tree} {prefix // 1000}k page={page} rows={heads * t} read {fl:.1f}us "
              f"(flops {flops / 1e9:.1f} G) err(full) {err:.1e} | "
              + " | ".join(f"{k} {med[k]:.1f}us {fl / med[k]:.0%} {info[k]} {[round(x, 1) for x in res[k]]}"
                           for k in mods), flush=True)


if __name__ == "__main__":
    main()
