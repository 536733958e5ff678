"""`ReferenceAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.REFERENCE (`python -m workers.reference`).

The one module of workers/reference/ that imports from the rest of workers/ (the interface it implements): the
server itself never imports it, so `python -m workers.reference` stays a server on its own.
"""

from __future__ import annotations

import os
import sys

from specsweep_vocab.spec import EngineKind, ServerSpec
from workers.adapter import CountersObserver, EngineAdapter, NodeRank, RunObserver, common_flags, with_node_rank


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
