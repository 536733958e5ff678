"""Issue 31, session 14 (H200 as the sm_120 stand-in): the portable kernel with Q re-loaded every tile (from L1 /
L2) instead of held in registers across the loop, A/B in one process against the shipped kernel. Run 12 found
every portable MLA tile under 99 KB spilling (16x64 4 warps: 255 registers + 106 spilled; sm_120: a 1672-byte
stack) or, spill-free with 8 warps, 1.2-2.5x slower: with mma.sync each warp holds the whole [16, 576] Q operand
(144 registers) for the whole loop. The variant (text replacement of verify_triton.py, /tmp/qvar): _load_q
returns row pointers (rows past T clamped to a real row; their outputs are never stored), _prefix_tile and
_new_tokens_tile load Q where they use it (a tile-dependent zero offset keeps the load inside the loop).

    python exp_qreload.py warm I/N
    python exp_qreload.py time
"""
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
import triton
import specsweep_kernels.verify_targets as vtg
from specsweep_kernels import verify_attention as va
from specsweep_kernels import verify_triton as vt
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention
from specsweep_kernels.verify_config import VerifyConfig as C

REPS = [("""    q_row = q_ptr + b * stride_qb + offs_t[:, None] * stride_qt + offs_h[:, None] * stride_qh
    q = tl.load(q_row + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    if BLOCK_DPE > 0:
        q_pe = tl.load(q_row + offs_dpe[None, :], mask=mask_m[:, None], other=0.0)
""", """    q_row = (q_ptr + b * stride_qb + tl.where(mask_m, offs_t, 0)[:, None] * stride_qt
             + tl.where(mask_m, offs_h, 0)[:, None] * stride_qh)
    q = q_row + offs_d[None, :]
    if BLOCK_DPE > 0:
        q_pe = q_row + offs_dpe[None, :]
"""), ("""    are out (the last, partial tile); otherwise no bounds work at all.\"\"\"
""", """    are out (the last, partial tile); otherwise no bounds work at all.\"\"\"
    bump = tl.where(start_n < 0, 1, 0)
    q = tl.load(q + bump)
    if BLOCK_DPE > 0:
        q_pe = tl.load(q_pe + bump)
"""), ("""    \"\"\"Request b's T new tokens: the T x T block under the tree mask, one tile. Returns (m_i, l_i, acc).\"\"\"
""", """    \"\"\"Request b's T new tokens: the T x T block under the tree mask, one tile. Returns (m_i, l_i, acc).\"\"\"
    q = tl.load(q)
    if BLOCK_DPE > 0:
        q_pe = tl.load(q_pe)
""")]
VAR_DIR = pathlib.Path("/tmp/qvar")


def variant(name, reps):
    src = pathlib.Path(vt.__file__).read_text()
    for old, new in reps:
        assert src.count(old) == 1, old[:60]
        src = src.replace(old, new)
    VAR_DIR.mkdir(exist_ok=True)
    path = VAR_DIR / f"verify_triton_{name}.py"
    if not path.exists() or path.read_text() != src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"qvar_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


MODS = {"full": vt, "qreload": variant("qreload", REPS)}
CONFIGS = [C(16, 64, 4, 2), C(16, 32, 4, 3), C(32, 32, 4, 2), C(32, 32, 8, 2), C(64, 16, 8, 2)]
SHAPES = [(8, 1, "chain"), (16, 1, "chain"), (8, 4, "chain"), (16, 4, "chain"), (8, 9, "random"), (8, 16, "chain")]
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def sm120(mod, cfg, heads, t):
    last = {}
    orig, orig_k = vtg.triton.compile, vtg._verify_attention_kernel

    def keep(*a, **k):
        last["c"] = orig(*a, **k)
        return last["c"]
    vtg.triton.compile, vtg._verify_attention_kernel = keep, mod._verify_attention_kernel
    try:
        info = vtg.compile_for_target(capability=(12, 0), dk=576, dv=512, v_is_k=True, group=heads, num_tokens=t,
                                      config=cfg)
    except Exception as exc:  # noqa: BLE001
        return f"sm_120 {type(exc).__name__} {str(exc)[:80]}"
    finally:
        vtg.triton.compile, vtg._verify_attention_kernel = orig, orig_k
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(last["c"].asm["cubin"])
    res = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    line = next((x for x in res.splitlines() if "REG:" in x), "")
    regs = line.split("REG:")[1].split()[0] if line else "?"
    stack = line.split("STACK:")[1].split()[0] if "STACK:" in line else "?"
    return f"sm_120 smem {info.shared / 1024:.0f}K regs {regs} stack {stack}B{' WGMMA' if info.wgmma else ''}"


