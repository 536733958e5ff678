"""Benchmark verify_attention on a GPU: ceilings, then a checked, timed grid beside the torch reference and SGLang.

    python -m specsweep_kernel_bench.bench [--out bench.md] [--sglang-wheel .whl/sglang-0.5.10.post1-py3-none-any.whl] [--tune]

For every (layout, prefix, T, page size): build a fresh random problem (bf16, batch 1, pages on a random
permutation of the pool), check the kernel against the fp32 reference (relative error), then time it with
a median over CUDA-graph replays (host launch overhead out, as in a graph-captured engine), each after an L2 flush
(--flush clean, the default: a read of 256 MB, cold and clean; dirty: triton's do_bench, which leaves ~50 MB of dirty
lines for the timed call to write back); the eager time is in the full table. GB/s = unique prefix KV bytes / time; floor =
max(bytes / copy bandwidth, FLOPs / matmul rate) from specsweep_kernels.roofline. SGLang's verify path
(extend_attention_fwd + custom mask) and, at T = 1, its split-KV decode kernel run beside it when the wheel is
given (unpacked from the wheel by specsweep_kernel_bench.sglang_peer). --tune also times a few
tiles and split counts per row and reports the best. The full table goes to --out, a short one is printed last.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specsweep_kernels.problems import LAYOUTS, Layout, make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import load_or_measure_ceilings, floor_seconds, verify_cost
from specsweep_kernels.verify_attention import (_IMPLS, VerifyConfig, allocate_workspace, candidate_configs, plan_verify,
                                                step_needs_plan, verify_attention, verify_kernel,
                                                verify_launch_params)

@dataclass
class Row:
    layout: str
    prefix: int
    tokens: int
    page: int
    lens: list[int] | None = None  # a ragged batch's prefix lengths (None: batch 1 of `prefix`)
    mix: str = ""  # the ragged batch's name in the tables
    ours_us: float = math.nan
    eager_us: float = math.nan
    compiled: str = ""
    gbps: float = math.nan
    floor_us: float = math.nan
    err: float = math.nan
    ref_us: float = math.nan
    sgl_verify_us: float = math.nan
    sgl_verify_err: float = math.nan
    sgl_decode_us: float = math.nan
    sgl_mode: str = ""
    fa2_us: float = math.nan  # FlashAttention-2 through torch SDPA on contiguous K/V
    fa2_mode: str = ""
    model_us: float = math.nan  # per layer, `model_layers` calls on their own KV pools in one graph
    tuned_us: float = math.nan
    tuned: str = ""
    note: str = ""
    extra: list[str] = field(default_factory=list)

    @property
    def prefix_lens(self) -> list[int]:
        return self.lens if self.lens is not None else [self.prefix]

    @property
    def label(self) -> str:
        return self.mix or str(self.prefix)

    @property
    def frac_floor(self) -> float:
        return self.floor_us / self.ours_us

    @property
    def frac_floor_model(self) -> float:
        return self.floor_us / self.model_us


def bench_layout(name: str) -> Layout:
    """A preset of problems.LAYOUTS, or `preset:H` for the same layout with H query heads (e.g. mla:128)."""
    preset, _, heads = name.partition(":")
    layout = LAYOUTS[preset]
    return dataclasses.replace(layout, num_q_heads=int(heads)) if heads else layout


FLUSHES = ("clean", "dirty")
_flush = {"mode": "clean", "buffer": None}


def set_flush(mode: str) -> None:
    """How the L2 is emptied before each timed run: "clean" (default) reads a 256 MB buffer, so the call starts
    with a cold L2 holding no dirty lines; "dirty" is triton.testing.do_bench's own flush, which zeroes that buffer
    and leaves the L2 full of dirty lines (up to its 50 MB on an H100 / H200) that the timed call then pays to write
    back: +8.7 us on a 156 MB load-only stream (H200, 2026-12-01)."""
    if mode not in FLUSHES:
        raise ValueError(f"flush: {mode!r} is not one of {', '.join(FLUSHES)}")
    _flush["mode"] = mode


def _bench_us(fn, rep_ms: int = 100) -> float:
    from triton.testing import do_bench

    if _flush["mode"] == "dirty":
        return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1e3
    if _flush["buffer"] is None:
        _flush["buffer"] = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    buffer = _flush["buffer"]
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(25 / estimate_ms))):
        fn()
    runs = min(max(int(rep_ms / estimate_ms), 10), 1000)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for begin, finish in events:
        buffer.view(torch.int64).max()  # a read of the whole buffer: the L2 holds only its clean lines
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    times = sorted(begin.elapsed_time(finish) for begin, finish in events)
    return times[len(times) // 2] * 1e3


def graph_us(fn, rep_ms: int = 100) -> tuple[float, str]:
    """Median time of fn replayed from a CUDA graph (no host launch overhead); eager if capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot be captured is timed eagerly
        torch.cuda.synchronize()
        return _bench_us(fn, rep_ms), f"eager ({type(exc).__name__})"
    return _bench_us(graph.replay, rep_ms), "graph"


