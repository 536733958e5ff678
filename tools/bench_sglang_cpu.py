"""`make bench-sglang-cpu`: the reference engine and live SGLang (engine=sglang_cpu) side by side on this machine's
CPU: the same model (SmolLM2-135M, the GGUF's float32 weights), the same token-exact prompts, greedy decoding
without speculation. Per probe text and context: whether SGLang's tokens equal the reference engine's (and the first
position where they part), and each engine's decode tok/s (median over --repeats requests; the probe's own
`decode_tok_s`). Both servers are started the way a sweep starts them (config from conf/, the adapters' argv,
`workers.engine_process.EngineProcess`), one at a time so they never share the cores.

    python -m tools.bench_sglang_cpu [--contexts 512,2048] [--gen 32] [--repeats 3]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.config.plan import build_server
from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec, ServerSpec
from tools.bench_engine import cpu_name
from tools.composed_config import compose_run
from workers.engine_process import EngineProcess
from workers.http_client import ProbeClient
from workers.measurement import measure
from workers.prompts import build_prompt

logger = logging.getLogger("bench-sglang-cpu")
ENGINES = {"reference": ("engine=reference", "attention=torch"),
           "sglang_cpu": ("engine=sglang_cpu", "attention=torch_native")}
KINDS = (ProbeKind.PREDICTABLE, ProbeKind.NOVEL)


def _serve(name: str, context: int, log_dir: Path) -> tuple[EngineProcess, ServerSpec]:
    rc = compose_run(*ENGINES[name], "drafter=none", "model=smollm2-135m", "page_size=1",
                     f"server_context_len={context + 64}")
    spec = build_server(rc)
    return EngineProcess.for_server(spec, log_dir / f"{name}-{context}.log"), spec


def run(contexts: list[int], gen: int, repeats: int) -> list[dict]:
    rows: dict[tuple, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ENGINES:
            for context in contexts:
                engine, spec = _serve(name, context, Path(tmp))
                t0 = time.perf_counter()
                with engine:
                    start_s = time.perf_counter() - t0
                    client = ProbeClient(engine.base_url, 1800)
                    try:
                        for kind in KINDS:
                            probe = ProbeSpec(kind=kind, context_len=context, gen_tokens=gen)
                            # the reference engine's prompt: token-exact for both (same tokenizer, input_ids)
                            prompt = build_prompt(probe, EngineKind.REFERENCE, spec.model.path)
                            rates, ids = [], None
                            for _ in range(repeats):
                                client.flush_cache()
                                g = client.generate(prompt, gen, 0.0)
                                rates.append(measure(g, expect_spec=False).metrics["decode_tok_s"])
                                ids = g.output_ids
                            row = rows.setdefault((kind.value, context), {"probe": kind.value, "context": context})
                            row[f"{name}_tok_s"] = statistics.median(rates)
                            row[f"{name}_ids"] = ids
                            row[f"{name}_start_s"] = start_s
                    finally:
                        client.close()
    out = []
    for row in rows.values():
        a, b = row.pop("reference_ids"), row.pop("sglang_cpu_ids")
        row["first_divergence"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        row["tokens_equal"] = a == b
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = run([int(c) for c in args.contexts.split(",")], args.gen, args.repeats)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_name()}; greedy, no speculation, "
          f"{args.gen} tokens, median of {args.repeats}")
    print("| probe | context | tokens equal | first divergence | reference tok/s | SGLang tok/s | SGLang / reference |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        div = "—" if r["first_divergence"] is None else str(r["first_divergence"])
        print(f"| {r['probe']} | {r['context']} | {'yes' if r['tokens_equal'] else 'no'} | {div} | "
              f"{r['reference_tok_s']:.1f} | {r['sglang_cpu_tok_s']:.1f} | "
              f"{r['sglang_cpu_tok_s'] / r['reference_tok_s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