def problem(heads, t, tree, prefix):
    layout = bench_layout(f"mla:{heads}")
    pr = make_problem(layout=layout, prefix_lens=[prefix], num_tokens=t, page_size=1, dtype=torch.bfloat16,
                      device="cuda", tree=tree, seed=prefix + 7 * t + 1)
    ws = allocate_workspace(max_batch=1, max_tokens=t, num_q_heads=heads, v_head_dim=512, device="cuda")
    return layout, pr, ws


def main():
    if sys.argv[1] == "warm":
        i, n = (int(x) for x in sys.argv[2].split("/"))
        jobs = [(s, c, m) for s in SHAPES for c in CONFIGS for m in MODS][i::n]
        for (heads, t, tree), cfg, m in jobs:
            va._verify_attention_kernel = MODS[m]._verify_attention_kernel
            layout, pr, ws = problem(heads, t, tree, 4096)
            try:
                verify_attention(**pr.attention_args(), **pr.table_args(), out=pr.new_out(), workspace=ws,
                                 impl="triton", config=cfg)
            except Exception as exc:  # noqa: BLE001
                print("warm", heads, t, cfg, m, type(exc).__name__, str(exc)[:200], flush=True)
            if (heads, t) == (8, 4):
                print(f"SM120 {m} m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}: "
                      f"{sm120(MODS[m], cfg, heads, t)}", flush=True)
        torch.cuda.synchronize()
        return
    reader = ReadStream(300 << 20)
    for heads, t, tree in SHAPES:
        layout, pr, ws = problem(heads, t, tree, 185000)
        args, addr = pr.attention_args(), pr.table_args()
        ref = verify_attention_reference(**args, **addr, v_head_dim=512)
        nb, flops, _ = verify_cost(layout=layout, prefix_len=185000, num_tokens=t, page_size=1)
        fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
        keys = [(c, m) for c in CONFIGS for m in MODS]
        res, info = {k: [] for k in keys}, {}
        for _rep in range(2):
            for cfg, m in keys:
                va._verify_attention_kernel = MODS[m]._verify_attention_kernel
                out = pr.new_out()
                run = lambda: verify_attention(**args, **addr, out=out, workspace=ws, impl="triton", config=cfg)  # noqa
                try:
                    run()
                except Exception as exc:  # noqa: BLE001
                    info[(cfg, m)] = f"{type(exc).__name__}"
                    continue
                c = va._last_compiled
                info[(cfg, m)] = f"r{c.n_regs}/s{c.n_spills} err {_rel_err(out, ref):.1e}"
                res[(cfg, m)].append(graph_us(run)[0])
        va._verify_attention_kernel = vt._verify_attention_kernel
        print(f"mla:{heads} T={t} {tree} rows={heads * t} read {fl:.1f}us", flush=True)
        for cfg, m in keys:
            best = min(res[(cfg, m)]) if res[(cfg, m)] else float("nan")
            print(f"  m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} {m:8s}: {best:.1f}us {fl / best:.0%} "
                  f"{[round(x, 1) for x in res[(cfg, m)]]} {info.get((cfg, m), '')}", flush=True)


if __name__ == "__main__":
    main()
