"""The engine interface: what differs between engines, behind one class (submitit's executor backends are the model).

An engine is a folder (workers/sglang/, workers/reference/, workers/stub/) whose `adapter.py` subclasses
`EngineAdapter`; the registry `workers.engine.adapter_for(kind)` hands it to the generic code:

    adapter.build_argv(server, port, node_rank=None) -> list[str]   the one argv builder of the engine
    adapter.env(server) -> dict[str, str]                            extra environment of its process
    adapter.health_path                                              GET path that answers 200 once it serves
    adapter.prompt_kind / adapter.prompt_model(server)               how `workers.prompts.build_prompt` encodes
    adapter.observer(server) -> RunObserver                          what is read around each run (below)

`RunObserver` is what `workers.runners.GroupRunner` reads from the engine around each probe besides the probe's
own answers: `before_run` (before the run's cache flush), `probe_kwargs` (`version`, `max_depth` for
`workers.probe.run_probe`), `after_run` (metrics, tags and notes into the run's result). The base reads nothing
(the stub engine); `CountersObserver` reads the `/metrics` counters and `/server_info` limits both real engines
export (`workers.engine_counters`); SGLang's adds /server_info tags and the plugin counters
(`workers.sglang.observe`).

Plan-time rules of an engine (what it refuses, its KV-page estimates) live with the rest of the plan's rules in
`orchestrator/config/` (the config layer imports nothing from workers/; docs/architecture.md says why).

Also here, shared by the adapters: `NodeRank` (one node's place in a multi-node server), `node_rank_argv`, and
`common_flags` (the flags every engine takes, with SGLang's names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specsweep_vocab.spec import Algorithm, EngineKind, ServerSpec
from workers.engine_counters import Scrape, read_limits, scrape_metrics, verify_timing


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
            "--attention-backend", a.backend, "--context-length", str(server.context_length), "--dtype", m.dtype]
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
        return {"version": None,
                "max_depth": d.num_steps if d.algorithm is not Algorithm.NONE and d.num_steps > 0 else None}

    def after_run(self, base_url: str, metrics: dict[str, float], tags: dict[str, str]) -> list[str]:
        """After the run's last answer: metrics and tags into the run's result; notes for its message."""
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
        if self.limits is None or self.limits[0] != pid:
            self.limits = (pid, read_limits(base_url))
        self.before = scrape_metrics(base_url)

    def after_run(self, base_url: str, metrics: dict[str, float], tags: dict[str, str]) -> list[str]:
        self.after = scrape_metrics(base_url) if self.before is not None else None
        notes = verify_timing(self.before, self.after, metrics)  # verify_step_ms, both engines
        metrics.update(self.limits[1] if self.limits else {})
        return notes


class EngineAdapter:
    """One engine kind. Subclasses set `kind` and implement `build_argv`; the rest has engine-neutral defaults."""

    kind: EngineKind
    health_path = "/health"

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

    def observer(self, server: ServerSpec) -> RunObserver:
        return RunObserver(server)
