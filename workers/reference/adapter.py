"""`ReferenceAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.REFERENCE (`python -m workers.reference`).

The one module of workers/reference/ that imports from the rest of workers/ (the interface it implements): the
server itself never imports it, so `python -m workers.reference` stays a server on its own. Its plan-time rules
and KV estimate are workers/reference/rules.py.
"""

from __future__ import annotations

import os
import sys

from specsweep_vocab.plan_point import PlanPoint, Resources
from specsweep_vocab.problem import Problem
from specsweep_vocab.spec import EngineKind, ServerSpec
from workers.adapter import (PLAN_PORT, CountersObserver, EngineAdapter, NodeRank, RunObserver, common_flags,
                             with_node_rank)
from workers.reference import rules


class ReferenceAdapter(EngineAdapter):
    kind = EngineKind.REFERENCE

    def build_argv(self, server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]:
        argv = [sys.executable, "-m", "workers.reference"] + common_flags(server, port)
        if server.drafter.draft_num_layers is not None:  # a reference-engine flag (SGLang has none)
            argv += ["--speculative-draft-num-layers", str(server.drafter.draft_num_layers)]
        if server.engine.device != "cpu":
            argv += ["--device", server.engine.device]
        return with_node_rank(argv + list(server.engine.extra_args), node_rank)

    def env(self, server: ServerSpec) -> dict[str, str]:
        # one intra-op thread per engine: engines share a few cores with Ray and each other
        return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    def observer(self, server: ServerSpec) -> RunObserver:
        return CountersObserver(server)  # /metrics counters and /server_info limits, as SGLang's

    def plan_problems(self, point: PlanPoint) -> list[Problem]:
        return super().plan_problems(point) + rules.reference_problems(point)

    def context_note(self, point: PlanPoint) -> str | None:
        return rules.sglang_context_note(point)

    def draft_path_allowed(self, point: PlanPoint) -> str:
        return rules.draft_path_allowed(point)

    def resource_estimate(self, point: PlanPoint) -> Resources:
        return Resources(max_concurrency=rules.kv_budget(point).max_concurrency)

    def argv_problem(self, server: ServerSpec) -> str | None:
        argv = self.build_argv(server, PLAN_PORT)
        why = rules.parser_problem(argv[argv.index("workers.reference") + 1:])
        return None if why is None else f"flags the reference engine accepts (its parser, workers/reference/args.py: {why})"

    def model_file(self, path: str) -> str | None:
        return rules.packaged_file(path) if path in rules.GGUF_MODELS else super().model_file(path)
