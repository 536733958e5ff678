"""Kernel jobs: one verify-kernel benchmark shape per grid point (`job: kernel`), run by the orchestrator like
any sweep: Hydra grid -> typed config (`kernel:` section + top-level `page_size`) -> validation -> plan (one
group per device, so a GPU is never shared) -> a Ray actor per group running each shape in a subprocess ->
one MLflow child run per shape.

    python -m orchestrator +sweep=verify_kernel                       # the GPU grid (engine.device=cuda)
    python -m workers.kernel_job [conf/sweep/verify_kernel.yaml] [overrides...]   # the same; small CPU grid
                                                                      # through the interpreter without a GPU
    python -m workers.kernel_job --one '<KernelSpec json>'            # one shape; prints one JSON line

Per shape: a fresh random problem (specsweep_kernels.problems, pages on a random permutation), the kernel's output against
the fp32 reference (`rel_err`), its time (`time_us`: on CUDA the median of CUDA-graph replays, as the engine runs
it; on CPU the median wall time of the Triton interpreter, TRITON_INTERPRET=1, small shapes only), `gbs` = unique
prefix KV bytes / time, and on CUDA `floor_frac` = floor / time with the floor from the node's measured ceilings
(specsweep_kernels.roofline, cached per GPU).

`--one` runs in its own process because TRITON_INTERPRET must be set before triton is imported
(`workers.kernel_runner.KernelRunner` sets it for device=cpu).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

INTERPRET_ENV = "TRITON_INTERPRET"
# Without a GPU the standalone command runs this small grid through the interpreter.
CPU_OVERRIDES = ("engine.device=cpu", "kernel.layout=gqa-small", "kernel.dtype=float32", "kernel.prefix=40,300",
                 "kernel.tokens=1,8", "page_size=1,16")


def _time_us(fn, device) -> float:
    """Median µs: CUDA-graph replays on a GPU (specsweep_kernel_bench.bench's timing), wall clock on the CPU
    interpreter."""
    if device.type == "cuda":
        from specsweep_kernel_bench.bench import graph_us

        us, mode = graph_us(fn)
        if mode != "graph":
            logger.warning("kernel timed without a CUDA graph: %s", mode)
        return us
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def run_shape(spec) -> tuple[dict[str, float], str]:
    """One shape (a specsweep_common.spec.KernelSpec) on its device: (metrics time_us, gbs, rel_err, kv_bytes
    (+ floor_frac, peak_bw_gbs on CUDA), the attention kernel that ran: "gluon" or "triton")."""
    import torch

    from specsweep_kernels.problems import Layout, make_problem
    from specsweep_kernels.reference import verify_attention_reference
    from specsweep_kernels.roofline import verify_cost
    from specsweep_kernels.verify_attention import allocate_workspace, verify_attention, verify_kernel

    device = torch.device(spec.device)
    dtype = getattr(torch, spec.dtype)
    layout = Layout(spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.v_head_dim, spec.mla)
    problem = make_problem(layout=layout, prefix_lens=[spec.prefix], num_tokens=spec.tokens,
                           page_size=spec.page_size, dtype=dtype, device=device, tree="random", seed=spec.seed)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=1, max_tokens=spec.tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device=device)
    out = problem.new_out()
    ref = verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim)
    verify_attention(**args, **addressing, out=out, workspace=ws)  # compiles; the checked output
    rel_err = math.inf if out.isnan().any() else ((out.float() - ref).norm() / ref.norm()).item()
    t_us = _time_us(lambda: verify_attention(**args, **addressing, out=out, workspace=ws), device)
    elt = torch.empty((), dtype=dtype).element_size()
    nbytes, flops, kv_bytes = verify_cost(layout=layout, prefix_len=spec.prefix, num_tokens=spec.tokens,
                                          elt=elt, page_size=spec.page_size)
    m = {"time_us": t_us, "gbs": kv_bytes / (t_us * 1e-6) / 1e9, "rel_err": rel_err, "kv_bytes": float(kv_bytes)}
    if device.type == "cuda":
        from specsweep_kernels.roofline import floor_seconds, load_or_measure_ceilings

        c = load_or_measure_ceilings(device)
        m["floor_frac"] = floor_seconds(nbytes=nbytes, flops=flops, ceilings=c) * 1e6 / t_us
        m["peak_bw_gbs"] = c.copy_gbps
    return m, verify_kernel(**args, out=out)


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return "cpu (triton interpreter)" if os.environ.get(INTERPRET_ENV) == "1" else "cpu"


def one(spec_json: str) -> dict:
    """`--one`: {"metrics": {...}, "device": name, "kernel": "gluon" | "triton"}."""
    from specsweep_common.spec import KernelSpec

    spec = KernelSpec.from_json(spec_json)
    if spec.device == "cpu" and os.environ.get(INTERPRET_ENV) != "1":
        raise RuntimeError(f"device=cpu needs {INTERPRET_ENV}=1 set before triton is imported")
    metrics, kernel = run_shape(spec)
    return {"metrics": metrics, "device": device_name(spec.device), "kernel": kernel}


def standalone_argv(argv: list[str], cuda: bool) -> list[str]:
    """`[SWEEP.yaml] [overrides...]` -> the orchestrator command line (the same path as `+sweep=NAME`)."""
    sweep = "verify_kernel"
    if argv and argv[0].endswith((".yaml", ".yml")):
        sweep, argv = Path(argv[0]).stem, argv[1:]
    return [sys.executable, "-m", "orchestrator", f"+sweep={sweep}", *(() if cuda else CPU_OVERRIDES), *argv]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--one"]:
        p = argparse.ArgumentParser(description="one verify-kernel shape; prints one JSON line")
        p.add_argument("--one", required=True, help="a KernelSpec as JSON")
        a = p.parse_args(argv)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
        print(json.dumps(one(a.one)), flush=True)  # non-finite values as Infinity/NaN: read by json.loads
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch

    cmd = standalone_argv(argv, torch.cuda.is_available())
    logger.info("running %s", " ".join(cmd[1:]))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
