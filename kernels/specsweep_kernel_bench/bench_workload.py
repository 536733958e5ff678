"""The verify workload of the original investigation, judged against ceilings measured in the same run.

    python -m specsweep_kernel_bench.bench_workload [--out bench-results/workload.md] [--sglang-verify DIR]
                                                    [--grid mla,ragged,gqa] [--warm-only --shard I/N]

Shapes: MLA (576 = 512 + 64, one latent head) with 8 and 16 query heads (a Kimi / GLM-class model at TP 8 and
16 heads per GPU), T = 1..17 draft tokens (chains; trees of 9, 12 and 17 nodes under a random tree mask), pages 1
and 64, prefixes 64k, 185k (the investigation's own) and 256k, batch 1; ragged MLA batches at T = 4, 8, 16; GQA
32/8 d128 for the portable path's GQA goal.

Each row: a fresh random bf16 problem; every kernel checked against the fp32 reference (relative error), then timed
as the median of CUDA-graph replays, each after a clean 256 MB L2 flush (bench.graph_us). Two ceilings, measured in
this run:
- memory: a pure read stream of the call's minimum bytes (roofline.ReadStream), timed the same way, the fastest
  of four program counts (2, 4, 8, 16 a SM);
- compute: the call's FLOPs over the bf16 dense peak (the median of >= 5 matmul measurements in this run).
floor = the larger; each kernel's fraction of both is in the table. Columns: ours as shipped (impl auto: the Gluon
kernel for MLA on sm_90), the portable Triton kernel forced (impl triton) with the tile the picker chooses under
sm_120's 99 KB of shared memory per block (--portable-smem; the path an sm_120 GPU runs, here on this GPU's SMs and
bandwidth), and on
chains SGLang 0.5.23's split-KV verify kernels (verify_shared_kv_fwd for MLA, verify_splitkv_fwd for GQA; loaded
by sglang_peer.load_verify_peers from --sglang-verify, a folder with verify_mla.py and verify_splitkv.py).

Compilation dominates a bare machine's run: `--warm-only --shard I/N` compiles (into Triton's disk cache) every
kernel variant of the shard's rows on a short prefix and times nothing, so N shards in parallel processes warm
the cache before the one timing process runs.
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

from specsweep_kernel_bench.bench import _rel_err, bench_layout, graph_us, ragged_mixes
from specsweep_kernel_bench.sglang_peer import zero_verify_scratch
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.roofline import ReadStream, copy_gbps, matmul_peak_tflops, verify_cost
from specsweep_kernels.verify_attention import VerifyConfig, allocate_workspace, verify_attention, verify_kernel
from specsweep_kernels.verify_config import pick_config
from specsweep_kernels.verify_targets import SM120

IMPLS = ("auto", "triton")
GRIDS = ("mla", "ragged", "gqa")
TREE_TOKENS = (9, 12, 17)  # the investigation's DDTree trees (9 nodes) and two larger ones


@dataclass
class Row:
    layout: str  # bench.bench_layout name (mla:8, mla:16, gqa)
    lens: list[int]
    tokens: int
    page: int
    mask: str  # chain | tree
    mix: str = ""
    nbytes: float = math.nan
    flops: float = math.nan
    read_us: float = math.nan
    compute_us: float = math.nan
    us: dict[str, float] = field(default_factory=dict)  # impl -> µs; "sglang" for the 0.5.23 peer
    err: dict[str, float] = field(default_factory=dict)
    kernel: str = ""
    portable: str = ""  # the portable kernel's tile
    note: str = ""

    @property
    def label(self) -> str:
        return self.mix or (f"{self.lens[0] // 1024}k" if self.lens[0] % 1024 == 0 else f"{self.lens[0] // 1000}k")

    @property
    def floor_us(self) -> float:
        return max(self.read_us, self.compute_us)

    def frac(self, key: str, ceiling: str) -> float:
        return getattr(self, f"{ceiling}_us") / self.us.get(key, math.nan)


MLA_PREFIXES = {1: (65536, 185000, 262144), 64: (262144,)}  # page size -> batch-1 prefixes


def workload_rows(grids: list[str], pages: tuple[int, ...] = (1, 64), prefixes: tuple[int, ...] = ()) -> list[Row]:
    """The grid's rows; pages / prefixes (non-empty) keep only those of the MLA batch-1 rows."""
    rows: list[Row] = []
    if "mla" in grids:
        for heads, tokens in ((8, (1, 2, 4, 8, 9, 12, 16, 17)), (16, (1, 2, 4, 8, 9, 12, 17))):
            for page in pages:
                for prefix in MLA_PREFIXES.get(page, ()):
                    if prefixes and prefix not in prefixes:
                        continue
                    for t in tokens:
                        rows.append(Row(f"mla:{heads}", [prefix], t, page, "chain"))
                        if t in TREE_TOKENS:
                            rows.append(Row(f"mla:{heads}", [prefix], t, page, "tree"))
    if "ragged" in grids:
        for heads in (8, 16):
            for mix, lens in ragged_mixes("1024/65536/3/200000,16r,64r"):
                for t in (4, 16):
                    rows.append(Row(f"mla:{heads}", lens, t, 16, "chain", mix=mix))
    if "gqa" in grids:
        for page in (1, 64):
            for t in (1, 4, 8, 16):
                rows.append(Row("gqa", [131072], t, page, "chain"))
    return rows


