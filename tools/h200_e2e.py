"""Long-context speculative decode on one GPU: the reference engine's `torch` attention against the
`specsweep_verify` kernel (with and without CUDA graphs), Qwen3-8B-shaped, dummy weights, oracle drafter.

    python -m tools.h200_e2e --out $OUT            # 4k, 32k, 128k on cuda, bf16
    python -m tools.h200_e2e --device cpu --dtype float32 --layers 2 --hidden 256 ... (smoke)

No Ray, MLflow or Hydra: the engine is built in-process (`Engine(parse_args(...))`) and driven step by step.
The oracle is STANDALONE with the target as its own draft (same weights, its own KV pool), topk 1, 7 steps, so
every verify is a T = 8 chain. Per context the prompt's KV is not computed (a 128k prefill would cost minutes):
both pools get the same random K/V for positions [0, ctx) and decoding starts there; the step's work (7 draft
forwards + one T = 8 verify over ctx keys per layer) is what a real request does at that length.

Reported per (backend, context): verify-step ms (median; `verify_tree`'s forward + LM head + argmax), whole
decode-step ms (drafts + verify), committed tokens per step, decode tokens/s, and the verify floor =
(weight bytes + KV bytes) / measured copy bandwidth (specsweep_kernels.roofline). With CUDA graphs also the verify
graph's own time: `graph ms` = GPU time between events around the replay, `prep ms` = host time from the
runner's `forward` entry to the replay (filling the static inputs), `launch ms` = host time inside `replay()`
(medians). Dummy weights are drawn on the device (`--dummy-weights-on-device`: a CPU draw of 8B parameters
would take minutes).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specsweep_common.spec import kv_bytes_per_token

from workers.reference.args import parse_args
from workers.reference.cuda_graph import bucket_for, replay_summary
from workers.reference.engine import Engine, Request, SamplingParams
from workers.reference.model import CausalLM

logger = logging.getLogger(__name__)

QWEN3_8B = dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, vocab=151936)
BACKENDS = {"torch": ["--attention-backend", "torch"],
            "specsweep_verify": ["--attention-backend", "specsweep_verify"],
            "specsweep_verify_nograph": ["--attention-backend", "specsweep_verify", "--disable-cuda-graph"],
            "specsweep_verify_unfused": ["--attention-backend", "specsweep_verify", "--disable-fused-ops"]}


def write_config(d: Path, a: argparse.Namespace, max_pos: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim, "max_position_embeddings": max_pos, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "use_sliding_window": False, "eos_token_id": a.vocab - 1}))


def weight_bytes_per_forward(model: CausalLM) -> int:
    """Every parameter but the embedding table (a forward gathers T rows of it)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fill_random_kv(engine: Engine) -> None:
    """Same random K/V in the target's and the oracle draft's pools (so the oracle still agrees)."""
    pool = engine.target.pool
    gen = torch.Generator(device=pool.k.device).manual_seed(1234)
    for layer in range(pool.k.shape[0]):
        pool.k[layer].normal_(generator=gen)
        pool.v[layer].normal_(generator=gen)
    draft = getattr(engine.drafter, "runner", None)
    if draft is not None and draft.pool is not pool:
        draft.pool.k.copy_(pool.k)
        draft.pool.v.copy_(pool.v)


def _profile_table(prof, rows: int = 40) -> str:
    averages = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total"):  # the name changed across torch versions
        try:
            return averages.table(sort_by=key, row_limit=rows)
        except (AttributeError, KeyError, ValueError):
            continue
    return averages.table(row_limit=rows)


