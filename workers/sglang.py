"""The SGLang engine adapter: `python -m sglang.launch_server` argv and environment from a `ServerSpec`.

Public API:

    build_sglang_argv(server: ServerSpec, port: int, *, python: str = sys.executable) -> list[str]
    sglang_env(server: ServerSpec) -> dict[str, str]
    flag_set(version: str) -> FlagSet            the flag names of one supported SGLang version
    SGLangAdapter                                 the `EngineAdapter` for EngineKind.SGLANG (workers/engine.py)

`engine.version` picks the flag set (`FLAG_SETS`; shared/docs/sglang-facts.md §0, docs/sglang.md has the table).
Cross-field rules (what SGLang itself would reject at start-up) are checked at plan time by
`orchestrator.validate.sglang_problems`; this module assumes a validated spec and only spells it.

With `attention=specsweep_verify` the server starts through `workers.sglang_launch`, which registers the
kernel plugin in every SGLang process before parsing (0.5.10 has no plugin entry points; on newer versions the
entry point registers it too and the wrapper's registration is a no-op repeat).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from orchestrator.spec import Algorithm, EngineKind, ServerSpec, SGLangOptions
from orchestrator.validate import SGLANG_PLUGIN_BACKENDS, sglang_draft_backend

LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@dataclass(frozen=True)
class FlagSet:
    """What differs between SGLang versions on the command line."""

    version: str
    cuda_graph_max_bs: str  # the decode-batch capture limit
    disable_cuda_graph: tuple[str, ...]
    dflash: bool  # --speculative-algorithm DFLASH and --speculative-dflash-block-size exist
    draft_window: bool  # --speculative-draft-window-size exists
    plugin_entry_points: bool  # sglang.srt.plugins loads `sglang.srt.plugins` entry points


FLAG_SETS: dict[str, FlagSet] = {
    "0.5.10": FlagSet(version="0.5.10", cuda_graph_max_bs="--cuda-graph-max-bs",
                      disable_cuda_graph=("--disable-cuda-graph",), dflash=False, draft_window=False,
                      plugin_entry_points=False),
    # 0.5.20 removed --cuda-graph-max-bs (argparse: "ambiguous option"); --disable-cuda-graph is deprecated.
    "0.5.23": FlagSet(version="0.5.23", cuda_graph_max_bs="--cuda-graph-max-bs-decode",
                      disable_cuda_graph=("--cuda-graph-backend-decode", "disabled",
                                          "--cuda-graph-backend-prefill", "disabled"),
                      dflash=True, draft_window=True, plugin_entry_points=True),
}


def flag_set(version: str) -> FlagSet:
    try:
        return FLAG_SETS[version]
    except KeyError:
        raise ValueError(f"SGLang {version!r} has no flag set; supported: {', '.join(FLAG_SETS)}") from None


def uses_plugin(server: ServerSpec) -> bool:
    a = server.attention
    return any(b in SGLANG_PLUGIN_BACKENDS for b in (a.backend, a.decode_backend, a.prefill_backend))


def _speculative_flags(server: ServerSpec, flags: FlagSet) -> list[str]:
    d = server.drafter
    if d.algorithm is Algorithm.NONE:
        return []
    argv = ["--speculative-algorithm", d.algorithm.value]
    if d.draft_model_path:
        argv += ["--speculative-draft-model-path", d.draft_model_path]
    if d.algorithm is Algorithm.NGRAM:
        # NGRAM's tree breadth is --speculative-ngram-max-bfs-breadth (default 10); SGLang copies it into topk.
        argv += ["--speculative-num-draft-tokens", str(d.num_draft_tokens),
                 "--speculative-ngram-min-bfs-breadth", "1",
                 "--speculative-ngram-max-bfs-breadth", str(d.topk)]
    elif d.algorithm is Algorithm.DFLASH:
        # num_steps = topk = 1 are forced by SGLang; the block size is the number of draft tokens.
        argv += ["--speculative-dflash-block-size", str(d.num_draft_tokens)]
    else:
        argv += ["--speculative-num-steps", str(d.num_steps), "--speculative-eagle-topk", str(d.topk),
                 "--speculative-num-draft-tokens", str(d.num_draft_tokens)]
    if d.draft_window_size is not None:
        argv += ["--speculative-draft-window-size", str(d.draft_window_size)]
    if server.attention.speculative_attention_mode:
        argv += ["--speculative-attention-mode", server.attention.speculative_attention_mode]
    draft_backend = sglang_draft_backend(server.attention, d.algorithm)
    if draft_backend:
        argv += ["--speculative-draft-attention-backend", draft_backend]
    return argv


def _option_flags(opts: SGLangOptions, flags: FlagSet) -> list[str]:
    argv: list[str] = []
    if opts.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(opts.mem_fraction_static)]
    if opts.disable_cuda_graph:
        argv += list(flags.disable_cuda_graph)
    elif opts.cuda_graph_max_bs is not None:
        argv += [flags.cuda_graph_max_bs, str(opts.cuda_graph_max_bs)]
    if opts.max_running_requests is not None:
        argv += ["--max-running-requests", str(opts.max_running_requests)]
    if opts.log_level:
        argv += ["--log-level", opts.log_level]
    return argv


def build_sglang_argv(server: ServerSpec, port: int, *, python: str = sys.executable) -> list[str]:
    """The full argv (interpreter first). Assumes `orchestrator.validate.sglang_problems(...)` found nothing."""
    flags = flag_set(server.engine.version)
    m, a = server.model, server.attention
    module = "workers.sglang_launch" if uses_plugin(server) else "sglang.launch_server"
    argv = [python, "-m", module,
            "--model-path", m.path, "--load-format", m.load_format, "--dtype", m.dtype,
            "--device", server.engine.device, "--tp-size", str(server.tp_size),
            "--context-length", str(server.context_length), "--page-size", str(server.page_size),
            "--attention-backend", a.backend]
    if server.nnodes > 1:
        argv += ["--nnodes", str(server.nnodes)]
    for flag, value in (("--decode-attention-backend", a.decode_backend),
                        ("--prefill-attention-backend", a.prefill_backend)):
        if value:
            argv += [flag, value]
    argv += _speculative_flags(server, flags)
    argv += _option_flags(server.engine.sglang or SGLangOptions(), flags)
    argv += ["--random-seed", str(server.seed), "--enable-metrics", "--host", server.host, "--port", str(port)]
    return argv + list(server.drafter.extra_args) + list(server.engine.extra_args)


def sglang_env(server: ServerSpec) -> dict[str, str]:
    env: dict[str, str] = {}
    if server.context_length > server.model.max_context_len:
        env[LONGER_CONTEXT_ENV] = "1"  # else SGLang refuses a context beyond the model config's
    return env


class SGLangAdapter:
    """`EngineAdapter` for SGLang (see workers/engine.py)."""

    kind = EngineKind.SGLANG
    health_path = "/health"

    def build_argv(self, server: ServerSpec, port: int) -> list[str]:
        return build_sglang_argv(server, port)

    def env(self, server: ServerSpec) -> dict[str, str]:
        return sglang_env(server)


__all__ = ["FLAG_SETS", "FlagSet", "LONGER_CONTEXT_ENV", "SGLangAdapter", "build_sglang_argv",
           "flag_set", "sglang_env", "uses_plugin"]
