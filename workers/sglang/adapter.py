"""`SGLangAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.SGLANG."""

from __future__ import annotations

from specsweep_vocab.spec import EngineKind, ServerSpec
from workers.adapter import EngineAdapter, NodeRank, RunObserver, with_node_rank
from workers.sglang.args import build_sglang_argv, sglang_env
from workers.sglang.observe import SGLangObserver


class SGLangAdapter(EngineAdapter):
    kind = EngineKind.SGLANG

    def build_argv(self, server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]:
        return with_node_rank(build_sglang_argv(server, port), node_rank)

    def env(self, server: ServerSpec) -> dict[str, str]:
        return sglang_env(server)

    def observer(self, server: ServerSpec) -> RunObserver:
        return SGLangObserver(server)
