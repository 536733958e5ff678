"""Validation of typed run configs, before any Ray, MLflow or engine work.

Every rule returns `Problem(key, value, allowed)`; a sweep collects the problems of all its points
and raises one `ConfigError` listing each. Engine rules follow what the engines themselves reject
(SGLang 0.5.23's choices, `sglang/srt/arg_groups/choices.py:69`; the reference engine's flag subset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# the problem type and the key checks live in orchestrator.config.problems and .keys; importable from here too
from orchestrator.config.keys import LEAF as LEAF, OPEN as OPEN, config_key_problems as config_key_problems
from orchestrator.config.keys import did_you_mean as did_you_mean, unknown_key_problem as unknown_key_problem
from orchestrator.config.problems import ConfigError as ConfigError, Problem
from orchestrator.config.probe_file import probe_file_problem as probe_file_problem
from orchestrator.config.log_pattern_rules import LOG_PATTERN_ALLOWED as LOG_PATTERN_ALLOWED, log_pattern_problems
from orchestrator.config.context import (check_context, every_point_over_context as every_point_over_context,
                                         reserved_tokens as reserved_tokens, server_context_len)
from orchestrator.config.validate_startup import startup_problems
from specsweep_vocab.builtin_models import BUILTIN_MODELS
from specsweep_vocab.spec import STUB_FLAGS, Algorithm, AttentionKind, EngineKind, JobKind, ProbeKind, StubOptions
from specsweep_vocab.sglang_facts import (SGLANG_BACKEND_PAGE_SIZES, SGLANG_DRAFT_BACKENDS,
                                          SGLANG_EAGLE_DRAFT_WORKER_BACKENDS, SGLANG_PLUGIN_BACKENDS,
                                          SGLANG_VERSIONS, SPEC_MAX_RUNNING_REQUESTS, resolved_backends,
                                          sglang_draft_backend)

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig


# Reference engine: what workers/reference accepts.
REFERENCE_BACKENDS = ("torch", "specsweep_verify")
REFERENCE_ALGORITHMS = (Algorithm.NONE, Algorithm.NGRAM, Algorithm.STANDALONE)
EAGLE_FAMILY = (Algorithm.EAGLE, Algorithm.EAGLE3, Algorithm.STANDALONE)
NEEDS_DRAFT_PATH = (Algorithm.STANDALONE, Algorithm.EAGLE3, Algorithm.DFLASH)
SPECULATIVE_ATTENTION_MODES = ("prefill", "decode")  # SGLang --speculative-attention-mode choices


def validate_run(rc: RunConfig, *, check_max_context: bool = True) -> list[Problem]:
    """Every problem of one grid point. In a sweep, `check_max_context=False`: over-max points are
    dropped at planning, not errors."""
    out: list[Problem] = []

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    def at_least(key: str, value: int, low: int) -> None:
        if value < low:
            bad(key, value, f"an integer >= {low}")

    at_least("page_size", rc.page_size, 1)
    out += log_pattern_problems(rc)
    if rc.job is JobKind.KERNEL:  # no engine, model, drafter or probe: the shape and where it runs
        return out + kernel_problems(rc) + _driver_problems(rc)
    at_least("context_len", rc.probe.context_len, 1)
    at_least("gen_tokens", rc.probe.gen_tokens, 1)
    at_least("probe.concurrency", rc.probe.concurrency, 1)
    mode = rc.attention.speculative_attention_mode
    if mode is not None and mode not in SPECULATIVE_ATTENTION_MODES:
        bad("attention.speculative_attention_mode", mode, "null or one of " + ", ".join(SPECULATIVE_ATTENTION_MODES))
    elif mode is not None and rc.engine.kind is not EngineKind.SGLANG:
        bad("attention.speculative_attention_mode", mode,
            f"null on engine={rc.engine.kind.value} (an SGLang flag: which split backend verifies)")
    at_least("tp_size", rc.tp_size, 1)
    at_least("nnodes", rc.nnodes, 1)
    if rc.nnodes >= 1 and rc.tp_size % rc.nnodes:
        bad("tp_size", rc.tp_size, f"a multiple of nnodes={rc.nnodes} (each node runs tp_size / nnodes ranks)")
    if rc.server_context_len is not None:
        at_least("server_context_len", rc.server_context_len, 1)
        # SGLang may run past the model config's length (workers/sglang.py sets its override env var)
        if rc.server_context_len > rc.model.max_context_len and rc.engine.kind is not EngineKind.SGLANG:
            bad("server_context_len", rc.server_context_len,
                f"null or <= model max_context_len {rc.model.max_context_len}")
    if check_max_context and rc.probe.context_len >= 1 and (p := check_context(rc)):
        out.append(p)
    out += _model_problems(rc)
    out += _drafter_problems(rc)
    if rc.engine.kind is EngineKind.REFERENCE:
        out += _reference_problems(rc)
    elif rc.engine.kind is EngineKind.SGLANG:
        out += sglang_problems(rc)
    elif rc.engine.kind is EngineKind.STUB:
        out += stub_problems(rc)
    if rc.probe.kind is ProbeKind.PREDICTABLE and not rc.probe.sentence:
        bad("probe.sentence", rc.probe.sentence, "a non-empty sentence")
    return out + _driver_problems(rc)


def _driver_problems(rc: RunConfig) -> list[Problem]:
    out: list[Problem] = []

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    if rc.cluster.address is None and rc.cluster.kind.value == "ray":
        bad("cluster.address", None, "a Ray address (e.g. auto or ray://head:10001) when cluster.kind=ray")
    if not rc.tracking.uri:
        bad("tracking.uri", rc.tracking.uri, "an MLflow tracking URI")
    return out


def stub_problems(rc: RunConfig) -> list[Problem]:
    """engine=stub: sane timing, and timing set through `engine.stub.*`, not smuggled into `engine.extra_args`."""
    out: list[Problem] = []
    stub = rc.engine.stub or StubOptions()
    for key in ("token_s", "prefill_s", "startup_s"):
        value = getattr(stub, key)
        if not value >= 0:  # also catches nan
            out.append(Problem(f"engine.stub.{key}", value, "a number of seconds >= 0", rc.overrides))
    if not stub.rendezvous_timeout_s > 0:
        out.append(Problem("engine.stub.rendezvous_timeout_s", stub.rendezvous_timeout_s,
                           "a number of seconds > 0", rc.overrides))
    names = dict(zip(STUB_FLAGS, ("token_s", "prefill_s", "startup_s", "rendezvous_timeout_s")))
    for flag in sorted(_extra_flags(rc.engine.extra_args) & set(STUB_FLAGS)):
        out.append(Problem("engine.extra_args", flag, f"engine.stub.{names[flag]}=N instead (engine=stub emits "
                           f"{flag} from it)", rc.overrides))
    return out


# Kernel jobs on CPU run through the Triton interpreter (numpy): no bfloat16 there.
KERNEL_CPU_DTYPES = ("float32", "float16")


def kernel_problems(rc: RunConfig) -> list[Problem]:
    """job=kernel: a sane shape, and a dtype the device can run."""
    k = rc.kernel
    out: list[Problem] = []
    if k is None:  # the layout or dtype was already refused at conversion
        return out

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    for key in ("prefix", "tokens", "num_q_heads", "num_kv_heads", "head_dim", "v_head_dim"):
        if getattr(k, key) < 1:
            bad(f"kernel.{key}", getattr(k, key), "an integer >= 1")
    if k.mla and k.num_kv_heads != 1:
        bad("kernel.num_kv_heads", k.num_kv_heads, "1 with an MLA layout (one latent head)")
    elif k.num_kv_heads >= 1 and k.num_q_heads % k.num_kv_heads:
        bad("kernel.num_kv_heads", k.num_kv_heads, f"a divisor of kernel.num_q_heads ({k.num_q_heads})")
    if k.mla and k.v_head_dim > k.head_dim:
        bad("kernel.v_head_dim", k.v_head_dim, f"<= kernel.head_dim ({k.head_dim}) with MLA (V is a prefix of K)")
    if rc.engine.device == "cpu" and k.dtype not in KERNEL_CPU_DTYPES:
        bad("kernel.dtype", k.dtype, "one of " + ", ".join(KERNEL_CPU_DTYPES)
            + " with engine.device=cpu (the Triton interpreter); bfloat16 needs engine.device=cuda")
    return out


def _model_problems(rc: RunConfig) -> list[Problem]:
    m, out = rc.model, []
    for key in ("max_context_len", "num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim",
                "v_head_dim"):
        if getattr(m, key) < 1:
            out.append(Problem(f"model.{key}", getattr(m, key), "an integer >= 1", rc.overrides))
    if m.attention_kind is AttentionKind.MLA and m.num_kv_heads != 1:
        out.append(Problem("model.num_kv_heads", m.num_kv_heads, "1 for MLA (one latent head)", rc.overrides))
    elif m.num_kv_heads >= 1 and m.num_q_heads % m.num_kv_heads:
        out.append(Problem("model.num_kv_heads", m.num_kv_heads,
                           f"a divisor of model.num_q_heads ({m.num_q_heads})", rc.overrides))
    return out


def _draft_path_example(rc: RunConfig) -> str:
    """An example draft model for the error message: on the reference engine a built-in one sharing the target's
    vocabulary, else what it can draft with; elsewhere a checkpoint."""
    if rc.engine.kind is not EngineKind.REFERENCE or rc.drafter.algorithm is not Algorithm.STANDALONE:
        return "e.g. drafter.draft_model_path=<a checkpoint dir or HF id>"
    same = [p for p in _same_vocab(rc.model.path) if p != rc.model.path]
    return f"e.g. drafter.draft_model_path={same[0]}" if same else \
        "a .gguf file with the target's vocabulary, or drafter=layer_skip to draft with the target's own layers"


def _drafter_problems(rc: RunConfig) -> list[Problem]:
    d, out = rc.drafter, []

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(f"drafter.{key}", value, allowed, rc.overrides))

    if d.algorithm is Algorithm.NONE:
        return out
    if d.algorithm in NEEDS_DRAFT_PATH and not d.draft_model_path:
        silently = (" (SGLang would silently draft with the target itself: that is drafter=oracle)"
                    if rc.engine.kind is EngineKind.SGLANG and d.algorithm is not Algorithm.DFLASH else "")
        bad("draft_model_path", d.draft_model_path,
            f"a draft model path for {d.algorithm.value} ({_draft_path_example(rc)}){silently}")
    for key in ("num_steps", "topk", "num_draft_tokens"):
        if getattr(d, key) < 1:
            bad(key, getattr(d, key), f"an integer >= 1 with algorithm {d.algorithm.value}")
    if d.algorithm in EAGLE_FAMILY and d.topk == 1 and d.num_steps >= 1 \
            and d.num_draft_tokens != d.num_steps + 1:
        bad("num_draft_tokens", d.num_draft_tokens,
            f"num_steps + 1 = {d.num_steps + 1} when topk = 1 (the engine forces it)")
    if d.is_oracle and d.draft_model_path != rc.model.path:
        bad("draft_model_path", d.draft_model_path, f"the target's own path {rc.model.path!r} for the oracle")
    if d.is_oracle and d.algorithm is not Algorithm.STANDALONE:
        bad("algorithm", d.algorithm.value, "STANDALONE for the oracle")
    if d.draft_num_layers is not None:
        if d.algorithm is not Algorithm.STANDALONE:
            bad("draft_num_layers", d.draft_num_layers, f"null with algorithm {d.algorithm.value} (STANDALONE only)")
        elif d.is_oracle:
            bad("draft_num_layers", d.draft_num_layers, "null for the oracle (it drafts with every layer)")
        elif d.draft_model_path == rc.model.path and not 1 <= d.draft_num_layers <= rc.model.num_layers:
            bad("draft_num_layers", d.draft_num_layers,
                f"1..{rc.model.num_layers} (the layers of model {rc.model.name}), or null")
        elif d.draft_num_layers < 1:
            bad("draft_num_layers", d.draft_num_layers, "an integer >= 1, or null")
    return out


def _reference_problems(rc: RunConfig) -> list[Problem]:
    out, a = [], rc.attention
    if rc.drafter.algorithm not in REFERENCE_ALGORITHMS:
        out.append(Problem("drafter.algorithm", rc.drafter.algorithm.value,
                           "one of " + ", ".join(x.value for x in REFERENCE_ALGORITHMS)
                           + " on engine=reference (EAGLE3/DFLASH need engine=sglang)", rc.overrides))
    for key in ("backend", "decode_backend", "prefill_backend", "draft_backend"):
        value = getattr(a, key)
        if value is not None and value not in REFERENCE_BACKENDS:
            out.append(Problem(f"attention.{key}", value,
                               "one of " + ", ".join(REFERENCE_BACKENDS) + " on engine=reference", rc.overrides))
    uses_kernel = "specsweep_verify" in (a.backend, a.decode_backend, a.prefill_backend, a.draft_backend)
    if uses_kernel and rc.engine.device != "cuda":
        out.append(Problem("engine.device", rc.engine.device,
                           "cuda with attention=specsweep_verify (or attention=torch on cpu)", rc.overrides))
    if rc.tp_size != 1:
        out.append(Problem("tp_size", rc.tp_size, "1 on engine=reference", rc.overrides))
    if rc.nnodes > 1:
        out.append(Problem("nnodes", rc.nnodes, "1 on engine=reference (a single-node engine)", rc.overrides))
    d, same = rc.drafter, _same_vocab(rc.model.path)
    if d.algorithm is Algorithm.STANDALONE and not d.is_oracle and same and _same_vocab(d.draft_model_path or "") \
            and d.draft_model_path not in same:
        out.append(Problem("drafter.draft_model_path", d.draft_model_path,
                           f"a draft model with the target's vocabulary ({REFERENCE_MODEL_VOCABS[rc.model.path]}: "
                           f"{', '.join(same)}; drafter=layer_skip drafts with the target's own layers)",
                           rc.overrides))
    out += _reference_concurrency_problems(rc)
    return out


def _extra_int(args: tuple[str, ...], flag: str) -> int | None:
    """The value of `flag` in an argv list (`--flag N` or `--flag=N`); None when absent or not an integer."""
    for i, a in enumerate(args):
        value = a.split("=", 1)[1] if a.startswith(flag + "=") else (
            args[i + 1] if a == flag and i + 1 < len(args) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _reference_concurrency_problems(rc: RunConfig) -> list[Problem]:
    """probe.concurrency requests must run at once on the reference engine, not queue: at most its
    --max-running-requests, and their KV (prompt + gen_tokens + draft headroom each, in pages, as
    workers/reference/engine.py `Engine._pages`) must fit its pool (--max-total-tokens, default the server's
    context length + headroom) together."""
    n = rc.probe.concurrency
    if n <= 1:
        return []
    extra = rc.engine.extra_args
    cap = _extra_int(extra, "--max-running-requests") or SPEC_MAX_RUNNING_REQUESTS  # the reference engine's default
    if n > cap:
        return [Problem("probe.concurrency", n, f"<= {cap}, the reference engine's --max-running-requests (set "
                        "it with engine.extra_args=[--max-running-requests,N]): more would queue", rc.overrides)]
    d, page = rc.drafter, rc.page_size
    headroom = (d.num_draft_tokens if d.algorithm is not Algorithm.NONE and d.num_draft_tokens else 1) + 2 * page
    pool = _extra_int(extra, "--max-total-tokens") or server_context_len(rc) + headroom
    need = -(-(rc.probe.context_len + rc.probe.gen_tokens + headroom) // page)  # pages per request
    if n * need > -(-pool // page):
        return [Problem("probe.concurrency", n,
                        f"<= {max(1, (-(-pool // page)) // need)} at context_len {rc.probe.context_len}: each "
                        f"request holds {need} KV pages of {page} tokens (prompt + gen_tokens + draft headroom) "
                        f"and the pool holds {-(-pool // page)} (--max-total-tokens, default the server's context "
                        "length; raise server_context_len or engine.extra_args=[--max-total-tokens,N])",
                        rc.overrides)]
    return []


# ================================================================ SGLang
# What SGLang itself rejects (or silently overrides) at start-up, checked at plan time instead, per version
# (the facts per version: specsweep_vocab/sglang_facts.py).
# tests/workers/test_sglang_args.py feeds every conf/ combination these rules accept to SGLang's own parser.


# Built into workers/reference (smollm2-135m: a name the reference engine resolves to a packaged GGUF file), SGLang
# cannot load them; with their vocabularies: a draft model must share the target's (the engine refuses it at start).
REFERENCE_MODEL_VOCABS = {**dict.fromkeys(BUILTIN_MODELS, "byte vocabulary"),
                          "smollm2-135m": "SmolLM2's BPE vocabulary"}
REFERENCE_MODEL_PATHS = tuple(REFERENCE_MODEL_VOCABS)


def _same_vocab(path: str) -> list[str]:
    """The built-in models sharing `path`'s vocabulary (itself included); [] for a path that is not built in."""
    vocab = REFERENCE_MODEL_VOCABS.get(path)
    return [p for p, v in REFERENCE_MODEL_VOCABS.items() if vocab and v == vocab]


