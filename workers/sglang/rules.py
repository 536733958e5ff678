"""What SGLang itself rejects (or silently overrides) at start-up, checked at plan time instead, per version (the
facts per version: specsweep_common/sglang_facts.py), behind `SGLangAdapter.plan_problems` and its estimates.

    sglang_problems(point) -> [Problem]      every SGLang-specific problem of one grid point (a `PlanPoint`)
    reserved_tokens(point) -> int            context slots SGLang's EAGLE drafts take per request
    context_problem(point) -> Problem | None does the prompt and every gen_token fit, as SGLang counts
    max_concurrency(point) -> int | None     requests SGLang runs at once before more queue

tests/workers/sglang/test_argv.py feeds every conf/ combination these rules accept to SGLang's own parser;
workers/sglang/startup_rules.py holds the rules its parser lets through but its start-up refuses. Citations are
SGLang 0.5.23's installed source (`sglang/srt/...`).
"""

from __future__ import annotations

from typing import Any, Callable

from specsweep_common.builtin_models import REFERENCE_MODEL_PATHS
from specsweep_common.plan_point import PlanPoint, argv_flags, context_limit_words, server_context_len
from specsweep_common.problem import Problem
from specsweep_common.sglang_facts import (SGLANG_BACKEND_PAGE_SIZES, SGLANG_DRAFT_BACKENDS,
                                          SGLANG_EAGLE_DRAFT_WORKER_BACKENDS, SGLANG_PLUGIN_BACKENDS,
                                          SGLANG_VERSIONS, SPEC_MAX_RUNNING_REQUESTS, resolved_backends,
                                          sglang_draft_backend)
from specsweep_common.sglang_limits import context_need, sglang_generated
from specsweep_common.spec import EAGLE_FAMILY, Algorithm, AttentionKind
from workers.sglang.cpu import SGLANG_CPU_MODELS, cpu_problems, sglang_python
from workers.sglang.startup_rules import startup_problems
Bad = Callable[[str, Any, str], None]


def reserved_tokens(point: PlanPoint) -> int:
    """Context slots SGLang reserves per request on top of the prompt: EAGLE/EAGLE3 store their draft tokens in
    the output slots, max(topk * num_steps, num_draft_tokens) (`compute_num_reserved_tokens`, 0.5.10-0.5.23:
    `sglang/srt/managers/utils.py:484`)."""
    d = point.drafter
    if d.algorithm in (Algorithm.EAGLE, Algorithm.EAGLE3):
        return max(d.topk * d.num_steps, d.num_draft_tokens)
    return 0


def context_problem(point: PlanPoint) -> Problem | None:
    """SGLang (0.5.23, `specsweep_common.sglang_limits`, checked against its own code): prompt + max_new_tokens +
    max(reserve, 2) <= context and prompt <= context - 7, the reserve being EAGLE/EAGLE3's draft slots; nearer the
    edge it refuses the request (HTTP 400), aborts it, or generates fewer tokens than asked."""
    limit, reserved = server_context_len(point), reserved_tokens(point)
    prompt, gen = point.probe.context_len, point.probe.gen_tokens
    pool = point.engine.sglang.max_total_tokens if point.engine.sglang is not None else None
    if sglang_generated(prompt, gen, limit, reserve=reserved, max_total_tokens=pool,
                        page_size=point.page_size) == gen:
        return None
    total, alone = context_need(reserved)
    why = (f"the {reserved} tokens SGLang reserves for {point.drafter.algorithm.value} drafts "
           "(max(topk*num_steps, num_draft_tokens))" if reserved >= total else
           "SGLang's scheduler keeps max_new_tokens <= context - prompt - 2")
    return Problem("context_len", prompt, f"context_len + gen_tokens ({gen}) + {total} ({why}) <= "
                   f"{context_limit_words(point)}, and context_len <= {limit - alone} (SGLang aborts prompts of "
                   "context - 6 tokens or more)", point.overrides)


def max_concurrency(point: PlanPoint) -> int | None:
    """engine.sglang.max_running_requests, else the 48 SGLang sets with speculation
    (`sglang/srt/arg_groups/speculative_hook.py:442`, one per algorithm), else no limit we know."""
    opts, d = point.engine.sglang, point.drafter
    mrr = opts.max_running_requests if opts is not None else None
    return mrr if mrr is not None else (SPEC_MAX_RUNNING_REQUESTS if d.algorithm is not Algorithm.NONE else None)