def run_context(engine: Engine, ctx: int, warmup: int, steps: int, seed: int,
                profile_to: Path | None = None) -> dict:
    device = engine.device
    rng = torch.Generator().manual_seed(seed + ctx)
    vocab = engine.config.vocab_size
    context = torch.randint(0, vocab - 1, (ctx + 1,), generator=rng).tolist()  # the prompt + first token
    seq = engine.target.new_sequence()
    seq.reserve(ctx)
    seq.length = ctx  # positions [0, ctx) hold (random) KV: a prefilled prompt
    engine.target.time_replays = hasattr(engine.target, "replay_times")
    drafter = engine.drafter
    draft_seq = drafter.runner.new_sequence()
    draft_seq.reserve(ctx)
    draft_seq.length = ctx
    gen = torch.Generator().manual_seed(seed)
    req = Request(context[:-1], SamplingParams(max_new_tokens=1 << 30, temperature=0.0, ignore_eos=True), gen,
                  seq=seq, draft=draft_seq, out=context[-1:])

    def step() -> list[int]:
        done = len(req.out)
        engine._step([req])
        return req.out[done:]

    step_s, verify_s, commits = [], [], []
    try:
        for i in range(warmup + steps):
            _sync(device)
            t0 = time.perf_counter()
            committed = step()
            _sync(device)
            dt = time.perf_counter() - t0
            if i < warmup:
                getattr(engine.target, "replay_times", []).clear()  # the warm-up's replays are not measured
            if i >= warmup:
                step_s.append(dt)
                verify_s.append(req.steps[-1]["verify_s"])
                commits.append(len(committed))
        if profile_to is not None:  # kernels of two more steps (7 draft forwards + 1 verify each), by GPU time
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities) as prof:
                for _ in range(2):
                    step()
                _sync(device)
            profile_to.write_text(_profile_table(prof))
    finally:
        seq.release()
        drafter.finish(draft_seq)
    step_med, verify_med = statistics.median(step_s), statistics.median(verify_s)
    graph = replay_summary(engine.target, bucket_for(engine.num_draft_tokens or 1))
    return {"ctx": ctx, "steps": steps, "step_ms": 1e3 * step_med, "verify_ms": 1e3 * verify_med,
            "draft_ms": 1e3 * (step_med - verify_med), "commit_mean": statistics.fmean(commits),
            "decode_tok_s": sum(commits) / sum(step_s), "verify_ms_all": [1e3 * v for v in verify_s],
            **(graph or {})}


def make_engine(model_dir: Path, backend: str, a: argparse.Namespace, context_length: int) -> Engine:
    argv = ["--model-path", str(model_dir), "--load-format", "dummy", "--dtype", a.dtype, "--device", a.device,
            "--context-length", str(context_length), "--page-size", str(a.page_size),
            "--chunked-prefill-size", "8192", "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", str(model_dir), "--speculative-num-steps", "7",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8", "--dummy-weights-on-device",
            *BACKENDS[backend]]
    return Engine(parse_args(argv))


def measured_bandwidth_gbs(device: torch.device) -> tuple[float, float | None]:
    if device.type != "cuda":
        return float("nan"), None
    from specsweep_kernels.roofline import measure_ceilings

    c = measure_ceilings(device)
    return c.copy_gbps, c.matmul_tflops


TABLE = (("backend", "backend", "<26", ""), ("ctx", "ctx", ">8", ""), ("verify ms", "verify_ms", ">11", ".2f"),
         ("floor ms", "floor_ms", ">10", ".2f"), ("x floor", "x_floor", ">9", ".2f"), ("step ms", "step_ms", ">10", ".1f"),
         ("draft ms", "draft_ms", ">10", ".1f"), ("commit", "commit_mean", ">8", ".2f"),
         ("tok/s", "decode_tok_s", ">9", ".1f"), ("vs torch", "speedup_vs_torch", ">10", ".2f"),
         ("graph ms", "graph_gpu_ms", ">10", ".2f"), ("prep ms", "prep_host_ms", ">9", ".3f"),
         ("launch ms", "launch_host_ms", ">11", ".3f"))  # (heading, row key, width, number format)


