"""SGLang's argv and server args: `python -m sglang.launch_server` argv and environment from a `ServerSpec`, and what
/server_info reports back. The one place a new SGLang flag is spelled (`build_sglang_argv`).

Public API:

    build_sglang_argv(server: ServerSpec, port: int, *, python: str = sys.executable) -> list[str]
    sglang_env(server: ServerSpec) -> dict[str, str]
    expected_server_args(server) -> dict          what SGLang's /server_info will report for the keys we track
    reported_server_args(info) -> dict            those keys from a /server_info answer (or ServerArgs.resolved_dict())
    server_arg_changes(server, info) -> list[str] where the server runs something other than the config asked

/server_info carries the resolved server args (0.5.23: `ServerArgs.resolved_dict()`; 0.5.10: the dataclass after
`__post_init__`). Known rewrites: NGRAM sets num_steps = num_draft_tokens // topk and topk = the max BFS breadth;
DFLASH forces num_steps = topk = 1; speculation sets max_running_requests = 48 when unset. Split prefill/decode
backends fall back to --attention-backend; TARGET_VERIFY runs on the prefill backend unless
--speculative-attention-mode decode (`specsweep_common.sglang_facts.resolved_backends`).

`engine.version` picks the flag names (`specsweep_common.sglang_facts.SGLANG_VERSIONS`; docs/sglang.md has the table).
Cross-field rules (what SGLang itself would reject at start-up) are checked at plan time by
`workers.sglang.rules.sglang_problems`; this module assumes a validated spec and only spells it.

With `attention=specsweep_verify` the server starts through `workers.sglang.launch`, which registers the
kernel plugin in every SGLang process before parsing (0.5.10 has no plugin entry points; on newer versions the
entry point registers it too and the wrapper's registration is a no-op repeat).
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from specsweep_common.spec import Algorithm, ServerSpec, SGLangOptions
from workers.sglang.cpu import cpu_env, served_model_path, sglang_python
from specsweep_common.sglang_facts import (DEVICE_TIMER_ENV, SGLANG_PLUGIN_BACKENDS, SPEC_MAX_RUNNING_REQUESTS,
                                          SGLangFacts, resolved_backends, sglang_draft_backend, sglang_facts)

LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def uses_plugin(server: ServerSpec) -> bool:
    a = server.attention
    return any(b in SGLANG_PLUGIN_BACKENDS for b in (a.backend, a.decode_backend, a.prefill_backend))


def _speculative_flags(server: ServerSpec, flags: SGLangFacts) -> list[str]:
    d = server.drafter
    if d.algorithm is Algorithm.NONE:
        return []
    argv = ["--speculative-algorithm", d.algorithm.value]
    if d.draft_model_path:
        draft = d.draft_model_path
        if server.engine.device == "cpu":
            draft = served_model_path(draft, sglang_python(server.engine))
        argv += ["--speculative-draft-model-path", draft]
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


def _option_flags(opts: SGLangOptions, flags: SGLangFacts) -> list[str]:
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
    if opts.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(opts.max_total_tokens)]
    return argv


def build_sglang_argv(server: ServerSpec, port: int, *, python: str = sys.executable) -> list[str]:
    """The full argv (interpreter first). Assumes `workers.sglang.rules.sglang_problems(...)` found nothing."""
    flags = sglang_facts(server.engine.version)
    m, a = server.model, server.attention
    module = "workers.sglang.launch" if uses_plugin(server) else "sglang.launch_server"
    model_path = m.path
    if server.engine.device == "cpu":  # SGLang's own interpreter and the model's HF directory (workers/sglang/cpu.py)
        python = sglang_python(server.engine)
        model_path = served_model_path(m.path, python)
    elif server.engine.python:
        python = server.engine.python
    # On CPU SGLang runs in its own interpreter: -P keeps the working directory (this checkout, whose egg-info
    # advertises our sglang.srt.plugins entry point to importlib.metadata) off its sys.path
    interpreter = [python, "-P"] if server.engine.device == "cpu" else [python]
    argv = [*interpreter, "-m", module,
            "--model-path", model_path, "--load-format", m.load_format, "--dtype", m.dtype,
            "--device", server.engine.device, "--tp-size", str(server.tp_size),
            "--context-length", str(server.server_context_len), "--page-size", str(server.page_size),
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
    # device time per forward into sglang:forward_execution_seconds_total (sglang/srt/environ.py:479,
    # managers/scheduler_components/metrics_reporter.py:325-341): the runs' verify_step_ms (workers.engine_counters)
    if server.engine.device == "cpu":  # the device timer is a torch.cuda.Event: none on CPU
        env = cpu_env()
    else:
        env = {DEVICE_TIMER_ENV: "1"}
    if server.server_context_len > server.model.max_context_len:
        env[LONGER_CONTEXT_ENV] = "1"  # else SGLang refuses a context beyond the model config's
    return env


# ServerArgs fields read from /server_info (and from resolved_dict() by workers/sglang/argcheck.py).
SERVER_INFO_FIELDS = (
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "speculative_attention_mode",
    "page_size", "context_length", "tp_size", "speculative_algorithm", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_draft_attention_backend",
    "speculative_draft_window_size", "max_running_requests",
)
# The keys we record (tags `sglang.<key>`): the fields above with the split backends resolved, and the verify one.
SERVER_ARG_KEYS = (
    "attention_backend", "prefill_backend", "decode_backend", "verify_backend", "page_size", "context_length",
    "tp_size", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_draft_attention_backend", "speculative_draft_window_size",
    "max_running_requests",
)
# Which config key asked for each recorded value (for the change notes).
_ASKED_BY = {
    "attention_backend": "attention.backend", "prefill_backend": "attention.prefill_backend",
    "decode_backend": "attention.decode_backend", "verify_backend": "attention.speculative_attention_mode",
    "page_size": "page_size", "context_length": "server_context_len", "tp_size": "tp_size",
    "speculative_algorithm": "drafter.algorithm", "speculative_num_steps": "drafter.num_steps",
    "speculative_eagle_topk": "drafter.topk", "speculative_num_draft_tokens": "drafter.num_draft_tokens",
    "speculative_draft_attention_backend": "attention.draft_backend",
    "speculative_draft_window_size": "drafter.draft_window_size",
    "max_running_requests": "engine.sglang.max_running_requests",
}


def _server_args(server: ServerSpec, *, predict: bool) -> dict[str, Any]:
    """predict=False: what the config asks (None = left to SGLang); True: what SGLang will run with."""
    a, d = server.attention, server.drafter
    r = resolved_backends(a, d.algorithm)
    opts = server.engine.sglang or SGLangOptions()
    spec = d.algorithm is not Algorithm.NONE
    out: dict[str, Any] = {"attention_backend": a.backend, "prefill_backend": r.prefill, "decode_backend": r.decode,
                           "verify_backend": r.verify, "page_size": server.page_size,
                           "context_length": server.server_context_len, "tp_size": server.tp_size,
                           "speculative_algorithm": d.algorithm.value if spec else None,
                           "max_running_requests": opts.max_running_requests}
    steps = topk = tokens = draft_backend = window = None
    if spec:
        steps, topk, tokens = d.num_steps, d.topk, d.num_draft_tokens
        draft_backend, window = sglang_draft_backend(a, d.algorithm), d.draft_window_size
        if predict:
            if d.algorithm is Algorithm.NGRAM:
                steps = tokens // topk
            elif d.algorithm is Algorithm.DFLASH:
                steps = topk = 1
                draft_backend = draft_backend or r.prefill
            if opts.max_running_requests is None:
                out["max_running_requests"] = SPEC_MAX_RUNNING_REQUESTS
    out.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens,
               speculative_draft_attention_backend=draft_backend, speculative_draft_window_size=window)
    return out


def expected_server_args(server: ServerSpec) -> dict[str, Any]:
    """The SERVER_ARG_KEYS values a validated spec's server reports (SGLang's known rewrites applied)."""
    return _server_args(server, predict=True)


def reported_server_args(info: Mapping[str, Any]) -> dict[str, Any]:
    """SERVER_ARG_KEYS from a /server_info answer: split backends fall back to attention_backend; verify is the
    decode backend with speculative_attention_mode=decode, else the prefill one (None without speculation)."""
    backend = info.get("attention_backend")
    prefill = info.get("prefill_attention_backend") or backend
    decode = info.get("decode_attention_backend") or backend
    spec = info.get("speculative_algorithm")
    verify = None if not spec else decode if info.get("speculative_attention_mode") == "decode" else prefill
    out = {k: info.get(k) for k in SERVER_ARG_KEYS}
    out.update(prefill_backend=prefill, decode_backend=decode, verify_backend=verify)
    return out


def server_arg_changes(server: ServerSpec, info: Mapping[str, Any]) -> list[str]:
    """One note per recorded value the server runs differently from what the config asked (keys the config
    leaves to SGLang are not compared)."""
    asked, ran = _server_args(server, predict=False), reported_server_args(info)
    return [f"SGLang runs {key}={ran[key]!r}, asked {_ASKED_BY[key]} -> {asked[key]!r}"
            for key in SERVER_ARG_KEYS if asked[key] is not None and ran[key] != asked[key]]


def max_draft_depth(args: Mapping[str, Any]) -> int | None:
    """The most drafts one verify step can accept, from reported server args: num_steps for the EAGLE family,
    num_draft_tokens - 1 for NGRAM and DFLASH (a linear block, or a tree of that many nodes below its root)."""
    algorithm = args.get("speculative_algorithm")
    if not algorithm:
        return None
    if algorithm in (Algorithm.NGRAM.value, Algorithm.DFLASH.value):
        tokens = args.get("speculative_num_draft_tokens")
        return tokens - 1 if isinstance(tokens, int) and tokens > 1 else None
    steps = args.get("speculative_num_steps")
    return steps if isinstance(steps, int) and steps > 0 else None


def server_arg_tags(args: Mapping[str, Any]) -> dict[str, str]:
    """`sglang.<key>` run tags of reported server args."""
    return {f"sglang.{k}": str(args.get(k)) for k in SERVER_ARG_KEYS}


__all__ = ["LONGER_CONTEXT_ENV", "SERVER_ARG_KEYS", "SERVER_INFO_FIELDS", "build_sglang_argv", "expected_server_args",
           "max_draft_depth", "reported_server_args", "server_arg_changes", "server_arg_tags", "sglang_env",
           "uses_plugin"]
