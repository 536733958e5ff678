"""`python -m tools.bench_model` (`make bench-model`): the reference engine on the real default model
(SmolLM2-135M-Instruct, fp32, CPU, batch 1).

Prints model load time (cold: a fresh conversion cache, i.e. dequantise the GGUF and write the safetensors;
cached: read them back) and, per context x probe x drafter, prefill tok/s (prompt / time to first token),
decode tok/s ((completion - 1) / (e2e - ttft)) and commit (tokens per verify step, bonus included) — the probe's
own prompts (workers/prompts.py), one request per cell.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time

import torch

from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec
from workers.prompts import build_prompt

from workers.reference import gguf_checkpoint
from workers.reference.args import parse_args
from tools.bench_engine import cpu_name, markdown_table
from workers.reference.engine import Engine, SamplingParams

MODEL = "smollm2-135m"
DRAFT = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", MODEL, "--speculative-num-steps", "4"]
DRAFTERS = {
    "none": [],
    "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4"],
    "oracle": DRAFT,
    "layer_skip": [*DRAFT, "--speculative-draft-num-layers", "24"],
}


def engine_argv(drafter: str, context_len: int) -> list[str]:
    return ["--model-path", MODEL, "--page-size", "16", "--context-length", str(context_len), *DRAFTERS[drafter]]


def time_load(context_len: int) -> tuple[float, float]:
    """(cold s, cached s): Engine construction with an empty conversion cache, then again reading it back."""
    old = os.environ.get(gguf_checkpoint.CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="specsweep-bench-cache-") as tmp:
        os.environ[gguf_checkpoint.CACHE_ENV] = tmp
        try:
            times = []
            for _ in range(2):
                gguf_checkpoint.prepare_gguf.cache_clear()
                t0 = time.perf_counter()
                Engine(parse_args(engine_argv("none", context_len)))
                times.append(time.perf_counter() - t0)
        finally:
            gguf_checkpoint.prepare_gguf.cache_clear()
            if old is None:
                os.environ.pop(gguf_checkpoint.CACHE_ENV, None)
            else:
                os.environ[gguf_checkpoint.CACHE_ENV] = old
    return times[0], times[1]


def measure(engine: Engine, ids: list[int], new_tokens: int) -> dict:
    out = engine.generate(ids, SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True))
    m = out.meta_info
    steps = m.get("spec_steps") or []
    return {"prefill_tok_s": len(ids) / m["ttft"], "ttft_s": m["ttft"],
            "decode_tok_s": (len(out.output_ids) - 1) / (m["e2e_latency"] - m["ttft"]),
            "commit": statistics.fmean(s["accept_len"] for s in steps) if steps else 1.0}


def format_table(rows: list[dict]) -> str:
    return markdown_table([("context", "{ctx}", "r"), ("probe", "{probe}", "l"), ("drafter", "{drafter}", "l"),
                           ("prefill tok/s", "{prefill_tok_s:.0f}", "r"), ("prefill s", "{ttft_s:.2f}", "r"),
                           ("decode tok/s", "{decode_tok_s:.1f}", "r"), ("commit", "{commit:.2f}", "r")], rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench_model", allow_abbrev=False)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 8160])
    p.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=list(DRAFTERS))
    p.add_argument("--new-tokens", type=int, default=32)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())  # noqa: E731
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}, {cpu_name()}; {MODEL} fp32, batch 1, page 16, {a.new_tokens} new tokens, "
          f"one request per cell", flush=True)
    print(f"load average at the start (1/5/15 min): {load()}", flush=True)
    context_len = max(a.contexts) + a.new_tokens
    cold, cached = time_load(context_len)
    print(f"model load: cold (dequantise + write cache) {cold:.2f} s, cached {cached:.2f} s", flush=True)
    rows = []
    for drafter in a.drafters:
        engine = Engine(parse_args(engine_argv(drafter, context_len)))
        for ctx in a.contexts:
            for kind in (ProbeKind.PREDICTABLE, ProbeKind.NOVEL):
                probe = ProbeSpec(kind=kind, context_len=ctx, gen_tokens=a.new_tokens)
                prompt_ids = build_prompt(probe, EngineKind.REFERENCE, MODEL).input_ids
                if prompt_ids is None:
                    raise RuntimeError(f"build_prompt gave no token ids for engine=reference, model {MODEL}")
                ids = list(prompt_ids)
                r = {"ctx": ctx, "probe": kind.value, "drafter": drafter, **measure(engine, ids, a.new_tokens)}
                rows.append(r)
                print(f"  ctx={ctx} {kind.value} {drafter}: prefill {r['prefill_tok_s']:.0f} tok/s, decode "
                      f"{r['decode_tok_s']:.1f} tok/s, commit {r['commit']:.2f}", flush=True)
        engine.close()
    rows.sort(key=lambda r: (r["ctx"], r["probe"] != "predictable", list(DRAFTERS).index(r["drafter"])))
    print(format_table(rows))
    print(f"load average at the end (1/5/15 min): {load()}")


if __name__ == "__main__":
    main()
