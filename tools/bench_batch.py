"""`python -m tools.bench_batch`: speculative speedup vs batch size on the reference engine.

For each drafter (none, NGRAM, the oracle; `self`: the target's first --self-layers layers) x concurrency N: N requests submitted at once (one thread each, as
the server's worker threads; each prompt starts with "Request <i>. " so no two are equal), all decoded by the
engine's continuous batching. The cells run in turn within each round (lock step), so load from other processes
falls on all of them alike. Per cell (median over --repeats rounds):
  aggregate tok/s   = completion tokens of all N requests / wall time from the first submit to the last answer;
  per-request tok/s = mean over requests of (completion_tokens - 1) / (e2e - ttft) (decode_tok_s);
  commit            = tokens committed per verify step over all requests (commit_len_mean);
  speedup           = aggregate tok/s / the none drafter's at the same N.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import threading
import time

import torch

from workers.reference.args import parse_args
from tools.bench_engine import ALGORITHMS, cpu_name, markdown_table
from workers.reference.engine import Engine, Output, SamplingParams
from specsweep_common.builtin_models import BUILTIN_MODELS

logger = logging.getLogger(__name__)

DRAFTERS = {
    "none": ALGORITHMS["NONE"],
    "ngram": ALGORITHMS["NGRAM"],
    "oracle": ALGORITHMS["oracle"],
    # self-speculation: the target's first layers draft (--speculative-draft-num-layers, set from --self-layers)
    "self": ALGORITHMS["oracle"],
}
TEXT = "The cat sat on the mat. A quick brown fox jumps over the lazy dog. "


def make_engine(drafter: str, ctx: int, new_tokens: int, concurrency: int, page: int, model: str,
                self_layers: int) -> Engine:
    per_request = ctx + new_tokens + 64
    weights = ["--load-format", "dummy"] if model in BUILTIN_MODELS else []
    oracle = [model if a == "tiny" else a for a in DRAFTERS[drafter]]  # the oracle drafts with the target itself
    if drafter == "self":
        oracle += ["--speculative-draft-num-layers", str(self_layers)]
    engine = Engine(parse_args(["--model-path", model, *weights, "--page-size", str(page),
                                "--context-length", str(per_request), "--max-total-tokens",
                                str(concurrency * (per_request + 2 * page)), "--max-running-requests",
                                str(concurrency), *oracle]))
    engine.generate(list(range(1, 65)), SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    return engine


def prompt(engine: Engine, i: int, ctx: int) -> list[int]:
    text = f"Request {i}. " + TEXT * (ctx // len(TEXT) + 1)
    return engine.encode(text)[:ctx]


def run_round(engine: Engine, n: int, ctx: int, new_tokens: int) -> dict:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    prompts = [prompt(engine, i, ctx) for i in range(n)]
    outs: list[Output | None] = [None] * n

    def work(i: int) -> None:
        outs[i] = engine.generate(prompts[i], params)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [o for o in outs if o is not None]
    if len(done) < len(outs):
        raise RuntimeError("a request failed (see the log)")
    metas = [o.meta_info for o in done]
    steps = [s for m in metas for s in m.get("spec_steps", [])]
    decode = [(m["completion_tokens"] - 1) / (m["e2e_latency"] - m["ttft"]) for m in metas]
    return {"aggregate_tok_s": sum(m["completion_tokens"] for m in metas) / wall,
            "request_tok_s": statistics.fmean(decode),
            "commit": statistics.fmean(s["accept_len"] for s in steps) if steps else 1.0,
            "batch": max((s["batch_size"] for s in steps), default=n)}


def measure(cells: list[tuple[str, int]], ctx: int, new_tokens: int, repeats: int, page: int,
            model: str = "tiny", self_layers: int = 2) -> list[dict]:
    """Every cell's engine is built first; then each round runs every cell once, in turn, so a noisy neighbour on
    a shared machine slows all cells alike (the medians over rounds are compared, not one cell's luck)."""
    engines = {cell: make_engine(cell[0], ctx, new_tokens, cell[1], page, model, self_layers) for cell in cells}
    rounds: dict[tuple[str, int], list[dict]] = {cell: [] for cell in cells}
    try:
        for i in range(repeats):
            for cell, engine in engines.items():
                rounds[cell].append(run_round(engine, cell[1], ctx, new_tokens))
            logger.warning("round %d of %d done", i + 1, repeats)
    finally:
        for engine in engines.values():
            engine.close()
    return [{"drafter": d, "n": n, **{k: statistics.median(r[k] for r in rounds[(d, n)]) for k in rounds[(d, n)][0]}}
            for d, n in cells]


def format_table(rows: list[dict]) -> str:
    base = {r["n"]: r["aggregate_tok_s"] for r in rows if r["drafter"] == "none"}
    rows = [{**r, "speedup": f"{r['aggregate_tok_s'] / base[r['n']]:.2f}x" if r["n"] in base else "—"} for r in rows]
    return markdown_table([("concurrency", "{n}", "r"), ("drafter", "{drafter}", "l"),
                           ("aggregate tok/s", "{aggregate_tok_s:.1f}", "r"),
                           ("per-request tok/s", "{request_tok_s:.1f}", "r"), ("commit", "{commit:.2f}", "r"),
                           ("speedup vs none", "{speedup}", "r")], rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench_batch", allow_abbrev=False)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--drafters", nargs="+", default=["none", "ngram", "oracle"], choices=list(DRAFTERS))
    p.add_argument("--self-layers", type=int, default=2, help="drafter self: the target's first N layers draft")
    p.add_argument("--context", type=int, default=256, help="prompt tokens per request")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--model", default="tiny", help="tiny (dummy weights) or a real model, e.g. smollm2-135m, whose "
                   "continuation of the repeated sentence NGRAM can predict")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    weights = ", dummy weights" if a.model == "tiny" else ""
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{cpu_name()}; {a.model}{weights}, fp32, page {a.page_size}, prompt {a.context} tokens, "
          f"{a.new_tokens} new tokens per request, median of {a.repeats} rounds (cells in lock step)", flush=True)
    print(f"load average at the start (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = measure([(d, n) for n in a.concurrency for d in a.drafters], a.context, a.new_tokens, a.repeats,
                   a.page_size, a.model, a.self_layers)
    for r in rows:
        print(f"  N={r['n']} {r['drafter']}: {r['aggregate_tok_s']:.1f} tok/s aggregate, {r['request_tok_s']:.1f} "
              f"per request, commit {r['commit']:.2f}, largest batch {r['batch']}", flush=True)
    print(format_table(rows))
    print(f"load average at the end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