def _compiled_summary() -> str:
    from specsweep_kernels import verify_attention as va

    k = va._last_compiled
    if k is None:
        return ""
    try:
        ptx = k.asm.get("ptx", "")
        return (f"regs {k.n_regs} spills {k.n_spills} smem {k.metadata.shared // 1024} KB "
                f"cp.async {'cp.async' in ptx} wgmma {'wgmma' in ptx}")
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return f"({type(exc).__name__})"


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.isnan().any():
        return math.inf
    return ((out.float() - ref).norm() / ref.norm()).item()


def _load_sglang(wheel: str | None):
    if not wheel:
        return None
    from specsweep_kernel_bench.sglang_peer import load_peer_kernels

    return load_peer_kernels(wheel)


def _sglang_calls(sglang, problem, out_verify: torch.Tensor):
    """(verify, decode or None) closures calling SGLang's kernels on the same problem (token-granular indices,
    the whole batch in one call as SGLang runs it: ragged q through qo_indptr, one custom mask per request)."""
    extend_fwd, decode_fwd = sglang
    args = problem.attention_args()
    batch, t, hq, dk = args["q"].shape
    q = args["q"].reshape(batch * t, hq, dk)
    kb = args["k_buffer"]
    dv = problem.layout.v_head_dim
    vb = kb[..., :dv] if args["v_buffer"] is None else args["v_buffer"]
    k_new = args["k_new"].flatten(0, 1)
    v_new = k_new[..., :dv] if args["v_new"] is None else args["v_new"].flatten(0, 1)
    addressing = problem.indptr_args()
    kv_indptr, kv_indices = addressing["kv_indptr"], addressing["kv_indices"]
    dev = q.device
    qo_indptr = torch.arange(0, (batch + 1) * t, t, device=dev, dtype=torch.int32)
    masks = []
    for b, prefix in enumerate(problem.prefix_lens):
        mask = torch.ones(t, prefix + t, dtype=torch.bool, device=dev)
        mask[:, prefix:] = args["tree_mask"][b]
        masks.append(mask.flatten())
    mask_indptr = torch.zeros(batch + 1, device=dev, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor([m.numel() for m in masks], device=dev), 0)
    mask = torch.cat(masks)
    o = out_verify.view(batch * t, hq, dv)

    def verify():
        extend_fwd(q, k_new, v_new, o, kb, vb, qo_indptr, kv_indptr, kv_indices, mask, False, mask_indptr, t,
                   1.0, 1.0, sm_scale=problem.sm_scale)

    decode = None
    if t == 1:
        splits = 64
        o1 = torch.empty(batch, hq, dv, device=dev, dtype=q.dtype)
        logits = torch.empty(batch, hq, splits, dv, device=dev, dtype=torch.float32)
        lse = torch.empty(batch, hq, splits, device=dev, dtype=torch.float32)
        nsplit = torch.full((batch,), splits, device=dev, dtype=torch.int32)

        def decode():
            decode_fwd(q, kb, vb, o1, kv_indptr, kv_indices, logits, lse, nsplit, splits, problem.sm_scale, 1.0, 1.0)
    return verify, decode