def _peer_call(peers, problem, out: torch.Tensor):
    """SGLang 0.5.23's verify kernel for this chain problem (extend_attention_fwd's arguments): a call returning
    False where the kernel refuses the shape. The first call has made the kernel's scratch; call
    sglang_peer.zero_verify_scratch before the call whose output counts (an unrun split's stale NaN leaks into the
    GQA kernel's output, see sglang_peer)."""
    shared_kv_fwd, splitkv_fwd = peers
    args = problem.attention_args()
    batch, t, hq, dk = args["q"].shape
    dv = problem.layout.v_head_dim
    q = args["q"].reshape(batch * t, hq, dk)
    kb = args["k_buffer"]
    vb = kb[..., :dv] if args["v_buffer"] is None else args["v_buffer"]
    k_new = args["k_new"].flatten(0, 1).contiguous()
    v_new = (k_new[..., :dv] if args["v_new"] is None else args["v_new"].flatten(0, 1)).contiguous()
    addressing = problem.indptr_args()
    qo_indptr = torch.arange(0, (batch + 1) * t, t, device=q.device, dtype=torch.int32)
    o = out.view(batch * t, hq, dv)
    fwd = shared_kv_fwd if problem.layout.mla else splitkv_fwd

    def call() -> bool:
        return fwd(q, k_new, v_new, o, kb, vb, qo_indptr, addressing["kv_indptr"], addressing["kv_indices"], None,
                   True, None, t, 1.0, 1.0, sm_scale=problem.sm_scale, max_bs=batch)

    return call


def portable_config(layout, tokens: int, smem_limit: int) -> VerifyConfig:
    """The tile the picker gives the portable kernel on a GPU with `smem_limit` bytes of shared memory a block."""
    return pick_config(rows=tokens * layout.num_q_heads // layout.num_kv_heads, dk=layout.k_head_dim,
                       dv=layout.v_head_dim, v_is_k=layout.mla, elt=2, smem_limit=smem_limit)


