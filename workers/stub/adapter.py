"""`StubAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.STUB (workers/stub/server.py). Timing comes
from `engine.extra_args` (`--stub-token-s`, `--stub-prefill-s`, `--stub-startup-s`); its plan-time rules are
workers/stub/rules.py."""

from __future__ import annotations

import sys
from dataclasses import replace

from specsweep_common.plan_point import PlanPoint
from specsweep_common.problem import Problem
from specsweep_common.spec import EngineKind, EngineSpec, ServerSpec
from workers.adapter import EngineAdapter, NodeRank, common_flags, node_rank_argv
from workers.stub.rules import stub_problems


class StubAdapter(EngineAdapter):
    kind = EngineKind.STUB

    def build_argv(self, server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]:
        argv = [sys.executable, "-m", "workers.stub.server"] + common_flags(server, port)
        argv += ["--tp-size", str(server.tp_size)]
        if node_rank is not None:
            argv += node_rank_argv(node_rank)
        return argv + list(server.engine.extra_args)

    @property
    def prompt_kind(self) -> EngineKind:
        """The reference engine's byte-tokenised input_ids (no model tokenizer to load)."""
        return EngineKind.REFERENCE

    def prompt_model(self, server: ServerSpec) -> str | None:
        return None  # byte ids, no model to load

    def server_engine(self, engine: EngineSpec) -> EngineSpec:
        """`engine.stub` prepended to `extra_args` as the `--stub-*` flags the server takes."""
        if engine.stub is not None:
            return replace(engine, extra_args=engine.stub.argv() + engine.extra_args)
        return engine

    def plan_problems(self, point: PlanPoint) -> list[Problem]:
        return super().plan_problems(point) + stub_problems(point)
