"""The registry of engines: one `workers.adapter.EngineAdapter` per EngineKind, each from its engine's folder.

    adapter_for(kind: EngineKind) -> EngineAdapter
        SGLANG: workers/sglang/adapter.py, REFERENCE: workers/reference/adapter.py, STUB: workers/stub/adapter.py
    build_engine_argv(server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]
        argv for the server's engine kind (SGLang flag names for every engine); with a NodeRank, this node's
        process of a multi-node server

The one module of workers/ the config layer imports (tests/test_import_layers.py): it reaches an engine's
plan-time rules, estimates and argv through the adapter, and nothing here starts a process or opens a socket
(the adapters import their run-time modules where a run needs them), so validating a grid stays cheap.
A new engine is one line here and its folder.
"""

from __future__ import annotations

from specsweep_common.spec import EngineKind, ServerSpec
from workers.adapter import EngineAdapter, NodeRank
from workers.reference.adapter import ReferenceAdapter
from workers.sglang.adapter import SGLangAdapter
from workers.stub.adapter import StubAdapter

_ADAPTERS: dict[EngineKind, EngineAdapter] = {EngineKind.REFERENCE: ReferenceAdapter(),
                                              EngineKind.SGLANG: SGLangAdapter(), EngineKind.STUB: StubAdapter()}


def adapter_for(kind: EngineKind) -> EngineAdapter:
    return _ADAPTERS[kind]


def build_engine_argv(server: ServerSpec, port: int, node_rank: NodeRank | None = None) -> list[str]:
    return adapter_for(server.engine.kind).build_argv(server, port, node_rank)
