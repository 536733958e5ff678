"""`ReferenceAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.REFERENCE (`python -m workers.reference`).

The one module of workers/reference/ that imports from the rest of workers/ (the interface it implements): the
server itself never imports it, so `python -m workers.reference` stays a server on its own. Its plan-time rules
and KV estimate are workers/reference/rules.py.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

from specsweep_common.plan_point import PlanPoint, Resources
from specsweep_common.problem import Problem
from specsweep_common.spec import EngineKind, ModelSpec, ServerSpec
from workers.adapter import (PLAN_PORT, CountersObserver, EngineAdapter, NodeRank, PromptEncoding, RunObserver,
                             common_flags, with_node_rank)
from workers.reference import rules


logger = logging.getLogger(__name__)


@functools.cache
def engine_tokenizer(model_path: str | None):
    """The reference engine's own tokenizer for a model path (`workers.reference.tokenizer.load_tokenizer`; bytes
    without a model), loaded once per process."""
    from workers.reference.tokenizer import ByteTokenizer, load_tokenizer

    return load_tokenizer(model_path) if model_path else ByteTokenizer()


class ReferenceAdapter(EngineAdapter):
    kind = EngineKind.REFERENCE
    serves_load_generator = True

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

    def prompt_encoding(self, model_path: str | None, task: str | None) -> PromptEncoding:
        """The engine's own tokenizer for the model (bytes for the built-in models and no model at all, the GGUF
        metadata's BPE for a .gguf such as smollm2-135m): exact input_ids, framed by the chat template it serves
        /v1/chat/completions with."""
        from workers.reference.chat_template import reference_chat_frame

        return PromptEncoding(encode=engine_tokenizer(model_path).encode,
                              frame=reference_chat_frame(model_path, task) if task else None, exact=True)

    def weight_bytes(self, model: ModelSpec) -> float | None:
        """The shape the engine itself loads (a built-in config, a GGUF's metadata or an HF config.json)."""
        from workers.derived import model_weight_bytes
        from workers.reference.model_source import load_config

        try:
            return model_weight_bytes(load_config(model.path), model.dtype)
        except Exception as e:  # an HF id without a local config.json, or transformers-only configs
            logger.info("no full model shape for %s (%s): the floor counts KV bytes only", model.path, e)
            return None

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
