"""The engine interface: what differs between engines, behind one class (submitit's executor backends are the model).

An engine is a folder (workers/sglang/, workers/reference/, workers/stub/) whose `adapter.py` subclasses
`EngineAdapter`; the registry `workers.registry.adapter_for(kind)` hands it to the generic code:

    adapter.build_argv(server, port, node_rank=None) -> list[str]   the one argv builder of the engine
    adapter.env(server) -> dict[str, str]                            extra environment of its process
    adapter.health_path                                              GET path that answers 200 once it serves
    adapter.prompt_kind / adapter.prompt_model(server)               whose encoding, for which model, the
                                                                     prompts of this engine's runs take
    adapter.prompt_encoding(model_path, task) -> PromptEncoding      that encoding (`workers.prompts.build_prompt`)
    adapter.weight_bytes(model) -> float | None                      bytes one forward reads of the weights
    adapter.observer(server) -> RunObserver                          what is read around each run (below)

`RunObserver` is what `workers.runners.GroupRunner` reads from the engine around each probe besides the probe's
own answers: `before_run` (before the run's cache flush), `probe_kwargs` (`version`, `max_depth` for
`workers.probe.run_probe`), `after_run` (metrics, tags and notes into the run's result). The base reads nothing
(the stub engine); `CountersObserver` reads the `/metrics` counters and `/server_info` limits both real engines
export (`workers.engine_counters`); SGLang's adds /server_info tags and the plugin counters
(`workers.sglang.observe`).

Before anything starts, the config layer (orchestrator/config/, reaching workers/ only through the registry
`workers.registry.adapter_for`) asks the same adapter what the engine itself refuses or needs, so an engine's
plan-time rules and estimates live in its folder (`workers/<engine>/rules.py`), not in the generic checks:

    adapter.plan_problems(point) -> [Problem]           what the engine refuses of one grid point (a `PlanPoint`:
                                                        `RunConfig` as it is); each Problem names key, value, allowed
    adapter.context_problem(point) -> Problem | None    does the prompt and every gen_token fit the server's context
    adapter.context_note(point) -> str | None           served here, but SGLang would refuse or shorten it
    adapter.draft_path_allowed(point) -> str            what to say when a drafter needs a model path and has none
    adapter.resource_estimate(point) -> Resources       min tp_size for the weights, requests that run at once
    adapter.server_engine(engine) -> EngineSpec         the EngineSpec its servers start with (the stub: timing flags)
    adapter.run_params(point) -> {param: value}         params recorded with each run (SGLang: resolved backends)
    adapter.owned_flags(server) -> {flag}               the flags its argv builder sets itself (not for extra_args)
    adapter.argv_problem(server) -> str | None          what the engine's own parser says of the full argv
    adapter.model_file(path) -> str | None              the local file or folder the engine loads for model.path

The defaults here are an engine's that is not SGLang: it takes no SGLang-only key, cannot run past the model's
context length, counts prompt + gen_tokens against its context, has no parser of its own to ask.

Also here, shared by the adapters: `NodeRank` (one node's place in a multi-node server), `node_rank_argv`, and
`common_flags` (the flags every engine takes, with SGLang's names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from specsweep_common.plan_point import PlanPoint, Resources, argv_flags, context_limit_words, server_context_len
from specsweep_common.problem import Problem
from specsweep_common.spec import Algorithm, EngineKind, EngineSpec, ModelSpec, ServerSpec

if TYPE_CHECKING:
    from workers.engine_counters import Scrape

# Flags no extra_args may set on any engine: where it serves (`--host 0.0.0.0` would serve on every interface).
ALWAYS_OWNED = ("--host", "--port")
PLAN_PORT = 30000  # the port of the argv built at plan time: any, the argv's shape does not depend on it


@dataclass(frozen=True)
class NodeRank:
    """This node's place in a multi-node server (SGLang `--nnodes/--node-rank/--dist-init-addr`)."""

    rank: int  # 0 serves HTTP and is probed
    nnodes: int
    dist_init_addr: str  # "host:port" of rank 0's rendezvous

    @property
    def serves_http(self) -> bool:
        return self.rank == 0


def node_rank_argv(node_rank: NodeRank) -> list[str]:
    """The multi-node flags of one node's process."""
    return ["--nnodes", str(node_rank.nnodes), "--node-rank", str(node_rank.rank),
            "--dist-init-addr", node_rank.dist_init_addr]


def with_node_rank(argv: list[str], node_rank: NodeRank | None) -> list[str]:
    """argv of an engine that spells no rank flags itself: drop its `--nnodes N`, append the rank flags."""
    if node_rank is None:
        return argv
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nnodes":
            skip = True
        else:
            out.append(a)
    return out + node_rank_argv(node_rank)


