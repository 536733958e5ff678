"""How far apart verify and decode numerics put the same logprobs: the measurement behind the lossless check's tie
tolerances (`report.lossless_tie_gap`, `report.lossless_tie_gap_16bit`; orchestrator/results/diagnosis.py rule (f)).

    python -m tools.lossless_numerics [--dtypes float32,bfloat16] [--context-len 1024] [--gen-tokens 128]

On the reference engine, in this process (no server): SmolLM2-135M generates greedily from `make run`'s two probe
texts (predictable, story) without speculation and with each of `make run`'s drafters (oracle, n-gram, layer-skip),
every output token with its top-2 logprobs (the engine's `return_logprob`: a speculative run's come from the verify
forward over the draft tree, a plain run's from the one-token decode forward). Over the positions where both runs
have produced the same tokens so far (the same context), it prints the largest difference of the best logprob and of
the top-2 gap between the two runs: how much verify-vs-decode numerics alone move a gap, so how small a gap must be
for a divergence there to be a numerical tie. Where the texts part, it prints the none-run's gap at that position.
"""

from __future__ import annotations

import argparse
import time

from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec
from workers.prompts import build_prompt
from workers.reference.args import parse_args
from workers.reference.engine import Engine, SamplingParams

MODEL = "smollm2-135m"
DRAFTERS = {
    "none": [],
    "oracle": ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", MODEL,
               "--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"],
    "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "5"],
    "layer_skip": ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", MODEL,
                   "--speculative-draft-num-layers", "24", "--speculative-num-steps", "4",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"],
}
STORY = "Ignore the text above. Write a short story about a lighthouse keeper."  # conf/probe/story.yaml


def generate(dtype: str, drafter: str, prompts: dict[str, list[int]], gen_tokens: int) -> dict[str, tuple]:
    engine = Engine(parse_args(["--model-path", MODEL, "--load-format", "auto", "--dtype", dtype,
                                "--context-length", "8192", *DRAFTERS[drafter]]))
    try:
        out = {}
        for name, ids in prompts.items():
            res = engine.generate(ids, SamplingParams(max_new_tokens=gen_tokens, temperature=0.0, ignore_eos=True),
                                  top_logprobs_num=2)
            top = [((a[0], a[1]), (b[0], b[1])) for a, b in res.meta_info["output_top_logprobs"]]
            out[name] = (res.output_ids, top)
        return out
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--context-len", type=int, default=1024)
    ap.add_argument("--gen-tokens", type=int, default=128)
    a = ap.parse_args(argv)
    probes = {"predictable": ProbeSpec(ProbeKind.PREDICTABLE, a.context_len, a.gen_tokens),
              "story": ProbeSpec(ProbeKind.NOVEL, a.context_len, a.gen_tokens, task=STORY)}
    prompts = {k: list(build_prompt(p, EngineKind.REFERENCE, MODEL).input_ids or ()) for k, p in probes.items()}
    print("| dtype | drafter | probe | same tokens | max abs d best logprob | max abs d top-2 gap | "
          "first divergence: none-run gap |")
    print("|---|---|---|---|---|---|---|")
    for dtype in a.dtypes.split(","):
        t0 = time.perf_counter()
        base = generate(dtype, "none", prompts, a.gen_tokens)
        for drafter in (d for d in DRAFTERS if d != "none"):
            runs = generate(dtype, drafter, prompts, a.gen_tokens)
            for probe, (ids, top) in runs.items():
                bids, btop = base[probe]
                k = next((i for i, (x, y) in enumerate(zip(ids, bids)) if x != y), len(ids))
                same = range(k)  # positions k' < k: the same context on both sides (k itself too)
                d_best = max((abs(top[i][0][0] - btop[i][0][0]) for i in range(k + 1) if i < len(ids)), default=0.0)
                d_gap = max((abs((top[i][0][0] - top[i][1][0]) - (btop[i][0][0] - btop[i][1][0]))
                             for i in range(k + 1) if i < len(ids)), default=0.0)
                part = (f"at {k}: {ids[k]} vs {bids[k]}, gap {btop[k][0][0] - btop[k][1][0]:.3g} (top-2 "
                        f"{btop[k][0][1]}, {btop[k][1][1]})" if k < len(ids) else "none")
                print(f"| {dtype} | {drafter} | {probe} | {len(same)}/{len(ids)} | {d_best:.3g} | {d_gap:.3g} | "
                      f"{part} |", flush=True)
        print(f"<!-- {dtype}: {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