def _plugin_problems(point: PlanPoint, bad: Bad) -> None:
    """specsweep_verify must run where its label says: verify (with speculation) or decode (without), and on a
    layer layout the plugin takes (GQA/MHA: it hands MLA layers to SGLang's Triton backend)."""
    a, d = point.attention, point.drafter
    uses = {k: v for k, v in (("backend", a.backend), ("decode_backend", a.decode_backend),
                              ("prefill_backend", a.prefill_backend)) if v in SGLANG_PLUGIN_BACKENDS}
    if not uses:
        return
    if point.model.attention_kind is AttentionKind.MLA:
        for key, value in uses.items():
            bad(f"attention.{key}", value, f"a built-in SGLang backend with an MLA model ({point.model.name}): the "
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


def sglang_problems(point: PlanPoint) -> list[Problem]:
    """Every SGLang-specific problem of one grid point (engine.kind = sglang)."""
    out: list[Problem] = []
    a, d, m = point.attention, point.drafter, point.model

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, point.overrides))

    rules = SGLANG_VERSIONS.get(point.engine.version)
    if rules is None:
        bad("engine.version", point.engine.version, "one of " + ", ".join(SGLANG_VERSIONS) + " on engine=sglang")
        return out
    on_cpu = point.engine.device == "cpu"
    if on_cpu:  # SGLang's CPU backend (engine=sglang_cpu): its own rules, then the version's
        out += cpu_problems(point, sglang_python(point.engine))
    elif point.engine.device != "cuda":
        bad("engine.device", point.engine.device, "cuda, or cpu with engine=sglang_cpu, on engine=sglang")
    if m.load_format not in rules.load_formats:
        bad("model.load_format", m.load_format, f"one of {', '.join(rules.load_formats)} on SGLang {rules.version}")
    if m.path in REFERENCE_MODEL_PATHS and not (on_cpu and m.path in SGLANG_CPU_MODELS):
        bad("model.path", m.path, "a checkpoint dir or HF id on engine=sglang (e.g. model=qwen3-8b); "
            f"{m.path!r} is built into the reference engine")
    if d.draft_model_path in REFERENCE_MODEL_PATHS and not (on_cpu and d.draft_model_path in SGLANG_CPU_MODELS):
        bad("drafter.draft_model_path", d.draft_model_path, "a checkpoint dir or HF id on engine=sglang")
    if d.draft_num_layers is not None:
        bad("drafter.draft_num_layers", d.draft_num_layers, "null on engine=sglang (SGLang has no such flag: "
            "early-exit self-speculation is a reference-engine feature, --speculative-draft-num-layers)")

    # the backend choices: sglang/srt/arg_groups/choices.py:69
    targets = {"backend": a.backend, "decode_backend": a.decode_backend, "prefill_backend": a.prefill_backend}
    for key, value in targets.items():
        if value is not None and value not in rules.backends and not on_cpu:  # on CPU: cpu_problems says which
            bad(f"attention.{key}", value, f"one of {', '.join(rules.backends)} on SGLang {rules.version}")
    if a.draft_backend is not None and a.draft_backend not in SGLANG_DRAFT_BACKENDS:
        bad("attention.draft_backend", a.draft_backend, "one of " + ", ".join(SGLANG_DRAFT_BACKENDS))
    # page sizes a backend forces: sglang/srt/arg_groups/overrides.py:1143-1200 (_mla_backend_page_constraints)
    for key, value in {**targets, "draft_backend": a.draft_backend}.items():
        pages = SGLANG_BACKEND_PAGE_SIZES.get(value) if value is not None else None
        if pages and point.page_size not in pages:
            bad("page_size", point.page_size, f"one of {', '.join(map(str, pages))} with attention.{key}={value} "
                "(SGLang forces it)")

    for key, args in (("engine.extra_args", point.engine.extra_args), ("drafter.extra_args", d.extra_args)):
        for flag in sorted(argv_flags(args) & set(rules.wrong_cuda_graph_flags)):
            bad(key, flag, f"engine.sglang.cuda_graph_max_bs=N (emitted as {rules.cuda_graph_max_bs} "
                f"on SGLang {rules.version})")

    _plugin_problems(point, bad)
    startup_problems(point, bad)  # what SGLang's parser lets through but its start-up refuses (fa3 arch, weights, ...)
    cap = max_concurrency(point)
    if cap is not None and point.probe.concurrency > cap:
        mrr = point.engine.sglang.max_running_requests if point.engine.sglang is not None else None
        bad("probe.concurrency", point.probe.concurrency,
            f"<= {cap}, the server's max running requests (engine.sglang.max_running_requests"
            f"{'' if mrr is not None else f', which SGLang sets to {cap} with speculation'}): more would queue")

    if d.algorithm is Algorithm.NONE:
        return out
    return out + _speculation_problems(point, rules)


