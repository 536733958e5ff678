"""`SGLangAdapter`: the `workers.adapter.EngineAdapter` for EngineKind.SGLANG. Its plan-time rules are
workers/sglang/rules.py and startup_rules.py; what it reads around a run, workers/sglang/observe.py (imported
where a run needs it: the config layer reaches this adapter at plan time)."""

from __future__ import annotations

import functools
import logging

from specsweep_common.chat_frame import split_frame, task_messages
from specsweep_common.plan_point import PlanPoint, Resources
from specsweep_common.problem import Problem
from specsweep_common.sglang_facts import resolved_backends
from specsweep_common.spec import Algorithm, EngineKind, ServerSpec
from workers.adapter import EngineAdapter, NodeRank, PromptEncoding, RunObserver, with_node_rank
from workers.sglang import rules
from workers.sglang.argv import build_sglang_argv, sglang_env
from workers.sglang.cpu import served_model_path, sglang_python
from workers.sglang.startup_rules import min_tp_size


logger = logging.getLogger(__name__)


class SGLangAdapter(EngineAdapter):
    kind = EngineKind.SGLANG
    serves_load_generator = True

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

    def prompt_encoding(self, model_path: str | None, task: str | None) -> PromptEncoding:
        """The model's tokenizer as SGLang loads it (transformers `AutoTokenizer`, no special tokens added) when it
        loads on this host, else text (~CHARS_PER_TOKEN chars a token; SGLang's reported prompt_tokens is what gets
        recorded); probe.task's frame is the tokenizer's chat template, which text cannot carry."""
        hf = hf_tokenizer(model_path)
        if hf is None:
            if task:
                raise ValueError(f"probe.task={task!r} needs the chat template of {model_path}, and no "
                                 "tokenizer for it loads on this host (transformers AutoTokenizer)")
            return PromptEncoding(encode=None)
        frame = split_frame(hf.apply_chat_template(task_messages(task), tokenize=False,
                                                   add_generation_prompt=True)) if task else None
        return PromptEncoding(encode=functools.partial(hf.encode, add_special_tokens=False), frame=frame, exact=False)

    def observer(self, server: ServerSpec) -> RunObserver:
        from workers.sglang.observe import SGLangObserver  # requests, prometheus_client: run time only

        return SGLangObserver(server)

    def plan_problems(self, point: PlanPoint) -> list[Problem]:
        """SGLang takes --speculative-attention-mode and may run past the model's context length (the adapter sets
        SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, workers/sglang/argv.py): none of the default rules hold."""
        return rules.sglang_problems(point)

    def context_problem(self, point: PlanPoint) -> Problem | None:
        return rules.context_problem(point)

    def draft_path_allowed(self, point: PlanPoint) -> str:
        silently = (" (SGLang would silently draft with the target itself: that is drafter=oracle)"
                    if point.drafter.algorithm is not Algorithm.DFLASH else "")
        return super().draft_path_allowed(point) + silently

    def run_params(self, point: PlanPoint) -> dict[str, str]:
        """Which backend runs prefill, decode and verify (not identity: `specsweep_common.sglang_facts`)."""
        return resolved_backends(point.attention, point.drafter.algorithm).params()

    def resource_estimate(self, point: PlanPoint) -> Resources:
        return Resources(min_tp_size=min_tp_size(point), max_concurrency=rules.max_concurrency(point))


def hf_tokenizer(model_path: str | None):
    """transformers' AutoTokenizer for the model, or None (no transformers, no local files, no network)."""
    if not model_path:
        return None
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(model_path)
    except Exception as e:  # no transformers, no local files, no network: text with reported counts
        logger.info("no tokenizer for %s (%s); sending text", model_path, type(e).__name__)
        return None
