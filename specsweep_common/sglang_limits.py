"""SGLang 0.5.23's request-length rules: how many of a request's max_new_tokens a server generates, or whether it
refuses the request. Greedy text requests, no --allow-auto-truncate, no diffusion LM (paths relative to
site-packages):

1. The tokenizer manager refuses (HTTP 400) a request with prompt + reserve >= server_context_len, or with
   prompt + reserve + max_new_tokens > server_context_len (`TokenizerManager._validate_one_request`,
   `sglang/srt/managers/tokenizer_manager.py:1333-1376`). reserve = `compute_num_reserved_tokens()`
   (`sglang/srt/managers/utils.py:484-500`): EAGLE and EAGLE3 keep their drafts in output slots,
   max(topk * num_steps, num_draft_tokens); every other algorithm 0.
2. The scheduler takes max_req_len = min(server_context_len - 1, max_total_tokens - 1) and
   max_req_input_len = max_req_len - 5
   (`TpModelWorker.get_worker_info`, `sglang/srt/managers/tp_worker.py:568-572`; max_total_tokens is the KV
   pool's capacity, /server_info `max_total_num_tokens`).
3. It clamps max_new_tokens to max_req_len - prompt - 1 (`Scheduler.init_req_max_new_tokens`,
   `sglang/srt/managers/scheduler.py:2709-2716`), then to the pool: max_total_tokens - prompt rounded up to a page - one
   page - 1 (`BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`, `sglang/srt/mem_cache/allocator/base.py:88-105`,
   called at `scheduler.py:2717-2729`).
4. It aborts a prompt of max_req_input_len tokens or more (`validate_input_length`,
   `sglang/srt/managers/utils.py:272-287`, called at `scheduler.py:3245-3253`).

So with the pool at least the context, a request is generated in full iff prompt + max_new_tokens + max(reserve, 2)
<= server_context_len and prompt <= server_context_len - 7. tests/orchestrator/config/test_context_edge.py checks
`sglang_generated` against SGLang's own functions at each edge. The names are this project's glossary
(docs/architecture.md): server_context_len is SGLang's `context_len` / --context-length, max_total_tokens its KV
pool (--max-total-tokens).
"""

from __future__ import annotations

SCHEDULER_INPUT_MARGIN = 5  # max_req_input_len = max_req_len - 5 (tp_worker.py:572)


def max_req_len(server_context_len: int, max_total_tokens: int | None = None) -> int:
    return min(server_context_len, max_total_tokens if max_total_tokens is not None else server_context_len) - 1


def max_req_input_len(server_context_len: int, max_total_tokens: int | None = None) -> int:
    """Prompts of this many tokens or more are aborted by the scheduler."""
    return max_req_len(server_context_len, max_total_tokens) - SCHEDULER_INPUT_MARGIN


def sglang_generated(prompt: int, max_new_tokens: int, server_context_len: int, *, reserve: int = 0,
                     max_total_tokens: int | None = None, page_size: int = 1) -> int | None:
    """The number of tokens SGLang would let the request generate; None when it refuses or aborts it.
    max_total_tokens None: a pool at least as large as the context (what a plan-time check assumes)."""
    if prompt + reserve >= server_context_len or prompt + reserve + max_new_tokens > server_context_len:
        return None  # rule 1: HTTP 400
    if prompt >= max_req_input_len(server_context_len, max_total_tokens):
        return None  # rule 4: aborted
    new = max(0, min(max_new_tokens, max_req_len(server_context_len, max_total_tokens) - prompt - 1))
    if max_total_tokens is not None:
        paged_prompt = -(-prompt // page_size) * page_size
        new = max(0, min(new, max_total_tokens - paged_prompt - page_size - 1))
    return new


def context_need(reserve: int) -> tuple[int, int]:
    """(slots on top of prompt + max_new_tokens, slots on top of the prompt alone) that a full generation needs
    below the context length: max(reserve, 2) and 7 (see the module doc)."""
    return max(reserve, 2), SCHEDULER_INPUT_MARGIN + 2
