"""`SGLangAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.SGLANG. Its plan-time rules are
workers/sglang/rules.py and startup_rules.py; what it reads around a run, workers/sglang/observe.py (imported
where a run needs it: the config layer reaches this adapter at plan time)."""

from __future__ import annotations

from specsweep_vocab.plan_point import PlanPoint, Resources
from specsweep_vocab.problem import Problem
from specsweep_vocab.sglang_facts import resolved_backends
from specsweep_vocab.spec import Algorithm, EngineKind, ServerSpec
from workers.adapter import EngineAdapter, NodeRank, RunObserver, with_node_rank
from workers.sglang import rules
from workers.sglang.args import build_sglang_argv, sglang_env
from workers.sglang.cpu import served_model_path, sglang_python
from workers.sglang.startup_rules import min_tp_size


class SGLangAdapter(EngineAdapter):
    kind = EngineKind.SGLANG

    def build_argv(self, server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]:
        return with_node_rank(build_sglang_argv(server, port), node_rank)

    def env(self, server: ServerSpec) -> dict[str, str]:
        return sglang_env(server)

    def prompt_model(self, server: ServerSpec) -> str | None:
        """On CPU the server loads the Hugging Face directory `make setup-sglang` exported for model.path: its
        tokenizer builds the token-exact prompt."""
        if server.engine.device == "cpu":
            return served_model_path(server.model.path, sglang_python(server.engine))
        return server.model.path

    def observer(self, server: ServerSpec) -> RunObserver:
        from workers.sglang.observe import SGLangObserver  # requests, prometheus_client: run time only

        return SGLangObserver(server)

    def plan_problems(self, point: PlanPoint) -> list[Problem]:
        """SGLang takes --speculative-attention-mode and may run past the model's context length (the adapter sets
        SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, workers/sglang/args.py): none of the default rules hold."""
        return rules.sglang_problems(point)

    def context_problem(self, point: PlanPoint) -> Problem | None:
        return rules.context_problem(point)

    def draft_path_allowed(self, point: PlanPoint) -> str:
        silently = (" (SGLang would silently draft with the target itself: that is drafter=oracle)"
                    if point.drafter.algorithm is not Algorithm.DFLASH else "")
        return super().draft_path_allowed(point) + silently

    def run_params(self, point: PlanPoint) -> dict[str, str]:
        """Which backend runs prefill, decode and verify (not identity: `specsweep_vocab.sglang_facts`)."""
        return resolved_backends(point.attention, point.drafter.algorithm).params()

    def resource_estimate(self, point: PlanPoint) -> Resources:
        return Resources(min_tp_size=min_tp_size(point), max_concurrency=rules.max_concurrency(point))
