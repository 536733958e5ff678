"""Command line: SGLang's flag names wherever SGLang has the flag; validated once, exit 2 on bad input."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsweep_common.builtin_models import GGUF_MODELS
from specsweep_common.sglang_facts import SPEC_MAX_RUNNING_REQUESTS
from specsweep_common.spec import Algorithm

from .config import BUILTIN_CONFIGS, LOAD_FORMATS
from .gguf_checkpoint import resolve_gguf
from .spec_counters import DEFAULT_DECODE_LOG_INTERVAL


# --speculative-algorithm values this engine serves (SGLang's names); the plan-time rules (rules.py) read them too
ALGORITHMS = tuple(a.value for a in (Algorithm.NONE, Algorithm.NGRAM, Algorithm.STANDALONE))
DEFAULT_MAX_RUNNING_REQUESTS = SPEC_MAX_RUNNING_REQUESTS  # SGLang's cap with speculation (rules.py plans with it)
IGNORED = ("--mem-fraction-static", "--tp-size", "--log-level-http",
           "--trust-remote-code", "--skip-server-warmup",
           "--speculative-ngram-min-bfs-breadth", "--speculative-ngram-match-type",
           "--speculative-ngram-branch-length", "--speculative-ngram-capacity")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def context_int(text: str) -> int:
    """SGLang's human-readable ints: 32k = 32000, 32Ki = 32768."""
    t = text.strip()
    for suffix, mult in (("Ki", 1024), ("Mi", 1024 ** 2), ("k", 1000), ("K", 1000), ("M", 1000 ** 2)):
        if t.endswith(suffix):
            return positive_int(str(int(float(t[: -len(suffix)]) * mult)))
    return positive_int(t)


