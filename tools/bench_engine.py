"""`python -m tools.bench_engine`: prefill and decode tokens/s of `tiny` (dummy weights) by context
length x page size x algorithm (NONE, NGRAM, the oracle). Medians over --repeats requests.

prefill tok/s = prompt_tokens / ttft (median; the oracle's ttft includes the draft's prefill);
decode tok/s = mean tokens committed per step / median step time; page sizes decode in lock step.
At most `--new-tokens` steps per request (speculative steps commit several tokens each).
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time

import torch

from workers.reference.args import parse_args
from workers.reference.engine import Engine, Request, SamplingParams

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


def make_engine(ctx: int, page: int, algo: str, new_tokens: int, chunk: int) -> Engine:
    engine = Engine(parse_args(["--model-path", "tiny", "--load-format", "dummy", "--page-size", str(page),
                                "--context-length", str(ctx + 8 * new_tokens), "--chunked-prefill-size", str(chunk),
                                *ALGORITHMS[algo]]))
    engine.generate(list(range(1, 65)), SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    return engine


def prefill(engine: Engine, ids: list[int], new_tokens: int) -> tuple[Request, float]:
    """Target (and draft) prefill of one request, timed like the server's ttft."""
    req = Request(ids, SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True), torch.Generator())
    t0 = time.perf_counter()
    engine._prefill(req)
    return req, time.perf_counter() - t0


def measure(ctx: int, algo: str, pages: list[int], repeats: int, new_tokens: int, chunk: int) -> list[dict]:
    """Per repeat: prefill one request per page size, then decode them in lock step (one step of A, one
    of B, ...) so a noisy neighbour slows every page size alike. decode tok/s = tokens committed per step
    (mean) / step time (median); prefill tok/s = median over repeats."""
    engines = {page: make_engine(ctx, page, algo, new_tokens, chunk) for page in pages}
    ids = prompt_ids(engines[pages[0]], ctx)
    prefill_rates: dict[int, list[float]] = {page: [] for page in pages}
    steps: dict[int, list[tuple[float, int]]] = {page: [] for page in pages}  # (seconds, tokens)
    accept: dict[int, list[float]] = {page: [] for page in pages}
    for _ in range(repeats):
        live = {}
        for page, engine in engines.items():
            req, seconds = prefill(engine, ids, 8 * new_tokens)
            prefill_rates[page].append(ctx / seconds)
            live[page] = (engine, req)
        for _ in range(new_tokens - 1):
            for page, (engine, req) in live.items():
                done = len(req.out)
                t0 = time.perf_counter()
                engine._step([req])
                steps[page].append((time.perf_counter() - t0, len(req.out) - done))
        for page, (engine, req) in live.items():
            engine._end(req)
            accept[page].append(statistics.mean(s["accept_len"] for s in req.steps) if req.steps else 1.0)
    rows = []
    for page in pages:
        per_step = statistics.mean(n for _, n in steps[page])
        prefill_rate = statistics.median(prefill_rates[page])
        rows.append({"ctx": ctx, "page": page, "algo": algo, "prefill_tok_s": prefill_rate,
                     "prefill_s": ctx / prefill_rate,
                     "decode_tok_s": per_step / statistics.median(t for t, _ in steps[page]),
                     "accept_len": statistics.median(accept[page])})
    return rows


def markdown_table(columns: list[tuple[str, str, str]], rows: list[dict]) -> str:
    """columns: (heading, cell format over a row's keys such as "{prefill_tok_s:.0f}", "r" or "l" alignment)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for _, _, a in columns) + "|"]
    lines += ["| " + " | ".join(f.format(**r) for _, f, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    return markdown_table([("context", "{ctx}", "r"), ("page", "{page}", "r"), ("algorithm", "{algo}", "l"),
                           ("prefill tok/s", "{prefill_tok_s:.0f}", "r"), ("prefill s", "{prefill_s:.2f}", "r"),
                           ("decode tok/s", "{decode_tok_s:.1f}", "r"), ("accept len", "{accept_len:.2f}", "r")], rows)


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
    p = argparse.ArgumentParser(prog="python -m tools.bench_engine", allow_abbrev=False)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--chunked-prefill-size", type=int, default=2048)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    header = (f"# {time.strftime('%Y-%m-%d')}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
              f"{cpu_name()}; tiny, dummy weights, fp32, batch 1, {a.new_tokens} new tokens, "
              f"{a.repeats} requests per cell, page sizes decoded in lock step")
    print(header, flush=True)
    print(f"load average at the start (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for ctx in a.contexts:
        for algo in a.algorithms:
            for r in measure(ctx, algo, a.page_sizes, a.repeats, a.new_tokens, a.chunked_prefill_size):
                rows.append(r)
                print(f"  ctx={ctx} page={r['page']} {algo}: prefill {r['prefill_tok_s']:.0f} tok/s "
                      f"({r['prefill_s']:.2f} s), decode {r['decode_tok_s']:.1f} tok/s", flush=True)
    rows.sort(key=lambda r: (r["ctx"], r["page"], list(ALGORITHMS).index(r["algo"])))
    print(format_table(rows))
    print(f"load average at the end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for line in page_ratios(rows):
        print(line)


if __name__ == "__main__":
    main()