def _fa2_sdpa_call(problem):
    """FlashAttention-2 as torch ships it (SDPA's flash backend), on contiguous per-request K/V [1, Hkv, L+T, D]
    copied out of the pool (a layout that has no paging), one call per request. The flash backend takes no mask,
    so the T new tokens see each other fully (same bytes, FLOPs within T / L). None for MLA (Dk 576 > 256)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if problem.layout.mla:
        return None, "n/a (Dk 576, Dk != Dv)"
    args = problem.attention_args()
    slots = problem.indptr_args()
    indptr, indices = slots["kv_indptr"].tolist(), slots["kv_indices"].long()
    calls = []
    for b in range(len(problem.prefix_lens)):
        sel = indices[indptr[b]:indptr[b + 1]]
        k = torch.cat([args["k_buffer"][sel], args["k_new"][b]]).transpose(0, 1).unsqueeze(0).contiguous()
        v = torch.cat([args["v_buffer"][sel], args["v_new"][b]]).transpose(0, 1).unsqueeze(0).contiguous()
        q = args["q"][b].transpose(0, 1).unsqueeze(0).contiguous()
        calls.append((q, k, v))

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for q, k, v in calls:
                sdpa(q, k, v, scale=problem.sm_scale, enable_gqa=True)

    run()  # raises if the flash backend refuses the shape
    return run, "flash, enable_gqa"


def _tune_candidates(layout: Layout, tokens: int, smem_limit: int) -> list[VerifyConfig]:
    rows = tokens * layout.num_q_heads // layout.num_kv_heads
    base = candidate_configs(rows=rows, dk=layout.k_head_dim, dv=layout.v_head_dim, v_is_k=layout.mla, elt=2,
                             smem_limit=smem_limit)
    bm = base[0].block_m
    if layout.mla:
        extra = ([VerifyConfig(16, 128, 8, 2), VerifyConfig(16, 64, 4, 3), VerifyConfig(16, 64, 8, 2),
                  VerifyConfig(16, 64, 8, 3), VerifyConfig(16, 32, 4, 4), VerifyConfig(16, 32, 8, 4),
                  VerifyConfig(32, 64, 8, 2), VerifyConfig(64, 64, 8, 2)] if bm == 16 else
                 [VerifyConfig(bm, 64, 8, 3), VerifyConfig(bm, 32, 8, 4), VerifyConfig(bm, 128, 8, 1),
                  VerifyConfig(32, 64, 8, 2), VerifyConfig(32, 64, 4, 2)])
    else:
        extra = [VerifyConfig(bm, 128, 8, 3), VerifyConfig(bm, 64, 4, 4), VerifyConfig(min(bm, 64), 128, 4, 3)]
    if rows > 32:  # compute-bound rows: Triton's automatic warp specialisation of the prefix loop
        extra += [VerifyConfig(c.block_m, c.block_n, c.num_warps, c.num_stages, True) for c in base[:1] + extra[:1]]
    seen, out = set(), []
    for cfg in base[:2] + extra:  # (a larger block_m than the rows is legal: the extra rows are masked)
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out


def model_graph_us(args: dict, addressing: dict, out: torch.Tensor, ws, layers: int, impl: str = "auto") -> float:
    """Per-layer time as an engine runs the kernel: one plan for the step (batches, B > 1), then `layers` calls
    back to back in one CUDA graph, each on its own K/V pool (a copy of this problem's, so each call streams its
    prefix from HBM, not from L2), sharing q, page table, plan, workspace and output as the layers of one forward
    do. Total graph time / layers."""
    kb, vb = args["k_buffer"], args["v_buffer"]
    pools = [(kb.clone(), None if vb is None else vb.clone()) for _ in range(layers - 1)] + [(kb, vb)]
    config, splits = verify_launch_params(**args, **addressing, out=out, workspace=ws, impl=impl)
    lens = {k: v for k, v in addressing.items() if k in ("prefix_lens", "kv_indptr")}
    planned = step_needs_plan(args["q"].shape[0])

    def forward():
        plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=splits, **lens) if planned else None
        for k_pool, v_pool in pools:  # noqa: F821 (called before the del below)
            verify_attention(**{**args, "k_buffer": k_pool, "v_buffer": v_pool}, **addressing, out=out, workspace=ws,
                             plan=plan, impl=impl)

    try:
        us, mode = graph_us(forward, rep_ms=200)
    finally:
        del pools
    return us / layers if mode == "graph" else math.nan


def bench_row(row: Row, *, ceilings, sglang, tune: bool, with_reference: bool, smem_limit: int,
              model_layers: int = 0, impl: str = "auto") -> Row:
    layout = bench_layout(row.layout)
    lens = row.prefix_lens
    problem = make_problem(layout=layout, prefix_lens=lens, num_tokens=row.tokens, page_size=row.page,
                           dtype=torch.bfloat16, device="cuda", tree="chain", seed=sum(lens) + row.tokens + row.page)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=len(lens), max_tokens=row.tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device="cuda")
    out = problem.new_out()
    verify_attention(**args, **addressing, out=out, workspace=ws, impl=impl)
    ref = verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim)
    row.err = _rel_err(out, ref)
    row.compiled = f"{verify_kernel(**args, out=out, impl=impl)}: {_compiled_summary()}"
    run = lambda: verify_attention(**args, **addressing, out=out, workspace=ws, impl=impl)  # noqa: E731
    row.ours_us, _ = graph_us(run)
    row.eager_us = _bench_us(run)
    costs = [verify_cost(layout=layout, prefix_len=n, num_tokens=row.tokens, page_size=row.page) for n in lens]
    nbytes, flops, kv_bytes = (sum(c[i] for c in costs) for i in range(3))
    row.gbps = kv_bytes / (row.ours_us * 1e-6) / 1e9
    row.floor_us = floor_seconds(nbytes=nbytes, flops=flops, ceilings=ceilings) * 1e6
    if model_layers > 1:  # as many layers as fit in ~40 GB of pool copies (a ragged batch's pool is GBs: no L2 reuse)
        pool_bytes = sum(t.numel() * t.element_size() for t in (args["k_buffer"], args["v_buffer"]) if t is not None)
        layers = max(2, min(model_layers, int(40e9 // pool_bytes)))
        row.model_us = model_graph_us(args, addressing, out, ws, layers, impl)
        torch.cuda.empty_cache()
    if with_reference:
        row.ref_us = _bench_us(lambda: verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim),
                               rep_ms=50)
    try:
        fa2, row.fa2_mode = _fa2_sdpa_call(problem)
        if fa2 is not None:
            row.fa2_us, mode = graph_us(fa2)
            row.fa2_mode += f", {mode}"
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run this shape is a result
        row.fa2_mode = f"{type(exc).__name__}: {str(exc)[:80]}"
    torch.cuda.empty_cache()
    if tune:
        best = (row.ours_us, "default")
        sm_count = torch.cuda.get_device_properties(0).multi_processor_count
        for cfg in _tune_candidates(layout, row.tokens, smem_limit):
            m_blocks = -(-row.tokens * layout.num_q_heads // layout.num_kv_heads // cfg.block_m)
            base = max(1, sm_count // (m_blocks * layout.num_kv_heads))
            for splits in sorted({base, min(2 * base, ws.max_splits), min(3 * base, ws.max_splits)}):
                try:
                    o2 = problem.new_out()
                    verify_attention(**args, **addressing, out=o2, workspace=ws, config=cfg, num_splits=splits)
                    err = _rel_err(o2, ref)
                    us, _ = graph_us(lambda: verify_attention(**args, **addressing, out=o2, workspace=ws,  # noqa: B023
                                                              config=cfg, num_splits=splits), rep_ms=40)  # noqa: B023
                except Exception as exc:  # a tile the compiler rejects is a result, not the end of the run
                    row.extra.append(f"{cfg} splits={splits}: {type(exc).__name__}")
                    continue
                tag = (f"m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} sp{splits}"
                       + (" ws" if cfg.warp_specialize else ""))
                row.extra.append(f"{tag}: {us:.1f} us err {err:.1e} [{_compiled_summary()}]")
                if err < 1e-2 and us < best[0]:
                    best = (us, tag)
        row.tuned_us, row.tuned = best
    if sglang is not None:
        out_sgl = torch.full_like(out, float("nan"))
        verify, decode = _sglang_calls(sglang, problem, out_sgl)
        verify()
        row.sgl_verify_err = _rel_err(out_sgl, ref)
        row.sgl_verify_us, mode_v = graph_us(verify, rep_ms=100)
        row.sgl_mode = f"verify {mode_v}"
        if decode is not None:
            decode()
            row.sgl_decode_us, mode_d = graph_us(decode)
            row.sgl_mode += f", decode {mode_d}"
    return row


def _fmt(x: float, spec: str = ".1f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def full_table(rows: list[Row]) -> str:
    head = ("| layout | prefix | T | page | ours µs | GB/s | floor µs | floor/ours | rel err | ours eager µs "
            "| torch ref µs | SGLang verify µs | speed-up vs verify | SGLang decode µs (T=1) | SGLang timing "
            "| FA2 (SDPA, contiguous) µs | FA2 mode | tuned best µs | tuned config | compiled | note "
            "| in-model µs/layer | floor/in-model |")
    lines = [head, "|" + "---|" * 23]
    for r in rows:
        lines.append(
            f"| {bench_layout(r.layout).name} | {r.label} | {r.tokens} | {r.page} | {_fmt(r.ours_us)} "
            f"| {_fmt(r.gbps, '.0f')} "
            f"| {_fmt(r.floor_us)} | {_fmt(r.frac_floor, '.0%')} | {_fmt(r.err, '.1e')} | {_fmt(r.eager_us)} "
            f"| {_fmt(r.ref_us, '.0f')} | {_fmt(r.sgl_verify_us)} | {_fmt(r.sgl_verify_us / r.ours_us, '.0f')}× "
            f"| {_fmt(r.sgl_decode_us)} | {r.sgl_mode} | {_fmt(r.fa2_us)} | {r.fa2_mode} "
            f"| {_fmt(r.tuned_us)} | {r.tuned} | {r.compiled} | {r.note} "
            f"| {_fmt(r.model_us)} | {_fmt(r.frac_floor_model, '.0%')} |")
    return "\n".join(lines)


def short_table(rows: list[Row]) -> str:
    lines = ["layout    prefix          T  pg   ours_us   GB/s floor%     err  sgl_verify     x   sgl_dec    fa2_us"
             "  model_us floor%"]
    for r in rows:
        lines.append(f"{r.layout:<8}{r.label:>16}{r.tokens:>3}{r.page:>4}{r.ours_us:>10.1f}{r.gbps:>7.0f}"
                     f"{_fmt(r.frac_floor, '.0%'):>7}{r.err:>8.1e}{_fmt(r.sgl_verify_us):>12}"
                     f"{_fmt(r.sgl_verify_us / r.ours_us, '.0f'):>6}{_fmt(r.sgl_decode_us):>10}{_fmt(r.fa2_us):>10}"
                     f"{_fmt(r.model_us):>10}{_fmt(r.frac_floor_model, '.0%'):>7}  {r.note}")
    return "\n".join(lines)


def ragged_mixes(spec: str, seed: int = 0) -> list[tuple[str, list[int]]]:
    """'1024/65536/3/200000,16r,64r' -> named batches: explicit lengths, or B random lengths drawn log-uniformly
    in 1..131072 (a fixed seed, so every run measures the same mix)."""
    gen = torch.Generator().manual_seed(seed)
    mixes = []
    for item in filter(None, spec.split(",")):
        if item.endswith("r"):
            n = int(item[:-1])
            lens = torch.exp(torch.rand(n, generator=gen, dtype=torch.float64) * math.log(131072)).long().tolist()
            mixes.append((f"{n}× rand Σ{sum(lens) // 1000}k", lens))
        else:
            lens = [int(x) for x in item.split("/")]
            mixes.append(("/".join(f"{n // 1000}k" if n >= 1000 else str(n) for n in lens), lens))
    return mixes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-results/kernels.md", help="full table (markdown)")
    parser.add_argument("--layouts", default="mla,gqa", help="presets (mla, gqa, gqa-small), preset:H for H q heads")
    parser.add_argument("--prefixes", default="4096,32768,131072")
    parser.add_argument("--tokens", default="1,8,32,64")
    parser.add_argument("--pages", default="1,16")
    parser.add_argument("--ragged", default="1024/65536/3/200000,16r,64r",
                        help="ragged batches: lengths joined by '/', or Nr for N random lengths (empty: none)")
    parser.add_argument("--ragged-tokens", default="1,8")
    parser.add_argument("--ragged-page", type=int, default=16)
    parser.add_argument("--sglang-wheel", default=None, help="sglang 0.5.10.post1 wheel, for the baseline columns")
    parser.add_argument("--no-reference", action="store_true", help="skip timing the torch reference")
    parser.add_argument("--tune", action="store_true", help="also time a few tiles / split counts per row")
    parser.add_argument("--tune-prefixes", default="131072", help="prefixes whose page-1 rows --tune explores")
    parser.add_argument("--model-layers", type=int, default=36,
                        help="also time each row as `model-layers` back-to-back calls in one graph (0: skip)")
    parser.add_argument("--impl", default="auto", choices=_IMPLS,
                        help="verify_attention's kernel: auto (Gluon for MLA on sm_90), triton (portable), gluon")
    parser.add_argument("--cached-ceilings", action="store_true",
                        help="reuse ceilings cached for this GPU name instead of measuring them in this run")
    parser.add_argument("--flush", default="clean", choices=FLUSHES,
                        help="L2 before each timed run: clean (a read of 256 MB: cold, no dirty lines) or dirty "
                             "(triton's do_bench: zeroed, ~50 MB of dirty lines written back inside the timed call)")
    parser.add_argument("--roofline-cache", default=None, help="JSON cache of measured ceilings (default: ~/.cache)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("specsweep_kernel_bench.bench needs a CUDA GPU")
    set_flush(args.flush)

    from specsweep_kernels.roofline import DEFAULT_CACHE
    from specsweep_kernels.verify_attention import _device_limits

    ceilings = load_or_measure_ceilings(cache=Path(args.roofline_cache) if args.roofline_cache else DEFAULT_CACHE,
                                        remeasure=not args.cached_ceilings)
    smem_limit, sm_count = _device_limits(torch.cuda.current_device())
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"{stamp} · {ceilings.device} · {sm_count} SMs · smem/block {smem_limit // 1024} KB · torch "
              f"{torch.__version__} · triton {__import__('triton').__version__} · impl {args.impl} · L2 flush {args.flush}\n"
              f"ceilings{' (cached)' if args.cached_ceilings else ' measured in this run'}: copy "
              f"{ceilings.copy_gbps:.0f} GB/s (read+write), bf16 matmul {ceilings.matmul_tflops:.0f} TFLOP/s")
    print(header, flush=True)
    sglang = _load_sglang(args.sglang_wheel)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    todo = []
    for name in filter(None, args.layouts.split(",")):
        for mix, lens in ragged_mixes(args.ragged):
            for tokens in map(int, filter(None, args.ragged_tokens.split(","))):
                todo.append(Row(name, max(lens), tokens, args.ragged_page, lens=lens, mix=mix))
    for name in filter(None, args.layouts.split(",")):
        for prefix in map(int, filter(None, args.prefixes.split(","))):
            for tokens in map(int, args.tokens.split(",")):
                for page in map(int, args.pages.split(",")):
                    todo.append(Row(name, prefix, tokens, page))
    rows: list[Row] = []
    for row in todo:
        t0 = time.time()
        try:
            tune = args.tune and row.lens is None and row.page == 1 and str(row.prefix) in args.tune_prefixes.split(",")
            bench_row(row, ceilings=ceilings, sglang=sglang, tune=tune,
                      with_reference=not args.no_reference and row.lens is None, smem_limit=smem_limit,
                      model_layers=args.model_layers, impl=args.impl)
        except Exception as exc:  # one failing row must not lose the others
            row.note = f"{type(exc).__name__}: {str(exc)[:120]}"
        torch.cuda.empty_cache()
        rows.append(row)
        print(f"{row.layout} L={row.label} T={row.tokens} page={row.page}: ours {row.ours_us:.1f} us "
              f"({_fmt(row.frac_floor, '.0%')} of floor {row.floor_us:.1f}), in-model {_fmt(row.model_us)} "
              f"({_fmt(row.frac_floor_model, '.0%')}), err {row.err:.1e}, sglang verify {_fmt(row.sgl_verify_us)} "
              f"decode {_fmt(row.sgl_decode_us)}, fa2 {_fmt(row.fa2_us)}, tuned {_fmt(row.tuned_us)} {row.tuned} "
              f"[{time.time() - t0:.0f}s] {row.compiled} {row.sgl_mode} {row.fa2_mode} {row.note}", flush=True)
        detail = "\n".join(f"- {r.layout} L={r.label} T={r.tokens} page={r.page}: " + "; ".join(r.extra)
                           for r in rows if r.extra)
        mixes = "\n".join(f"- {r.mix}: {r.lens}" for r in rows if r.lens is not None and r.layout == rows[0].layout)
        out_path.write_text(f"{header}\n\n{full_table(rows)}\n\n{detail}\n\nragged batches:\n{mixes}\n")
    print("\n" + header)
    print(short_table(rows))
    print(f"full table: {out_path}")


if __name__ == "__main__":
    main()
