"""Kernel jobs: the verify-kernel benchmark grid (layout x prefix x T x page size) as a sweep landing in MLflow,
one child run per shape under one parent run per invocation, in the sweep's experiment.

    python -m workers.kernel_job conf/sweep/verify_kernel.yaml [--tracking-uri sqlite:///mlflow.db]

Per shape: a fresh random problem (kernels.problems, pages on a random permutation), the kernel's output against
the fp32 reference (`rel_err`), its time (`time_us`: on CUDA the median of CUDA-graph replays, as the engine runs
it; on CPU the median wall time of the Triton interpreter, TRITON_INTERPRET=1, small shapes only), `gbs` = unique
prefix KV bytes / time, and on CUDA `floor_frac` = floor / time with the floor from the node's measured ceilings
(kernels.roofline, cached per GPU). A shape that fails is a FAILED child with the error as its message.

The sweep file (conf/sweep/verify_kernel.yaml) carries `job: kernel`, `sweep_name`, `dtype` and a `grid` of lists
(`layout`, `prefix`, `tokens`, `page_size`); `cpu_grid` replaces `grid` without a GPU.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

logger = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class KernelShape:
    layout: str  # "gqa" (32 q / 8 kv heads, d 128) | "mla" (16 heads, 512 + 64) | "gqa-small" (8/2, d 32)
    prefix: int
    tokens: int
    page_size: int

    @property
    def name(self) -> str:
        return f"layout={self.layout} prefix={self.prefix} T={self.tokens} page={self.page_size}"

    def params(self) -> dict[str, str]:
        return {"layout": self.layout, "prefix": str(self.prefix), "tokens": str(self.tokens),
                "page_size": str(self.page_size)}


def _layouts():
    from kernels.problems import GQA_32_8, MLA_16, Layout

    return {"gqa": GQA_32_8, "mla": MLA_16, "gqa-small": Layout(8, 2, 32, 32, False)}


def expand_grid(grid: dict[str, list]) -> list[KernelShape]:
    keys = ("layout", "prefix", "tokens", "page_size")
    missing = [k for k in keys if k not in grid]
    if missing:
        raise ValueError(f"kernel grid lacks {missing}")
    return [KernelShape(*point) for point in itertools.product(*(list(grid[k]) for k in keys))]


def _time_us(fn, device: torch.device) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        torch.cuda.synchronize()
        return do_bench(graph.replay, warmup=25, rep=100, return_mode="median") * 1e3
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def run_shape(shape: KernelShape, *, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, float]:
    from kernels.problems import make_problem
    from kernels.reference import verify_attention_reference
    from kernels.roofline import verify_cost
    from kernels.verify_attention import allocate_workspace, verify_attention

    layout = _layouts()[shape.layout]
    problem = make_problem(layout=layout, prefix_lens=[shape.prefix], num_tokens=shape.tokens,
                           page_size=shape.page_size, dtype=dtype, device=device, tree="random", seed=seed)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=1, max_tokens=shape.tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device=device)
    out = problem.new_out()
    ref = verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim)
    verify_attention(**args, **addressing, out=out, workspace=ws)  # compiles; the checked output
    rel_err = math.inf if out.isnan().any() else ((out.float() - ref).norm() / ref.norm()).item()
    t_us = _time_us(lambda: verify_attention(**args, **addressing, out=out, workspace=ws), device)
    elt = torch.empty((), dtype=dtype).element_size()
    nbytes, flops, kv_bytes = verify_cost(layout=layout, prefix_len=shape.prefix, num_tokens=shape.tokens,
                                          elt=elt, page_size=shape.page_size)
    m = {"time_us": t_us, "gbs": kv_bytes / (t_us * 1e-6) / 1e9, "rel_err": rel_err,
         "kv_bytes": kv_bytes}
    if device.type == "cuda":
        from kernels.roofline import floor_seconds, load_or_measure_ceilings

        c = load_or_measure_ceilings(device)
        m["floor_frac"] = floor_seconds(nbytes=nbytes, flops=flops, ceilings=c) * 1e6 / t_us
        m["peak_bw_gbs"] = c.copy_gbps
    return m


def run_kernel_sweep(conf: dict[str, Any], tracker=None, *, device: torch.device | None = None) -> list[dict]:
    """Every shape of the sweep's grid; each result as a child run of one parent when `tracker` is given
    (an orchestrator.tracking.Tracker). Returns [{shape, state, metrics, message}]."""
    if conf.get("job", "kernel") != "kernel":
        raise ValueError(f"not a kernel job: job={conf.get('job')!r}")
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grid = conf["grid"] if device.type == "cuda" else conf.get("cpu_grid", conf["grid"])
    dtype = DTYPES[conf.get("dtype", "bfloat16") if device.type == "cuda" else conf.get("cpu_dtype", "float32")]
    shapes = expand_grid(grid)
    results = []
    if tracker is not None:
        plan = SimpleNamespace(sweep_name=conf.get("sweep_name", "verify_kernel"), overrides=(),
                               base_config={k: v for k, v in conf.items() if k not in ("grid", "cpu_grid")}
                               | {"grid": grid}, num_runs=len(shapes))
        tracker.begin_parent(plan, tags={"job": "kernel"})
    try:
        for i, shape in enumerate(shapes):
            started = time.time()
            try:
                metrics, state, message = run_shape(shape, device=device, dtype=dtype, seed=i), "FINISHED", ""
            except Exception as e:  # a shape the kernel refuses is data, not the end of the sweep
                logger.exception("shape %s failed", shape.name)
                metrics, state, message = {}, "FAILED", f"{type(e).__name__}: {e}"
            results.append({"shape": shape, "state": state, "metrics": metrics, "message": message})
            logger.info("%s: %s %s", shape.name, state, {k: round(v, 4) for k, v in metrics.items()})
            if tracker is not None:
                _log_child(tracker, shape, i, state, metrics, message, started, device, dtype)
    except BaseException:
        if tracker is not None:
            tracker.end_parent("KILLED")
        raise
    if tracker is not None:
        tracker.end_parent("FINISHED" if all(r["state"] == "FINISHED" for r in results) else "FAILED")
    return results


def _log_child(tracker, shape: KernelShape, index: int, state: str, metrics: dict, message: str,
               started: float, device: torch.device, dtype: torch.dtype) -> None:
    from orchestrator.tracking import PARENT_TAG, ROLE_TAG

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (triton interpreter)"
    tags = {ROLE_TAG: "child", PARENT_TAG: tracker.parent_run_id, "job": "kernel", "job_index": str(index),
            "host": tracker.host, "git_sha": tracker.git_sha, "state": state, "device": device_name}
    if message:
        tags["message"] = message[:5000]
    run = tracker.client.create_run(tracker.experiment_id, run_name=shape.name, start_time=int(started * 1000),
                                    tags=tags)
    rid = run.info.run_id
    tracker._log_batch(rid, params={**shape.params(), "dtype": str(dtype).removeprefix("torch.")},
                       metrics={k: v for k, v in metrics.items() if math.isfinite(v)})
    tracker.client.set_terminated(rid, status=state)


def main(argv: list[str] | None = None) -> int:
    import yaml

    p = argparse.ArgumentParser(description="the verify-kernel grid as a sweep in MLflow")
    p.add_argument("sweep", type=Path, help="e.g. conf/sweep/verify_kernel.yaml")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    conf = yaml.safe_load(a.sweep.read_text())
    from orchestrator.tracking import Tracker

    tracker = Tracker(a.tracking_uri, conf.get("sweep_name", "verify_kernel"))
    results = run_kernel_sweep(conf, tracker)
    return 0 if all(r["state"] == "FINISHED" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
