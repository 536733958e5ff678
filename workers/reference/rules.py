"""The reference engine's plan-time rules and estimates, behind `ReferenceAdapter` (workers/reference/adapter.py):
what `python -m workers.reference` would refuse at start-up or per request, checked before anything starts.

    reference_problems(point) -> [Problem]      algorithms, backends, device, single node and GPU, draft vocabulary
    concurrency_problems(point) -> [Problem]    probe.concurrency requests must run at once, not queue
    kv_budget(point) -> KVBudget               pages per request and in the pool, --max-running-requests
    draft_path_allowed(point) -> str            a built-in draft model sharing the target's vocabulary
    sglang_context_note(point) -> str | None    served here, refused by SGLang at its context edge
    parser_problem(argv) -> str | None          what this engine's own parser (args.py) says of its argv
    packaged_file(name) -> str | None           a packaged GGUF model name (GGUF_MODELS) resolved to its file

REFERENCE_MODEL_VOCABS: the models built into this engine (`tiny`, `tiny-draft`, the packaged GGUF names), which
SGLang cannot load, with their vocabularies (a draft model must share the target's; the engine refuses it at start).
Imports nothing from workers/ outside this folder (the layer test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specsweep_common.builtin_models import BUILTIN_MODELS, GGUF_MODELS
from specsweep_common.plan_point import PlanPoint, argv_int, server_context_len
from specsweep_common.problem import Problem, ProblemError
from specsweep_common.sglang_facts import SPEC_MAX_RUNNING_REQUESTS
from specsweep_common.sglang_limits import context_need, sglang_generated
from specsweep_common.spec import Algorithm

from .args import ALGORITHMS as SERVED_ALGORITHMS
from .config import LOAD_FORMATS
from .gguf_checkpoint import locate_packaged

# --attention-backend and the split backends it takes: attention.py's registry, which imports torch (a test holds the
# two to the same names)
BACKENDS = ("torch", "specsweep_verify")
ALGORITHMS = tuple(Algorithm(a) for a in SERVED_ALGORITHMS)  # args.py's --speculative-algorithm choices
REFERENCE_MODEL_VOCABS = {**dict.fromkeys(BUILTIN_MODELS, "byte vocabulary"),
                          **dict.fromkeys(GGUF_MODELS, "SmolLM2's BPE vocabulary")}


def same_vocab(path: str) -> list[str]:
    """The built-in models sharing `path`'s vocabulary (itself included); [] for a path that is not built in."""
    vocab = REFERENCE_MODEL_VOCABS.get(path)
    return [p for p, v in REFERENCE_MODEL_VOCABS.items() if vocab and v == vocab]


def sglang_context_note(point: PlanPoint) -> str | None:
    """This engine serves prompt + gen_tokens up to the context exactly (`Engine.check`); SGLang 0.5.23 keeps two
    slots more and refuses prompts of context - 6 tokens or more (specsweep_common/sglang_limits.py). The reference
    engine rehearses SGLang, so a point between the two edges is served here but would be refused (or cut short)
    there: the plan says so."""
    limit, prompt, gen = server_context_len(point), point.probe.context_len, point.probe.gen_tokens
    if prompt + gen > limit or sglang_generated(prompt, gen, limit) == gen:
        return None
    total, alone = context_need(0)
    return (f"context_len {prompt} + gen_tokens {gen} against server context {limit}: served here, but SGLang "
            f"needs context_len + gen_tokens + {total} <= {limit} and context_len <= {limit - alone}")


def draft_path_allowed(point: PlanPoint) -> str:
    """An example draft model for the error message: a built-in one sharing the target's vocabulary, else what it
    can draft with."""
    d = point.drafter
    if d.algorithm is not Algorithm.STANDALONE:
        example = "e.g. drafter.draft_model_path=<a checkpoint dir or HF id>"
    else:
        same = [p for p in same_vocab(point.model.path) if p != point.model.path]
        example = f"e.g. drafter.draft_model_path={same[0]}" if same else \
            "a .gguf file with the target's vocabulary, or drafter=layer_skip to draft with the target's own layers"
    return f"a draft model path for {d.algorithm.value} ({example})"