class OneLineParser(argparse.ArgumentParser):
    """Errors are one line on stderr and exit status 2."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m workers.reference", allow_abbrev=False,
        description="specsweep reference engine: a small PyTorch speculative-decoding server with SGLang's "
                    "flag names and HTTP API. Continuous batching: up to --max-running-requests requests "
                    "decode together (one batched forward per step); no prefix cache.",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model-path", required=True,
                   help=f"built-in config ({', '.join(BUILTIN_CONFIGS)}), a Llama .gguf file or a known GGUF model "
                        f"({', '.join(GGUF_MODELS)}), or a Qwen3 safetensors checkpoint dir")
    m.add_argument("--load-format", default="auto", choices=LOAD_FORMATS,
                   help="dummy = deterministic random weights seeded by --random-seed; auto = what the path holds")
    m.add_argument("--dummy-weights-on-device", action="store_true",
                   help="reference engine only: with --load-format dummy, allocate the weights on --device and "
                        "draw them there (seconds for an 8B model on a GPU instead of minutes on the CPU; other "
                        "values than the CPU draw for the same seed)")
    m.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto = float32")
    m.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    m.add_argument("--random-seed", type=int, default=0)
    m.add_argument("--enable-deterministic-inference", action="store_true",
                   help="a sampled request without a seed is seeded with 42, as SGLang (sampling_batch_info.py:"
                        "157-171); without it such requests draw from the server's generator, each its own sample")
    m.add_argument("--context-length", type=context_int, default=None,
                   help="max prompt + new tokens per request (default: the model's max_position_embeddings)")
    m.add_argument("--tokenizer-path", default=None, help="accepted; the model path's tokenizer is used")
    kv = p.add_argument_group("KV cache and attention")
    # SGLang's own default, not a copy of the orchestrator's (it always passes --page-size): the field is None
    # (sglang/srt/arg_groups/fields/schedule.py:143-145) and resolves to 1 on CUDA and CPU
    # (sglang/srt/arg_groups/overrides.py:1341-1362, `_page_size_default`).
    kv.add_argument("--page-size", type=positive_int, default=1)
    kv.add_argument("--max-total-tokens", type=positive_int, default=None,
                    help="KV pool size in tokens (default: context length + draft headroom)")
    kv.add_argument("--attention-backend", default="torch", help="torch (CPU default) or specsweep_verify (CUDA)")
    kv.add_argument("--max-running-requests", type=positive_int, default=DEFAULT_MAX_RUNNING_REQUESTS,
                    help="requests decoded together in one batched step; more wait (FIFO). A request also waits "
                         "while the KV pool (--max-total-tokens) cannot hold its prompt + max_new_tokens + draft "
                         f"headroom next to the running ones (default {DEFAULT_MAX_RUNNING_REQUESTS}, SGLang's "
                         "cap with speculation)")
    kv.add_argument("--chunked-prefill-size", type=int, default=2048, help="tokens per prefill chunk; <= 0: one chunk")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", default=None, type=str.upper, choices=ALGORITHMS)
    s.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None,
                   help="STANDALONE draft: a built-in config (e.g. tiny-draft), a checkpoint dir, or the target "
                        "itself (the oracle)")
    s.add_argument("--speculative-draft-load-format", default=None, choices=LOAD_FORMATS)
    s.add_argument("--speculative-draft-num-layers", type=positive_int, default=None,
                   help="reference engine only (SGLang has no such flag): STANDALONE drafts with N of the draft "
                        "model's decoder layers, the first ceil(N/2) and the last floor(N/2) (the middle ones "
                        "skipped), then its final norm and LM head. Draft path = the target: self-speculation "
                        "reading the target's KV of those layers")
    s.add_argument("--speculative-num-steps", type=positive_int, default=None, help="tree depth (default 3; NGRAM: num_draft_tokens // topk)")
    s.add_argument("--speculative-eagle-topk", type=positive_int, default=None, help="tree branching (default 1)")
    s.add_argument("--speculative-num-draft-tokens", type=positive_int, default=None,
                   help="max tree nodes incl. the root (default num_steps*topk+1; num_steps+1 when topk is 1, "
                        "except NGRAM, which keeps it, default 12, as SGLang)")
    s.add_argument("--speculative-ngram-min-match-window-size", type=positive_int, default=1)
    s.add_argument("--speculative-ngram-max-match-window-size", type=positive_int, default=12)
    s.add_argument("--speculative-ngram-max-bfs-breadth", type=positive_int, default=None,
                   help="NGRAM: tree breadth when --speculative-eagle-topk is not given")
    srv = p.add_argument_group("server")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=30000)
    srv.add_argument("--enable-metrics", action="store_true", help="accepted; /metrics is always on")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    srv.add_argument("--decode-log-interval", type=positive_int, default=DEFAULT_DECODE_LOG_INTERVAL,
                     help="decode iterations per window of /server_info's avg_spec_accept_length and of the "
                          "sglang:spec_accept_length gauge, as SGLang (workers/reference/spec_counters.py)")
    srv.add_argument("--served-model-name", default=None)
    srv.add_argument("--export-metrics-to-file", action="store_true",
                     help="one JSON line per finished request (its meta_info) in --export-metrics-to-file-dir, as "
                          "SGLang (workers/reference/request_export.py)")
    srv.add_argument("--export-metrics-to-file-dir", default=None)
    srv.add_argument("--disable-cuda-graph", action="store_true",
                     help="run decode/verify eagerly (graphs are used only with specsweep_verify on CUDA)")
    srv.add_argument("--disable-fused-ops", action="store_true",
                     help="run norms, RoPE, the KV store and SiLU as torch ops instead of the fused Triton "
                          "kernels (kernels/specsweep_kernels/fused_ops.py; used on CUDA only)")
    for flag in IGNORED:
        if flag in ("--trust-remote-code", "--skip-server-warmup"):
            srv.add_argument(flag, action="store_true", help="accepted and ignored")
        else:
            srv.add_argument(flag, default=None, help="accepted and ignored")
    return p


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Cross-field defaults and checks (SGLang's rules where they apply); parser.error -> exit 2."""
    if args.export_metrics_to_file and not args.export_metrics_to_file_dir:  # SGLang's rule (its validation hook)
        parser.error("--export-metrics-to-file needs --export-metrics-to-file-dir")
    algo = args.speculative_algorithm or "NONE"
    args.speculative_algorithm = algo
    if args.speculative_draft_num_layers is not None and algo != "STANDALONE":
        parser.error(f"--speculative-draft-num-layers needs --speculative-algorithm STANDALONE, got {algo}")
    if algo == "NONE":
        return args
    if algo == "STANDALONE" and not args.speculative_draft_model_path:
        parser.error("--speculative-algorithm STANDALONE needs --speculative-draft-model-path")
    if args.speculative_eagle_topk is None:
        args.speculative_eagle_topk = (args.speculative_ngram_max_bfs_breadth or 1) if algo == "NGRAM" else 1
    topk = args.speculative_eagle_topk
    if algo == "NGRAM":
        # SGLang's NGRAM keeps the draft-token count it is given (12 when unset) and derives the steps from it,
        # num_draft_tokens // topk, when they are unset (`_handle_ngram`, sglang/srt/arg_groups/speculative_hook.py:
        # 1314-1330); its drafter fills a tree of num_draft_tokens nodes and verifies them all
        # (sglang/srt/speculative/ngram_worker.py:99-120), so the chain forcing below is not its rule.
        if args.speculative_num_draft_tokens is None:
            args.speculative_num_draft_tokens = 12
        if args.speculative_num_steps is None:
            args.speculative_num_steps = args.speculative_num_draft_tokens // topk
    else:
        if args.speculative_num_steps is None:
            args.speculative_num_steps = 3
        steps = args.speculative_num_steps
        if topk == 1:
            # as SGLang's EAGLE family: forced for chains (speculative_hook.py:1255-1266)
            args.speculative_num_draft_tokens = steps + 1
        elif args.speculative_num_draft_tokens is None:
            args.speculative_num_draft_tokens = steps * topk + 1
    if args.speculative_num_draft_tokens < 2:
        parser.error("--speculative-num-draft-tokens must be >= 2 (the root plus at least one draft)")
    if args.speculative_ngram_min_match_window_size > args.speculative_ngram_max_match_window_size:
        parser.error("--speculative-ngram-min-match-window-size exceeds --speculative-ngram-max-match-window-size")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, path in (("--model-path", args.model_path),
                       ("--speculative-draft-model-path", args.speculative_draft_model_path)):
        if path is None or path in BUILTIN_CONFIGS or (Path(path) / "config.json").is_file():
            continue
        if path in GGUF_MODELS or path.endswith(".gguf"):
            try:
                resolve_gguf(path)
            except FileNotFoundError as exc:
                parser.error(f"{flag}: {exc}")
            continue
        parser.error(f"{flag} {path!r} is neither a built-in config ({', '.join(BUILTIN_CONFIGS)}), a .gguf file, "
                     f"a known GGUF model ({', '.join(GGUF_MODELS)}) nor a directory with a config.json")
    args = resolve(args, parser)
    if args.speculative_draft_num_layers is not None:
        from .model_source import load_config  # a GGUF's config: read once, cached for the engine

        layers = load_config(args.speculative_draft_model_path).num_hidden_layers
        if args.speculative_draft_num_layers > layers:
            parser.error(f"--speculative-draft-num-layers {args.speculative_draft_num_layers}: the draft model "
                         f"{args.speculative_draft_model_path!r} has {layers} layers (allowed 1..{layers})")
    from .attention import ATTENTION_BACKENDS  # imports torch: only once the cheap checks passed

    if args.attention_backend not in ATTENTION_BACKENDS:
        parser.error(f"argument --attention-backend: invalid choice: {args.attention_backend!r} "
                     f"(choose from {', '.join(sorted(ATTENTION_BACKENDS))})")
    return args