def _plugin_problems(rc: RunConfig, bad) -> None:
    """specsweep_verify must run where its label says: verify (with speculation) or decode (without), and on a
    layer layout the plugin takes (GQA/MHA: it hands MLA layers to SGLang's Triton backend)."""
    a, d = rc.attention, rc.drafter
    uses = {k: v for k, v in (("backend", a.backend), ("decode_backend", a.decode_backend),
                              ("prefill_backend", a.prefill_backend)) if v in SGLANG_PLUGIN_BACKENDS}
    if not uses:
        return
    if rc.model.attention_kind is AttentionKind.MLA:
        for key, value in uses.items():
            bad(f"attention.{key}", value, f"a built-in SGLang backend with an MLA model ({rc.model.name}): the "
                f"{value} plugin runs GQA/MHA layers only and hands every MLA layer to SGLang's Triton backend, "
                "so the run would measure Triton")
        return
    r = resolved_backends(a, d.algorithm)
    if r.verify is not None and r.verify not in SGLANG_PLUGIN_BACKENDS:
        plugin = r.decode if r.decode in SGLANG_PLUGIN_BACKENDS else r.prefill
        fix = "decode" if r.decode in SGLANG_PLUGIN_BACKENDS else "prefill (or null)"
        bad("attention.speculative_attention_mode", a.speculative_attention_mode,
            f"{fix}: with prefill backend {r.prefill}, decode backend {r.decode} and this mode SGLang verifies on "
            f"{r.verify}, so {plugin} would never verify")
    elif r.verify is None and r.decode not in SGLANG_PLUGIN_BACKENDS:
        bad("attention.prefill_backend", a.prefill_backend,
            f"a built-in backend without speculation: {r.prefill} as the prefill backend only runs SGLang's Triton "
            "prefill (the kernel runs decode and TARGET_VERIFY)")