def _speculation_problems(point: PlanPoint, rules: Any) -> list[Problem]:
    """The drafter's rules on SGLang (drafter.algorithm != NONE)."""
    out: list[Problem] = []
    a, d = point.attention, point.drafter

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, point.overrides))

    if d.algorithm not in rules.algorithms:
        bad("drafter.algorithm", d.algorithm.value,
            f"one of {', '.join(x.value for x in rules.algorithms)} on SGLang {rules.version}")
        return out
    target_backends = {a.backend, a.decode_backend or a.backend, a.prefill_backend or a.backend}
    if "flex_attention" in target_backends:
        bad("attention.backend", "flex_attention", "a backend other than flex_attention with speculation")
    if "trtllm_mha" in target_backends and d.topk > 1:  # sglang/srt/arg_groups/speculative_hook.py:1176-1180
        bad("drafter.topk", d.topk, "1 with attention trtllm_mha")
    if d.draft_window_size is not None:
        if not rules.draft_window:
            bad("drafter.draft_window_size", d.draft_window_size, f"null on SGLang {rules.version} (no such flag)")
        elif d.algorithm in (Algorithm.NGRAM, Algorithm.STANDALONE):  # speculative_hook.py:213-219 warns
            bad("drafter.draft_window_size", d.draft_window_size,
                f"null with {d.algorithm.value}: SGLang ignores the draft window for it (\"has no effect\"); "
                "EAGLE, EAGLE3 and DFLASH honour it")
        elif d.algorithm is Algorithm.DFLASH and d.draft_window_size < d.num_draft_tokens:
            bad("drafter.draft_window_size", d.draft_window_size,
                f"null or >= the DFLASH block size drafter.num_draft_tokens ({d.num_draft_tokens})")
    draft = sglang_draft_backend(a, d.algorithm)
    if d.algorithm is Algorithm.DFLASH:  # SGLang overrides both to 1: speculative_hook.py:329-365
        if d.num_steps != 1:
            bad("drafter.num_steps", d.num_steps, "1 with DFLASH (linear block verify)")
        if d.topk != 1:
            bad("drafter.topk", d.topk, f"1 with DFLASH (no tree variant in SGLang {rules.version})")
        resolved = draft or a.prefill_backend or a.backend
        # SGLang would fall back to flashinfer with a warning: `_resolve_dflash_draft_attention_backend`,
        # sglang/srt/arg_groups/speculative_hook.py:886-944 (the warning at :937)
        if resolved not in SGLANG_DRAFT_BACKENDS:
            bad("attention.draft_backend", a.draft_backend,
                f"one of {', '.join(SGLANG_DRAFT_BACKENDS)} for the DFLASH draft worker "
                f"(the target's prefill backend {resolved!r} is not one)")
    if d.algorithm in EAGLE_FAMILY:
        # topk > 1 with paged KV needs the cascade draft-decode: speculative_hook.py:1268-1282
        if d.topk > 1 and point.page_size > 1 and a.backend not in rules.eagle_paged_tree_backends:
            bad("attention.backend", a.backend,
                f"one of {', '.join(rules.eagle_paged_tree_backends)} when drafter.topk > 1 and page_size > 1 "
                f"on SGLang {rules.version} (or page_size=1)")
        unsupported = sorted(b for b in target_backends if b not in SGLANG_EAGLE_DRAFT_WORKER_BACKENDS)
        if draft is None and unsupported:
            bad("attention.draft_backend", a.draft_backend,
                f"a draft-worker backend ({', '.join(SGLANG_DRAFT_BACKENDS)}) when the target uses "
                f"{', '.join(unsupported)}, which the {d.algorithm.value} draft worker does not support")
    # NGRAM's BFS tree on paged KV: flashinfer only, speculative_hook.py:1355-1366
    if d.algorithm is Algorithm.NGRAM and d.topk > 1 and point.page_size > 1 \
            and a.backend not in rules.ngram_paged_tree_backends:
        bad("attention.backend", a.backend,
            f"{', '.join(rules.ngram_paged_tree_backends)} when NGRAM topk (max BFS breadth) > 1 and page_size > 1 "
            "(or page_size=1)")
    return out