def table(rows: list[dict]) -> str:
    head = "".join(format(h, w) for h, _, w, _ in TABLE)
    nan = float("nan")  # a column the row lacks (no torch row to compare with, no CUDA graph)
    return "\n".join([head, "-" * len(head),
                      *("".join(format(r.get(k, nan), w + f) for _, k, w, f in TABLE) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in QWEN3_8B.items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768, 131072])
    p.add_argument("--backends", nargs="+", default=["torch", "specsweep_verify", "specsweep_verify_nograph"],
                   choices=list(BACKENDS))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="measured decode steps per (backend, context)")
    p.add_argument("--torch-steps", type=int, default=3, help="measured steps for the (slow) torch backend")
    p.add_argument("--out", type=Path, default=None, help="writes e2e.json, e2e.md here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="with --out: a torch.profiler kernel table of two steps per (backend, largest context)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = torch.device(a.device)
    context_length = max(a.contexts) + (a.warmup + max(a.steps, a.torch_steps) + 2) * 8 + 64
    tmp = Path(tempfile.mkdtemp(prefix="h200_e2e_"))
    model_dir = tmp / "qwen3-8b-shaped"
    write_config(model_dir, a, context_length)
    bw_gbs, mm_tflops = measured_bandwidth_gbs(device)
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "copy_gbps": bw_gbs,
            "matmul_tflops": mm_tflops, "shape": {k: getattr(a, k) for k in QWEN3_8B}, "dtype": a.dtype,
            "page_size": a.page_size}
    rows: list[dict] = []
    for backend in a.backends:
        t0 = time.perf_counter()
        engine = make_engine(model_dir, backend, a, context_length)
        wbytes = weight_bytes_per_forward(engine.model)
        cfg = engine.config
        kvb = kv_bytes_per_token(num_kv_heads=cfg.num_key_value_heads, k_head_dim=cfg.head_dim, v_head_dim=cfg.head_dim,
                                 elt=engine.target.pool.k.element_size(), num_layers=cfg.num_hidden_layers)
        info["weight_bytes"], info["kv_bytes_per_token"] = wbytes, kvb
        logger.info("%s: engine ready in %.1f s (weights %.2f GB, %s)", backend, time.perf_counter() - t0,
                    wbytes / 1e9, type(engine.target).__name__)
        for ctx in a.contexts:
            steps = a.torch_steps if backend == "torch" else a.steps
            fill_random_kv(engine)  # per context: the previous context's decode wrote (different) K/V into both pools
            profile_to = (a.out / f"profile-{backend}-{ctx}.txt"
                          if a.profile and a.out and ctx == max(a.contexts) else None)
            if profile_to is not None:
                a.out.mkdir(parents=True, exist_ok=True)
            try:
                r = run_context(engine, ctx, a.warmup, steps, a.seed, profile_to)
            except torch.OutOfMemoryError as e:
                logger.error("%s ctx %d: out of memory: %s", backend, ctx, e)
                continue
            floor_ms = 1e3 * (wbytes + kvb * ctx) / (bw_gbs * 1e9) if bw_gbs == bw_gbs else float("nan")
            r.update(backend=backend, floor_ms=floor_ms, x_floor=r["verify_ms"] / floor_ms if floor_ms else 0.0,
                     graph_replays=getattr(engine.target, "replays", None),
                     kv_gb=kvb * ctx / 1e9, kv_bw_gbs=kvb * ctx / (r["verify_ms"] / 1e3) / 1e9)
            rows.append(r)
            logger.info("%s ctx %d: verify %.2f ms (floor %.2f), step %.1f ms, %.1f tok/s", backend, ctx,
                        r["verify_ms"], floor_ms, r["step_ms"], r["decode_tok_s"])
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    torch_ms = {r["ctx"]: r["verify_ms"] for r in rows if r["backend"] == "torch"}
    for r in rows:
        if r["ctx"] in torch_ms:
            r["speedup_vs_torch"] = torch_ms[r["ctx"]] / r["verify_ms"]
    text = table(rows)
    header = (f"{info['date']} {info['device']} torch {info['torch']}, {a.dtype}, page {a.page_size}; copy "
              f"bandwidth {bw_gbs:.0f} GB/s; weights {info.get('weight_bytes', 0) / 1e9:.2f} GB/forward; "
              f"KV {info.get('kv_bytes_per_token', 0)} B/token")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "e2e.json").write_text(json.dumps({"info": info, "rows": rows}, indent=2))
        (a.out / "e2e.md").write_text(header + "\n\n```\n" + text + "\n```\n")
    print(header)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