def run_row(row: Row, *, peak_tflops: float, reader: ReadStream | None, peers, warm_only: bool,
            portable_smem: int = SM120.smem_per_block, impls: tuple[str, ...] = IMPLS) -> Row:
    layout = bench_layout(row.layout)
    lens = [min(n, 4096) for n in row.lens] if warm_only else row.lens
    problem = make_problem(layout=layout, prefix_lens=lens, num_tokens=row.tokens, page_size=row.page,
                           dtype=torch.bfloat16, device="cuda", tree="random" if row.mask == "tree" else "chain",
                           seed=sum(lens) + 7 * row.tokens + row.page)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=len(lens), max_tokens=row.tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device="cuda")
    ref = None if warm_only else verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim)
    for impl in impls:
        out = problem.new_out()
        config = portable_config(layout, row.tokens, portable_smem) if impl == "triton" else None
        run = lambda: verify_attention(**args, **addressing, out=out, workspace=ws, impl=impl, config=config)  # noqa: B023,E731
        run()
        if impl == "auto":
            row.kernel = verify_kernel(**args, out=out, impl=impl)
        else:
            row.portable = f"m{config.block_m} n{config.block_n} w{config.num_warps} s{config.num_stages}"
        if warm_only:
            continue
        row.err[impl] = _rel_err(out, ref)
        row.us[impl], _ = graph_us(run)
    if peers is not None and row.mask == "chain":
        out = problem.new_out()
        call = _peer_call(peers, problem, out)
        if not call():
            row.note = "SGLang 0.5.23 verify: can_handle refused"
        elif not warm_only:
            if out.isnan().any():
                row.note = "SGLang 0.5.23 verify: NaN from its unzeroed scratch on the first call (zeroed, then checked)"
            zero_verify_scratch(peers)
            out.fill_(math.nan)
            call()
            row.err["sglang"] = _rel_err(out, ref)
            row.us["sglang"], _ = graph_us(call)
    if warm_only:
        return row
    costs = [verify_cost(layout=layout, prefix_len=n, num_tokens=row.tokens, page_size=row.page) for n in lens]
    row.nbytes, row.flops = sum(c[0] for c in costs), sum(c[1] for c in costs)
    row.compute_us = row.flops / (peak_tflops * 1e12) * 1e6
    row.read_us = min(graph_us(reader.fn(int(row.nbytes), k))[0] for k in reader.program_counts)
    return row


def _f(x: float, spec: str = ".1f") -> str:
    return "—" if x is None or math.isnan(x) else format(x, spec)


def table(rows: list[Row]) -> str:
    head = ("| layout | prefix | T | mask | page | MB | read µs | compute µs | kernel | ours µs | ours/read "
            "| ours/compute | portable tile | portable µs | portable/read | portable/compute | SGLang 0.5.23 µs | ours ahead "
            "| portable ahead | err ours | err portable | err SGLang | note |")
    lines = [head, "|" + "---|" * 23]
    for r in rows:
        sg = r.us.get("sglang", math.nan)
        lines.append(
            f"| {bench_layout(r.layout).name} | {r.label} | {r.tokens} | {r.mask} | {r.page} | {_f(r.nbytes / 1e6, '.0f')} "
            f"| {_f(r.read_us)} | {_f(r.compute_us)} | {r.kernel} | {_f(r.us.get('auto', math.nan))} "
            f"| {_f(r.frac('auto', 'read'), '.0%')} | {_f(r.frac('auto', 'compute'), '.0%')} | {r.portable} "
            f"| {_f(r.us.get('triton', math.nan))} | {_f(r.frac('triton', 'read'), '.0%')} "
            f"| {_f(r.frac('triton', 'compute'), '.0%')} | {_f(sg)} "
            f"| {_f(sg / r.us.get('auto', math.nan), '.2f')}× | {_f(sg / r.us.get('triton', math.nan), '.2f')}× "
            f"| {_f(r.err.get('auto', math.nan), '.1e')} | {_f(r.err.get('triton', math.nan), '.1e')} "
            f"| {_f(r.err.get('sglang', math.nan), '.1e')} | {r.note} |")
    return "\n".join(lines)


