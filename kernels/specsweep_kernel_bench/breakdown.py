"""Where a batch-1 verify call's time goes: the whole call and its merge timed apart (attention = the rest), and the
attention's cost split into a per-tile slope and a fixed intercept by a fit over prefix lengths (GPU only).

    python -m specsweep_kernel_bench.breakdown --layouts mla,mla:64,mla:128 --tokens 1,16 --pages 64 \
        --prefixes 8192,32768,131072 [--impl auto|triton|gluon]

Each stage is one CUDA graph replayed (median, L2 flushed between replays as --flush says, bench.graph_us): "call" the whole
verify_attention (attention kernel + merge; batch 1 launches no plan), "merge" the merge alone on the partials the
call left (cold L2, so "attn" = call - merge is a lower bound). The fit is least squares of "attn" against the
tiles per program (BLOCK_N-token tiles of one batch-1 slice): slope = one
tile's time on one SM, intercept = what does not shrink with the prefix (launch, Q load, first-tile latency,
epilogue stores, the second wave of new-token programs). The same numbers per layout at fixed rows tell whether a
row is short of its ceiling in the loop (slope) or around it (intercept).
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import sys

import torch

from specsweep_kernel_bench.bench import FLUSHES, bench_layout, graph_us, set_flush
from specsweep_kernels import verify_attention as va
from specsweep_kernels.problems import LAYOUTS, make_problem
from specsweep_kernels.roofline import verify_cost

logger = logging.getLogger(__name__)


def stage_times(*, layout_name: str, prefix: int, tokens: int, page: int, impl: str, splits_scale: float = 1.0) -> dict:
    """µs of the whole batch-1 call and of its merge, each replayed from its own graph; attention = the difference.
    (Batch 1 launches no plan: step_needs_plan(1) is False.)"""
    layout = bench_layout(layout_name)
    problem = make_problem(layout=layout, prefix_lens=[prefix], num_tokens=tokens, page_size=page,
                           dtype=torch.bfloat16, device="cuda", seed=prefix + tokens + page)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = va.allocate_workspace(max_batch=1, max_tokens=tokens, num_q_heads=layout.num_q_heads,
                               v_head_dim=layout.v_head_dim, device="cuda")
    out = problem.new_out()
    config, splits = va.verify_launch_params(**args, **addressing, out=out, workspace=ws, impl=impl)
    splits = max(1, round(splits * splits_scale))
    row = dict(layout=layout.name, prefix=prefix, T=tokens, page=page, kernel=va.verify_kernel(**args, out=out, impl=impl),
               P=splits)
    row["call"], _ = graph_us(lambda: va.verify_attention(**args, **addressing, out=out, workspace=ws, impl=impl,
                                                           num_splits=splits))
    # the merge the call ends with, on the partials the call left in the workspace (its L2 flushed: an upper bound)
    row["merge"], _ = graph_us(lambda: va._launch_merge(ws, out, problem.lens, problem.lens, num_splits=splits,
                                                        block_n=config.block_n, use_indptr=False, single=True))
    row["attn"] = row["call"] - row["merge"]
    row["tiles"] = math.ceil(math.ceil(prefix / splits) / config.block_n)  # one batch-1 slice, as the kernels cut it
    _, flops, kv_bytes = verify_cost(layout=layout, prefix_len=prefix, num_tokens=tokens, page_size=page)
    row["TFLOP/s"] = flops / (row["call"] * 1e-6) / 1e12
    row["GB/s"] = kv_bytes / (row["call"] * 1e-6) / 1e9
    return row


def fit(rows: list[dict], key: str = "attn") -> tuple[float, float]:
    """Least-squares (slope µs per tile, intercept µs) of rows[key] against rows["tiles"]."""
    xs = torch.tensor([r["tiles"] for r in rows], dtype=torch.float64)
    ys = torch.tensor([r[key] for r in rows], dtype=torch.float64)
    a = torch.stack([xs, torch.ones_like(xs)], 1)
    sol = torch.linalg.lstsq(a, ys[:, None]).solution[:, 0]
    return float(sol[0]), float(sol[1])


def _checked(ap: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[list[str], list[int], list[int], list[int]]:
    """The option lists parsed, or argparse's error (exit 2) naming the option, the value and what is allowed —
    before anything touches the GPU."""
    def ints(option: str, text: str, lo: int, hi: int) -> list[int]:
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            ap.error(f"{option} {text!r}: allowed: comma-separated integers in {lo}..{hi}")
        bad = [v for v in values if not lo <= v <= hi]
        if bad:
            ap.error(f"{option} {text!r}: {bad} out of range; allowed: integers in {lo}..{hi}")
        return values

    layouts = a.layouts.split(",")
    for name in layouts:
        try:
            lay = bench_layout(name)
            if lay.num_q_heads < 1 or lay.num_q_heads % lay.num_kv_heads:
                raise ValueError(name)
        except (KeyError, ValueError):
            ap.error(f"--layouts {name!r}: allowed: {', '.join(LAYOUTS)}, or PRESET:H for H query heads, a multiple of the preset's KV heads (e.g. mla:128)")
    if not a.splits_scale > 0:
        ap.error(f"--splits-scale {a.splits_scale}: allowed: a number > 0")
    return (layouts, ints("--prefixes", a.prefixes, 1, 1 << 24), ints("--tokens", a.tokens, 1, 64),
            ints("--pages", a.pages, 1, 1 << 12))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="mla,mla:64,mla:128")
    ap.add_argument("--prefixes", default="8192,32768,131072")
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--pages", default="64")
    ap.add_argument("--impl", default="auto", choices=va._IMPLS)
    ap.add_argument("--splits-scale", type=float, default=1.0,
                    help="prefix programs P = round(the heuristic's P x this) (1: as verify_attention picks)")
    ap.add_argument("--flush", default="clean", choices=FLUSHES,
                    help="L2 before each timed replay, as in specsweep_kernel_bench.bench (clean: a read; dirty: zeroing)")
    a = ap.parse_args(argv)
    layouts, prefixes, tokens, pages = _checked(ap, a)
    if not torch.cuda.is_available():
        sys.exit("specsweep_kernel_bench.breakdown needs a CUDA GPU")
    set_flush(a.flush)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    props = torch.cuda.get_device_properties(0)
    lines = [f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC · {props.name} · {props.multi_processor_count} SMs"
             f" · torch {torch.__version__} · impl {a.impl} · splits x{a.splits_scale} · L2 flush {a.flush}", "",
             "| layout | prefix | T | page | kernel | P | tiles/program | call µs | attn µs | merge µs "
             "| TFLOP/s | GB/s |", "|" + "---|" * 12]
    fits = ["", "| layout | T | page | µs per tile (slope) | intercept µs | prefixes |", "|---|---|---|---|---|---|"]
    for name in layouts:
        for num_tokens in tokens:
            for page in pages:
                group = []
                for prefix in prefixes:
                    r = stage_times(layout_name=name, prefix=prefix, tokens=num_tokens, page=page, impl=a.impl,
                                    splits_scale=a.splits_scale)
                    group.append(r)
                    lines.append(f"| {r['layout']} | {prefix} | {num_tokens} | {page} | {r['kernel']} | {r['P']} "
                                 f"| {r['tiles']} | {r['call']:.1f} | {r['attn']:.1f} "
                                 f"| {r['merge']:.1f} | {r['TFLOP/s']:.0f} | {r['GB/s']:.0f} |")
                    logger.info(lines[-1])
                if len(group) > 1:
                    slope, icpt = fit(group)
                    fits.append(f"| {group[0]['layout']} | {num_tokens} | {page} | {slope:.3f} | {icpt:.1f} "
                                f"| {a.prefixes} |")
    logger.info("\n".join(lines + fits))


if __name__ == "__main__":
    main()