def common_flags(server: ServerSpec, port: int) -> list[str]:
    """Flags the reference and stub engines share, with SGLang's names."""
    m, d, a = server.model, server.drafter, server.attention
    argv = ["--model-path", m.path, "--load-format", m.load_format, "--page-size", str(server.page_size),
            "--attention-backend", a.backend, "--context-length", str(server.server_context_len), "--dtype", m.dtype]
    for flag, value in (("--decode-attention-backend", a.decode_backend),
                        ("--prefill-attention-backend", a.prefill_backend),
                        ("--speculative-draft-attention-backend", a.draft_backend)):
        if value:
            argv += [flag, value]
    if d.algorithm is not Algorithm.NONE:
        argv += ["--speculative-algorithm", d.algorithm.value]
        if d.draft_model_path:
            argv += ["--speculative-draft-model-path", d.draft_model_path]
        if d.num_steps:
            argv += ["--speculative-num-steps", str(d.num_steps)]
        if d.topk:
            argv += ["--speculative-eagle-topk", str(d.topk)]
        if d.num_draft_tokens:
            argv += ["--speculative-num-draft-tokens", str(d.num_draft_tokens)]
        argv += list(d.extra_args)
    argv += ["--random-seed", str(server.seed), "--host", server.host, "--port", str(port)]
    return argv


@dataclass(frozen=True)
class PromptEncoding:
    """How an engine takes a probe's prompt (`workers.prompts.build_prompt` builds it from this).

    encode: text -> token ids in the engine's own tokenizer; None: the engine takes text (about
        `workers.prompts.CHARS_PER_TOKEN` chars a token) and its reported prompt_tokens is what gets recorded.
    frame: probe.task's chat turn around the probe text, (before, after), as text (`specsweep_common.chat_frame`).
    exact: a tokenizer that gives fewer tokens than asked for any probe text is an error; False: send text instead.
    """

    encode: Callable[[str], Sequence[int]] | None
    frame: tuple[str, str] | None = None
    exact: bool = True


class RunObserver:
    """What a GroupRunner reads from its engine around each run. This base reads nothing: an engine without
    counters (the stub). One per GroupRunner; `pid` tells the engine's starts apart."""

    def __init__(self, server: ServerSpec):
        self.server = server

    def before_run(self, base_url: str, pid: int | None) -> None:
        """Before the run's cache flush."""

    def probe_kwargs(self) -> dict[str, Any]:
        """`version` (meta_info names) and `max_depth` (the most drafts one verify step can accept) for run_probe."""
        d = self.server.drafter
        # an NGRAM chain is as long as its num_draft_tokens nodes allow, whatever the steps (SGLang's
        # ngram_worker.py:99-120; the reference engine drafts the same way)
        depth = d.num_draft_tokens - 1 if d.algorithm is Algorithm.NGRAM and d.topk == 1 else d.num_steps
        return {"version": None, "max_depth": depth if d.algorithm is not Algorithm.NONE and depth > 0 else None}

    def after_run(self, base_url: str, metrics: dict[str, float], tags: dict[str, str]) -> list[str]:
        """After the run's last answer: metrics and tags into the run's result; notes for its message."""
        from workers.engine_counters import verify_timing  # requests: imported where a run needs it, not at plan time

        return verify_timing(None, None, metrics)  # no counters: a run that verified says so


class CountersObserver(RunObserver):
    """The `/metrics` counters (verify_step_ms) and `/server_info` limits (max_req_input_len,
    max_total_num_tokens, once per engine start) that SGLang and the reference engine both export
    (`workers.engine_counters`)."""

    def __init__(self, server: ServerSpec):
        super().__init__(server)
        self.limits: tuple[int | None, dict[str, float]] | None = None  # (engine pid, its limits)
        self.before: Scrape | None = None
        self.after: Scrape | None = None

    def before_run(self, base_url: str, pid: int | None) -> None:
        from workers.engine_counters import read_limits, scrape_metrics

        if self.limits is None or self.limits[0] != pid:
            self.limits = (pid, read_limits(base_url))
        self.before = scrape_metrics(base_url)

    def after_run(self, base_url: str, metrics: dict[str, float], tags: dict[str, str]) -> list[str]:
        from workers.engine_counters import scrape_metrics, verify_timing

        self.after = scrape_metrics(base_url) if self.before is not None else None
        notes = verify_timing(self.before, self.after, metrics)  # verify_step_ms, both engines
        metrics.update(self.limits[1] if self.limits else {})
        return notes