def reference_problems(point: PlanPoint) -> list[Problem]:
    out, a = [], point.attention
    if point.drafter.algorithm not in ALGORITHMS:
        out.append(Problem("drafter.algorithm", point.drafter.algorithm.value,
                           "one of " + ", ".join(x.value for x in ALGORITHMS)
                           + " on engine=reference (EAGLE3/DFLASH need engine=sglang)", point.overrides))
    for key in ("backend", "decode_backend", "prefill_backend", "draft_backend"):
        value = getattr(a, key)
        if value is not None and value not in BACKENDS:
            out.append(Problem(f"attention.{key}", value,
                               "one of " + ", ".join(BACKENDS) + " on engine=reference", point.overrides))
    if point.model.load_format not in LOAD_FORMATS:
        out.append(Problem("model.load_format", point.model.load_format,
                           "one of " + ", ".join(LOAD_FORMATS) + " on engine=reference", point.overrides))
    uses_kernel = "specsweep_verify" in (a.backend, a.decode_backend, a.prefill_backend, a.draft_backend)
    if uses_kernel and point.engine.device != "cuda":
        out.append(Problem("engine.device", point.engine.device,
                           "cuda with attention=specsweep_verify (or attention=torch on cpu)", point.overrides))
    if point.tp_size != 1:
        out.append(Problem("tp_size", point.tp_size, "1 on engine=reference", point.overrides))
    if point.nnodes > 1:
        out.append(Problem("nnodes", point.nnodes, "1 on engine=reference (a single-node engine)", point.overrides))
    d, same = point.drafter, same_vocab(point.model.path)
    if d.algorithm is Algorithm.STANDALONE and not d.is_oracle and same and same_vocab(d.draft_model_path or "") \
            and d.draft_model_path not in same:
        out.append(Problem("drafter.draft_model_path", d.draft_model_path,
                           f"a draft model with the target's vocabulary ({REFERENCE_MODEL_VOCABS[point.model.path]}: "
                           f"{', '.join(same)}; drafter=layer_skip drafts with the target's own layers)",
                           point.overrides))
    return out + concurrency_problems(point) + task_problems(point)


def task_problems(point: PlanPoint) -> list[Problem]:
    """probe.task wraps the prompt in the model's chat template (workers/prompts.py): the model must have one, and
    context_len must leave room for the probe text beside the frame."""
    task = point.probe.task
    if not task:
        return []
    from .chat_template import frame_tokens

    try:
        frame = frame_tokens(point.model.path, task)
    except ProblemError as exc:  # a file of the model that cannot be read
        return [Problem(exc.problem.key, point.model.path, exc.problem.allowed, point.overrides)]
    except ValueError as exc:
        return [Problem("probe.task", task, f"empty on model.path={point.model.path} ({exc})", point.overrides)]
    if point.probe.context_len <= frame:
        return [Problem("context_len", point.probe.context_len,
                        f"more than the {frame} tokens of the chat template and probe.task", point.overrides)]
    return []


@dataclass(frozen=True)
class KVBudget:
    """The reference engine's KV accounting for one grid point, as workers/reference/engine.py `Engine._pages`."""

    max_running: int  # --max-running-requests (its default: SGLang's 48 with speculation)
    page: int  # tokens per KV page (page_size)
    need: int  # pages one request holds: prompt + gen_tokens + draft headroom
    pool: int  # pages in the pool: --max-total-tokens, default the server's context length + headroom

    @property
    def max_concurrency(self) -> int:
        """Requests that run at once before more queue."""
        return min(self.max_running, max(1, self.pool // self.need))


def kv_budget(point: PlanPoint) -> KVBudget:
    extra, d, page = point.engine.extra_args, point.drafter, point.page_size
    cap = argv_int(extra, "--max-running-requests") or SPEC_MAX_RUNNING_REQUESTS  # the reference engine's default
    headroom = (d.num_draft_tokens if d.algorithm is not Algorithm.NONE and d.num_draft_tokens else 1) + 2 * page
    pool = argv_int(extra, "--max-total-tokens") or server_context_len(point) + headroom
    need = -(-(point.probe.context_len + point.probe.gen_tokens + headroom) // page)  # pages per request
    return KVBudget(max_running=cap, page=page, need=need, pool=-(-pool // page))


def concurrency_problems(point: PlanPoint) -> list[Problem]:
    """probe.concurrency requests must run at once on the reference engine, not queue: at most its
    --max-running-requests, and their KV (prompt + gen_tokens + draft headroom each, in pages, as
    workers/reference/engine.py `Engine._pages`) must fit its pool (--max-total-tokens, default the server's
    context length + headroom) together."""
    n = point.probe.concurrency
    if n <= 1:
        return []
    b = kv_budget(point)
    if n > b.max_running:
        return [Problem("probe.concurrency", n, f"<= {b.max_running}, the reference engine's --max-running-requests "
                        "(set it with engine.extra_args=[--max-running-requests,N]): more would queue",
                        point.overrides)]
    if n * b.need > b.pool:
        return [Problem("probe.concurrency", n,
                        f"<= {max(1, b.pool // b.need)} at context_len {point.probe.context_len}: each "
                        f"request holds {b.need} KV pages of {b.page} tokens (prompt + gen_tokens + draft headroom) "
                        f"and the pool holds {b.pool} (--max-total-tokens, default the server's context "
                        "length; raise server_context_len or engine.extra_args=[--max-total-tokens,N])",
                        point.overrides)]
    return []


class _Refused(Exception):
    pass


def parser_problem(argv: Sequence[str]) -> str | None:
    """What the reference engine's parser says about argv (its flags after `python -m workers.reference`)."""
    from .args import build_parser, resolve

    parser = build_parser()

    def error(message: str):  # argparse's error() exits; here it is a value
        raise _Refused(message)

    parser.error = error  # type: ignore[method-assign]
    try:
        resolve(parser.parse_args(list(argv)), parser)
    except _Refused as e:
        return str(e)
    return None


def packaged_file(name: str) -> str | None:
    """The file of a packaged GGUF model name (GGUF_MODELS); None when its package is not installed (the engine
    says so when it starts)."""
    try:
        return str(locate_packaged(name))
    except FileNotFoundError:
        return None
