"""Issue 31, session 14 (H200 as the sm_120 stand-in): portable-kernel (impl="triton") tiles for MLA that fit
sm_120's 99 KB a block, with the registers / spills of each. The 99 KB choice of sessions 12-13, (16, 64, 4, 2),
compiles to 255 registers and ~106 spilled on the H200 (run 11) and to 255 registers with a 1592-byte stack for
sm_120 (a local compile, Triton 3.9). Each tile is compiled for sm_120 here as well (shared memory, stack), then
timed on the H200 (two passes, CUDA-graph medians after a clean L2 flush) against the fp32 reference.

    python exp_portable.py warm I/N    # compile shard I of N (short prefixes) + the sm_120 compiles, time nothing
    python exp_portable.py time
"""
import os
import subprocess
import sys
import tempfile

import torch
import triton
import specsweep_kernels.verify_targets as vtg
from specsweep_kernels import verify_attention as va
from specsweep_kernels.bench import _rel_err, bench_layout, graph_us
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, verify_cost
from specsweep_kernels.verify_attention import allocate_workspace, verify_attention
from specsweep_kernels.verify_config import VerifyConfig as C

CONFIGS = [C(16, 64, 4, 2), C(16, 64, 8, 2), C(16, 32, 4, 2), C(16, 32, 4, 3), C(16, 32, 8, 2), C(16, 32, 8, 3),
           C(32, 32, 8, 2), C(32, 16, 8, 3), C(64, 16, 8, 2)]
SHAPES = [(8, 1, "chain"), (16, 1, "chain"), (8, 4, "chain"), (16, 4, "chain"), (8, 9, "random"), (8, 16, "chain")]
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def sm120(cfg, heads, t):
    """Shared memory and stack of the tile compiled for sm_120 (no GPU used)."""
    last = {}
    orig = vtg.triton.compile

    def keep(*a, **k):
        last["c"] = orig(*a, **k)
        return last["c"]
    vtg.triton.compile = keep
    try:
        info = vtg.compile_for_target(capability=(12, 0), dk=576, dv=512, v_is_k=True, group=heads, num_tokens=t,
                                      config=cfg)
    except Exception as exc:  # noqa: BLE001
        return f"sm_120 {type(exc).__name__}"
    finally:
        vtg.triton.compile = orig
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
        jobs = [(s, c) for s in SHAPES for c in CONFIGS][i::n]
        for (heads, t, tree), cfg in jobs:
            layout, pr, ws = problem(heads, t, tree, 4096)
            try:
                verify_attention(**pr.attention_args(), **pr.table_args(), out=pr.new_out(), workspace=ws,
                                 impl="triton", config=cfg)
            except Exception as exc:  # noqa: BLE001
                print("warm", heads, t, cfg, type(exc).__name__, flush=True)
            if (heads, t) == (8, 4):
                print(f"SM120 m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}: {sm120(cfg, heads, t)}",
                      flush=True)
        torch.cuda.synchronize()
        return
    reader = ReadStream(300 << 20)
    for heads, t, tree in SHAPES:
        layout, pr, ws = problem(heads, t, tree, 185000)
        args, addr = pr.attention_args(), pr.table_args()
        ref = verify_attention_reference(**args, **addr, v_head_dim=512)
        nb, flops, _ = verify_cost(layout=layout, prefix_len=185000, num_tokens=t, page_size=1)
        fl = min(graph_us(reader.fn(int(nb), k))[0] for k in reader.program_counts)
        res, info = {c: [] for c in CONFIGS}, {}
        for _rep in range(2):
            for cfg in CONFIGS:
                out = pr.new_out()
                run = lambda: verify_attention(**args, **addr, out=out, workspace=ws, impl="triton", config=cfg)  # noqa
                try:
                    run()
                except Exception as exc:  # noqa: BLE001
                    info[cfg] = f"{type(exc).__name__}"
                    continue
                c = va._last_compiled
                info[cfg] = f"r{c.n_regs}/s{c.n_spills} smem {c.metadata.shared // 1024}K err {_rel_err(out, ref):.1e}"
                res[cfg].append(graph_us(run)[0])
        print(f"mla:{heads} T={t} {tree} rows={heads * t} read {fl:.1f}us", flush=True)
        for cfg in CONFIGS:
            best = min(res[cfg]) if res[cfg] else float("nan")
            print(f"  m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}: {best:.1f}us {fl / best:.0%} "
                  f"{[round(x, 1) for x in res[cfg]]} {info.get(cfg, '')}", flush=True)


if __name__ == "__main__":
    main()