def _tune_portable(row: Row, configs: list[VerifyConfig], budget_s: float) -> list[str]:
    """Time the portable kernel with each config (and P x 1, 2) on the row's problem; lines for the log."""
    layout = bench_layout(row.layout)
    problem = make_problem(layout=layout, prefix_lens=row.lens, num_tokens=row.tokens, page_size=row.page,
                           dtype=torch.bfloat16, device="cuda", seed=1)
    args, addressing = problem.attention_args(), problem.table_args()
    ws = allocate_workspace(max_batch=1, max_tokens=row.tokens, num_q_heads=layout.num_q_heads,
                            v_head_dim=layout.v_head_dim, device="cuda")
    ref = verify_attention_reference(**args, **addressing, v_head_dim=layout.v_head_dim)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines, t0 = [], time.time()
    for cfg in configs:
        m_blocks = -(-row.tokens * layout.num_q_heads // cfg.block_m)
        for mult in (1, 2):
            if time.time() - t0 > budget_s:
                return lines + ["(tuning budget spent)"]
            splits = max(1, mult * sms // m_blocks)
            out = problem.new_out()
            try:
                run = lambda: verify_attention(**args, **addressing, out=out, workspace=ws, config=cfg,  # noqa: B023,E731
                                               num_splits=splits, impl="triton")  # noqa: B023
                run()
                err = _rel_err(out, ref)
                us, _ = graph_us(run, rep_ms=40)
                lines.append(f"{row.layout} L={row.label} T={row.tokens} page={row.page} {cfg} P={splits}: "
                             f"{us:.1f} us err {err:.1e}")
            except Exception as exc:  # noqa: BLE001 - a config the compiler rejects is a result
                lines.append(f"{row.layout} T={row.tokens} {cfg} P={splits}: {type(exc).__name__} {str(exc)[:80]}")
            print(lines[-1], flush=True)
    return lines


TUNE_CONFIGS = [VerifyConfig(16, 64, 4, 2), VerifyConfig(16, 32, 4, 3), VerifyConfig(32, 32, 4, 2),
                VerifyConfig(32, 32, 8, 2), VerifyConfig(64, 32, 8, 2), VerifyConfig(64, 16, 8, 3),
                VerifyConfig(32, 64, 8, 2)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-results/workload.md")
    parser.add_argument("--grid", default="mla,ragged,gqa", help=f"comma list of {', '.join(GRIDS)}")
    parser.add_argument("--sglang-verify", default=None,
                        help="folder with SGLang 0.5.23's verify_mla.py and verify_splitkv.py (the peer columns)")
    parser.add_argument("--mla-pages", default="1,64", help="page sizes of the MLA batch-1 rows (1 and / or 64)")
    parser.add_argument("--mla-prefixes", default="", help="keep only these MLA batch-1 prefixes (default: all)")
    parser.add_argument("--warm-only", action="store_true", help="compile the shard's kernels, time nothing")
    parser.add_argument("--shard", default="0/1", help="I/N: this process takes rows I, I+N, ...")
    parser.add_argument("--portable-smem", type=int, default=SM120.smem_per_block,
                        help="shared memory per block (bytes) the portable column's tile is picked for (sm_120: 99 KB)")
    parser.add_argument("--impls", default=",".join(IMPLS),
                        help=f"comma list of the columns to run: {', '.join(IMPLS)} (auto = ours as shipped, triton = "
                             "the portable kernel on sm_120's tile)")
    parser.add_argument("--tune-s", type=float, default=0.0,
                        help="seconds for timing portable-kernel tiles on three rows after the table (0: none)")
    args = parser.parse_args(argv)
    grids = [g for g in args.grid.split(",") if g]
    bad = [g for g in grids if g not in GRIDS]
    if bad:
        sys.exit(f"--grid: {','.join(bad)}; allowed: {', '.join(GRIDS)}")
    impls = tuple(i for i in args.impls.split(",") if i)
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls:
        sys.exit(f"--impls {args.impls!r}; allowed: a comma list of {', '.join(IMPLS)}")
    try:
        index, count = (int(x) for x in args.shard.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        sys.exit(f"--shard {args.shard!r}; allowed: I/N with 0 <= I < N")
    try:
        pages = tuple(int(x) for x in args.mla_pages.split(",") if x)
        prefixes = tuple(int(x) for x in args.mla_prefixes.split(",") if x)
    except ValueError:
        sys.exit(f"--mla-pages {args.mla_pages!r} / --mla-prefixes {args.mla_prefixes!r}; allowed: comma-separated "
                 "integers")
    if any(p not in MLA_PREFIXES for p in pages):
        sys.exit(f"--mla-pages {args.mla_pages!r}; allowed: {', '.join(map(str, MLA_PREFIXES))}")
    if not torch.cuda.is_available():
        sys.exit("specsweep_kernel_bench.bench_workload needs a CUDA GPU")
    peers = None
    if args.sglang_verify:
        from specsweep_kernel_bench.sglang_peer import load_verify_peers

        peers = load_verify_peers(args.sglang_verify)
    rows = workload_rows(grids, pages, prefixes)[index::count]
    if args.warm_only:
        for row in rows:
            try:
                run_row(row, peak_tflops=math.nan, reader=None, peers=peers, warm_only=True,
                        portable_smem=args.portable_smem, impls=impls)
            except Exception as exc:  # noqa: BLE001 - the timing run reports it
                print(f"warm {row.layout} T={row.tokens} page={row.page}: {type(exc).__name__}: {exc}", flush=True)
        return
    peak, runs = matmul_peak_tflops()
    copy = copy_gbps()
    max_bytes = max(sum(verify_cost(layout=bench_layout(r.layout), prefix_len=n, num_tokens=r.tokens,
                                    page_size=r.page)[0] for n in r.lens) for r in rows)
    reader = ReadStream(int(max_bytes) + (1 << 20))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"{stamp} · {torch.cuda.get_device_name(0)} · torch {torch.__version__} · triton "
              f"{__import__('triton').__version__} · bf16 matmul peak {peak:.0f} TFLOP/s (median of "
              f"{', '.join(f'{x:.0f}' for x in runs)}) · copy {copy:.0f} GB/s (2 GiB, read + write) · read stream: the fastest of {'/'.join(map(str, reader.program_counts))} programs a row · portable tiles for "
              f"{args.portable_smem} B of shared memory a block · L2 flush clean · "
              f"graph replays")
    print(header, flush=True)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done: list[Row] = []
    for row in rows:
        t0 = time.time()
        try:
            run_row(row, peak_tflops=peak, reader=reader, peers=peers, warm_only=False,
                    portable_smem=args.portable_smem, impls=impls)
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            row.note = f"{type(exc).__name__}: {str(exc)[:120]}"
        torch.cuda.empty_cache()
        done.append(row)
        print(f"{row.layout} {row.label} T={row.tokens} {row.mask} page={row.page}: read {_f(row.read_us)} "
              f"compute {_f(row.compute_us)} | ours {_f(row.us.get('auto', math.nan))} ({row.kernel}) "
              f"portable {_f(row.us.get('triton', math.nan))} sglang {_f(row.us.get('sglang', math.nan))} | err "
              f"{' '.join(f'{k} {v:.1e}' for k, v in row.err.items())} [{time.time() - t0:.0f}s] {row.note}",
              flush=True)
        out_path.write_text(f"{header}\n\n{table(done)}\n")
    print("\n" + header + "\n" + table(done), flush=True)
    if args.tune_s > 0:
        picks = [Row("mla:8", [185000], 9, 1, "chain"), Row("mla:16", [185000], 4, 1, "chain"),
                 Row("mla:8", [185000], 1, 1, "chain")]
        lines = []
        for row in picks:
            lines += _tune_portable(dataclasses.replace(row), TUNE_CONFIGS, args.tune_s / len(picks))
        out_path.write_text(f"{header}\n\n{table(done)}\n\nportable tiles:\n" + "\n".join(f"- {x}" for x in lines)
                            + "\n")


if __name__ == "__main__":
    main()