def _extra_flags(args: tuple[str, ...]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def sglang_problems(rc: RunConfig) -> list[Problem]:
    """Every SGLang-specific problem of one grid point (engine.kind = sglang)."""
    out: list[Problem] = []
    a, d, m = rc.attention, rc.drafter, rc.model

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    rules = SGLANG_VERSIONS.get(rc.engine.version)
    if rules is None:
        bad("engine.version", rc.engine.version, "one of " + ", ".join(SGLANG_VERSIONS) + " on engine=sglang")
        return out
    if rc.engine.device != "cuda":
        bad("engine.device", rc.engine.device, "cuda on engine=sglang")
    if m.path in REFERENCE_MODEL_PATHS:
        bad("model.path", m.path, "a checkpoint dir or HF id on engine=sglang (e.g. model=qwen3-8b); "
            f"{m.path!r} is built into the reference engine")
    if d.draft_model_path in REFERENCE_MODEL_PATHS:
        bad("drafter.draft_model_path", d.draft_model_path, "a checkpoint dir or HF id on engine=sglang")
    if d.draft_num_layers is not None:
        bad("drafter.draft_num_layers", d.draft_num_layers, "null on engine=sglang (SGLang has no such flag: "
            "early-exit self-speculation is a reference-engine feature, --speculative-draft-num-layers)")

    targets = {"backend": a.backend, "decode_backend": a.decode_backend, "prefill_backend": a.prefill_backend}
    for key, value in targets.items():
        if value is not None and value not in rules.backends:
            bad(f"attention.{key}", value, f"one of {', '.join(rules.backends)} on SGLang {rules.version}")
    if a.draft_backend is not None and a.draft_backend not in SGLANG_DRAFT_BACKENDS:
        bad("attention.draft_backend", a.draft_backend, "one of " + ", ".join(SGLANG_DRAFT_BACKENDS))
    for key, value in {**targets, "draft_backend": a.draft_backend}.items():
        pages = SGLANG_BACKEND_PAGE_SIZES.get(value) if value is not None else None
        if pages and rc.page_size not in pages:
            bad("page_size", rc.page_size, f"one of {', '.join(map(str, pages))} with attention.{key}={value} "
                "(SGLang forces it)")

    opts = rc.engine.sglang
    if opts is not None:
        if opts.mem_fraction_static is not None and not 0.0 < opts.mem_fraction_static < 1.0:
            bad("engine.sglang.mem_fraction_static", opts.mem_fraction_static, "null or a fraction in (0, 1)")
        for key in ("cuda_graph_max_bs", "max_running_requests"):
            value = getattr(opts, key)
            if value is not None and value < 1:
                bad(f"engine.sglang.{key}", value, "null or an integer >= 1")
    for key, args in (("engine.extra_args", rc.engine.extra_args), ("drafter.extra_args", d.extra_args)):
        for flag in sorted(_extra_flags(args) & set(rules.wrong_cuda_graph_flags)):
            bad(key, flag, f"engine.sglang.cuda_graph_max_bs=N (emitted as {rules.cuda_graph_max_bs} "
                f"on SGLang {rules.version})")

    _plugin_problems(rc, bad)
    startup_problems(rc, bad)  # what SGLang's parser lets through but its start-up refuses (fa3 arch, weights, ...)
    mrr = opts.max_running_requests if opts is not None else None
    cap = mrr if mrr is not None else (SPEC_MAX_RUNNING_REQUESTS if d.algorithm is not Algorithm.NONE else None)
    if cap is not None and rc.probe.concurrency > cap:
        bad("probe.concurrency", rc.probe.concurrency,
            f"<= {cap}, the server's max running requests (engine.sglang.max_running_requests"
            f"{'' if mrr is not None else f', which SGLang sets to {cap} with speculation'}): more would queue")

    if d.algorithm is Algorithm.NONE:
        return out
    if d.algorithm not in rules.algorithms:
        bad("drafter.algorithm", d.algorithm.value,
            f"one of {', '.join(x.value for x in rules.algorithms)} on SGLang {rules.version}")
        return out
    target_backends = {a.backend, a.decode_backend or a.backend, a.prefill_backend or a.backend}
    if "flex_attention" in target_backends:
        bad("attention.backend", "flex_attention", "a backend other than flex_attention with speculation")
    if "trtllm_mha" in target_backends and d.topk > 1:
        bad("drafter.topk", d.topk, "1 with attention trtllm_mha")
    if d.draft_window_size is not None:
        if not rules.draft_window:
            bad("drafter.draft_window_size", d.draft_window_size, f"null on SGLang {rules.version} (no such flag)")
        elif d.algorithm in (Algorithm.NGRAM, Algorithm.STANDALONE):
            bad("drafter.draft_window_size", d.draft_window_size,
                f"null with {d.algorithm.value}: SGLang ignores the draft window for it (\"has no effect\"); "
                "EAGLE, EAGLE3 and DFLASH honour it")
        elif d.algorithm is Algorithm.DFLASH and d.draft_window_size < d.num_draft_tokens:
            bad("drafter.draft_window_size", d.draft_window_size,
                f"null or >= the DFLASH block size drafter.num_draft_tokens ({d.num_draft_tokens})")
    draft = sglang_draft_backend(a, d.algorithm)
    if d.algorithm is Algorithm.DFLASH:
        if d.num_steps != 1:
            bad("drafter.num_steps", d.num_steps, "1 with DFLASH (linear block verify)")
        if d.topk != 1:
            bad("drafter.topk", d.topk, f"1 with DFLASH (no tree variant in SGLang {rules.version})")
        resolved = draft or a.prefill_backend or a.backend
        if resolved not in SGLANG_DRAFT_BACKENDS:  # SGLang would fall back to flashinfer with a warning
            bad("attention.draft_backend", a.draft_backend,
                f"one of {', '.join(SGLANG_DRAFT_BACKENDS)} for the DFLASH draft worker "
                f"(the target's prefill backend {resolved!r} is not one)")
    if d.algorithm in EAGLE_FAMILY:
        if d.topk > 1 and rc.page_size > 1 and a.backend not in rules.eagle_paged_tree_backends:
            bad("attention.backend", a.backend,
                f"one of {', '.join(rules.eagle_paged_tree_backends)} when drafter.topk > 1 and page_size > 1 "
                f"on SGLang {rules.version} (or page_size=1)")
        unsupported = sorted(b for b in target_backends if b not in SGLANG_EAGLE_DRAFT_WORKER_BACKENDS)
        if draft is None and unsupported:
            bad("attention.draft_backend", a.draft_backend,
                f"a draft-worker backend ({', '.join(SGLANG_DRAFT_BACKENDS)}) when the target uses "
                f"{', '.join(unsupported)}, which the {d.algorithm.value} draft worker does not support")
    if d.algorithm is Algorithm.NGRAM and d.topk > 1 and rc.page_size > 1 \
            and a.backend not in rules.ngram_paged_tree_backends:
        bad("attention.backend", a.backend,
            f"{', '.join(rules.ngram_paged_tree_backends)} when NGRAM topk (max BFS breadth) > 1 and page_size > 1 "
            "(or page_size=1)")
    return out
