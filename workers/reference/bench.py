"""`python -m workers.reference.bench`: prefill and decode tokens/s of `tiny` (dummy weights) by context
length x page size x algorithm (NONE, NGRAM, the oracle). Medians over --repeats requests.

prefill tok/s = prompt_tokens / ttft (the oracle's ttft includes the draft's prefill);
decode tok/s = (completion_tokens - 1) / (e2e - ttft).
"""
from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time

import torch

from .args import parse_args
from .engine import Engine, SamplingParams

logger = logging.getLogger(__name__)

ALGORITHMS = {
    "NONE": [],
    "NGRAM": ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4"],
    "oracle": ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "tiny",
               "--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"],
}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def prompt_ids(engine: Engine, length: int) -> list[int]:
    text = "The cat sat on the mat. A quick brown fox jumps over the lazy dog. "
    ids = engine.encode(text * (length // len(text) + 1))
    return ids[:length]


def measure(ctx: int, page: int, algo: str, repeats: int, new_tokens: int, chunk: int) -> dict:
    engine = Engine(parse_args(["--model-path", "tiny", "--load-format", "dummy", "--page-size", str(page),
                                "--context-length", str(ctx + new_tokens), "--chunked-prefill-size", str(chunk),
                                *ALGORITHMS[algo]]))
    ids = prompt_ids(engine, ctx)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(ids[:64], SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    prefill, decode, accept = [], [], []
    for _ in range(repeats):
        meta = engine.generate(ids, params).meta_info
        prefill.append(meta["prompt_tokens"] / meta["ttft"])
        decode.append((meta["completion_tokens"] - 1) / (meta["e2e_latency"] - meta["ttft"]))
        accept.append(meta.get("spec_accept_length", 1.0))
    return {"ctx": ctx, "page": page, "algo": algo, "prefill_tok_s": statistics.median(prefill),
            "prefill_s": ctx / statistics.median(prefill), "decode_tok_s": statistics.median(decode),
            "accept_len": statistics.median(accept)}


def format_table(rows: list[dict]) -> str:
    lines = ["| context | page | algorithm | prefill tok/s | prefill s | decode tok/s | accept len |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ctx']} | {r['page']} | {r['algo']} | {r['prefill_tok_s']:.0f} | {r['prefill_s']:.2f} "
                     f"| {r['decode_tok_s']:.1f} | {r['accept_len']:.2f} |")
    return "\n".join(lines)


def page_ratios(rows: list[dict]) -> list[str]:
    out = []
    by = {(r["ctx"], r["page"], r["algo"]): r for r in rows}
    for (ctx, page, algo), r in sorted(by.items()):
        other = by.get((ctx, 16, algo))
        if page == 1 and other:
            out.append(f"ctx {ctx} {algo}: decode page 1 is {other['decode_tok_s'] / r['decode_tok_s']:.2f}x "
                       f"the time of page 16")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m workers.reference.bench", allow_abbrev=False)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--chunked-prefill-size", type=int, default=2048)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    header = (f"# {time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
              f"{cpu_name()}; tiny, dummy weights, fp32, batch 1, {a.new_tokens} new tokens, "
              f"median of {a.repeats}")
    print(header, flush=True)
    rows = []
    for ctx in a.contexts:
        for page in a.page_sizes:
            for algo in a.algorithms:
                rows.append(measure(ctx, page, algo, a.repeats, a.new_tokens, a.chunked_prefill_size))
                r = rows[-1]
                print(f"  ctx={ctx} page={page} {algo}: prefill {r['prefill_tok_s']:.0f} tok/s "
                      f"({r['prefill_s']:.2f} s), decode {r['decode_tok_s']:.1f} tok/s", flush=True)
    print(format_table(rows))
    for line in page_ratios(rows):
        print(line)


if __name__ == "__main__":
    main()