class EngineAdapter:
    """One engine kind. Subclasses set `kind` and implement `build_argv`; the rest has engine-neutral defaults."""

    kind: EngineKind
    health_path = "/health"
    # SGLang's bench_serving runs against it (/model_info's tokenizer_path, /generate with meta_info) and it keeps
    # SGLang's per-request record (`--export-metrics-to-file`): the load curves need both (orchestrator/load)
    serves_load_generator = False

    def request_export_flags(self, directory: str) -> list[str]:
        """The flags that make the engine write one JSON line per finished request (its meta_info) into
        `directory`: SGLang's (sglang/srt/arg_groups/fields/observability.py:179-186)."""
        return ["--export-metrics-to-file", "--export-metrics-to-file-dir", directory]

    def build_argv(self, server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]:
        raise NotImplementedError

    def env(self, server: ServerSpec) -> dict[str, str]:
        return {}

    @property
    def prompt_kind(self) -> EngineKind:
        """The engine whose prompt encoding `workers.prompts.build_prompt` uses for this one."""
        return self.kind

    def prompt_model(self, server: ServerSpec) -> str | None:
        """The model whose tokenizer builds the prompt (None: none to load)."""
        return server.model.path

    def prompt_encoding(self, model_path: str | None, task: str | None) -> PromptEncoding:
        """How prompts for `model_path` are encoded, framed by probe.task's chat turn when `task` is set. This
        default: text, for an engine with no tokenizer to ask; a task needs a chat template, which it has none of."""
        if task:
            raise ValueError(f"probe.task={task!r} needs a chat template, and engine={self.kind.value} has no "
                             "tokenizer to render one with")
        return PromptEncoding(encode=None)

    def weight_bytes(self, model: ModelSpec) -> float | None:
        """Bytes of the weights one forward reads (`workers.derived.model_weight_bytes` of the model's full shape);
        this default: the shape in an HF checkpoint directory's config.json, None when there is none."""
        from workers.derived import hf_shape, model_weight_bytes

        shape = hf_shape(model.path)
        return None if shape is None else model_weight_bytes(shape, model.dtype)

    def observer(self, server: ServerSpec) -> RunObserver:
        return RunObserver(server)

    # ---------------------------------------------------------------- plan time (the config layer, before any work)

    def plan_problems(self, point: PlanPoint) -> list[Problem]:
        """What this engine refuses of one grid point. This default: an engine that is not SGLang."""
        out: list[Problem] = []
        mode = point.attention.speculative_attention_mode
        if mode is not None:
            out.append(Problem("attention.speculative_attention_mode", mode, f"null on engine={self.kind.value} "
                               "(an SGLang flag: which split backend verifies)", point.overrides))
        if point.server_context_len is not None and point.server_context_len > point.model.max_context_len:
            out.append(Problem("server_context_len", point.server_context_len,
                               f"null or <= model max_context_len {point.model.max_context_len}", point.overrides))
        return out

    def context_problem(self, point: PlanPoint) -> Problem | None:
        """None when the probe's prompt and all its gen_tokens fit the server's context. This default counts as the
        reference engine does: prompt + max_new_tokens <= context (workers/reference/engine.py `Engine.check`)."""
        prompt, gen = point.probe.context_len, point.probe.gen_tokens
        if prompt + gen <= server_context_len(point):
            return None
        return Problem("context_len", prompt, f"context_len + gen_tokens ({gen}) <= {context_limit_words(point)}",
                       point.overrides)

    def context_note(self, point: PlanPoint) -> str | None:
        """A point this engine serves but SGLang would not serve the same way, in words (the plan says so); this
        default: None, an engine that rehearses nothing."""
        return None

    def draft_path_allowed(self, point: PlanPoint) -> str:
        """What is allowed when the drafter's algorithm needs a draft model path and none is set."""
        return (f"a draft model path for {point.drafter.algorithm.value} "
                "(e.g. drafter.draft_model_path=<a checkpoint dir or HF id>)")

    def server_engine(self, engine: EngineSpec) -> EngineSpec:
        """The EngineSpec a server of this engine is started with (part of its ServerSpec); this default: as
        configured."""
        return engine

    def run_params(self, point: PlanPoint) -> dict[str, str]:
        """Params recorded with each run besides the config's own (e.g. what the engine resolves); this default:
        none."""
        return {}

    def resource_estimate(self, point: PlanPoint) -> Resources:
        """What one grid point needs of this engine. This default knows nothing."""
        return Resources()

    def owned_flags(self, server: ServerSpec) -> frozenset[str]:
        """The flags this engine's argv builder sets from the config (so no extra_args may set them): the flags of
        its argv with no extra_args at all, the multi-node rank flags, `--host` and `--port`."""
        bare = replace(server, engine=replace(server.engine, extra_args=()),
                       drafter=replace(server.drafter, extra_args=()))
        node_rank = NodeRank(0, server.nnodes, "127.0.0.1:1") if server.nnodes > 1 else None
        return frozenset(argv_flags(tuple(self.build_argv(bare, PLAN_PORT, node_rank)))) | frozenset(ALWAYS_OWNED)

    def argv_problem(self, server: ServerSpec) -> str | None:
        """What is allowed, when the engine's own parser refuses the server's full argv; None when it takes it
        (this default: no parser to ask before the engine starts)."""
        return None

    def model_file(self, path: str) -> str | None:
        """The local file or folder holding model.path, whose header gives the model's facts; None: none here."""
        return path if path.endswith(".gguf") or os.path.isdir(path) or os.path.isfile(path) else None
