"""A request of the reference engine: its sampling params, its state from submission to its Output, and the
logprobs SGLang's `return_logprob` adds (the native /generate's; workers/reference/request_params.py parses them).
The scheduler (workers/reference/engine.py) owns every Request once admitted."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .kv_cache import PagedSequence


class RequestError(ValueError):
    """A request the engine refuses (HTTP 400)."""


class Cancelled(RuntimeError):
    """The request stopped before it finished: its client went away, or the engine is shutting down."""


CANCEL_POLL_S = 0.05  # a caller waiting for its request checks this often whether it was cancelled


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    sampling_seed: int | None = None
    no_stop_trim: bool = False  # keep a matched stop string in the text (SGLang's sampling param of that name)


@dataclass
class Output:
    output_ids: list[int]
    meta_info: dict


def token_logprobs(logits: Tensor, tokens: list[int], top_n: int) -> tuple[list[list], list[list]]:
    """SGLang's greedy logprobs of `tokens` (one per row of `logits`, [k, V]): the float32 log-softmax of the logits
    the token was chosen from (sglang/srt/layers/sampler.py:215-222: argmax, then log_softmax(logits)), and the
    `top_n` best of each row, best first (sglang/srt/layers/logprob_processor.py:105-117: logprobs.topk). Entries
    have SGLang's answer shape, [logprob, token_id, text] with no text (tokenizer_manager.py:3104-3108)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens, dtype=torch.long, device=lp.device).unsqueeze(1)).squeeze(1).tolist()
    out = [[v, t, None] for v, t in zip(chosen, tokens)]
    if top_n <= 0:
        return out, [[] for _ in tokens]
    vals, idx = lp.topk(top_n, dim=-1)
    return out, [[[v, t, None] for v, t in zip(vr, ir)] for vr, ir in zip(vals.tolist(), idx.tolist())]


@dataclass(eq=False)
class Request:
    """One generation, from submission to its Output (or error). Touched by the scheduler thread only, once admitted."""

    input_ids: list[int]
    params: SamplingParams
    gen: torch.Generator
    on_tokens: Callable[[list[int]], None] | None = None
    cancel: threading.Event | None = None
    top_logprobs_num: int | None = None  # None: no logprobs (SGLang's return_logprob=false); else the top-n per token
    seq: PagedSequence | None = None  # the target's, from prefill to release
    draft: object = None   # the drafter's per-request state
    out: list[int] = field(default_factory=list)
    logprobs: list[list] = field(default_factory=list)  # per output token: [logprob, token_id, None]
    top_logprobs: list[list] = field(default_factory=list)  # per output token: its top_logprobs_num entries
    steps: list[dict] = field(default_factory=list)
    finish: dict | None = None
    t0: float = field(default_factory=time.perf_counter)
    ttft: float = 0.0
    result: Output | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def context(self) -> list[int]:
        return self.input_ids + self.out

    def add_tokens(self, tokens: list[int], logits: Tensor | None) -> None:
        """Commit `tokens`, each chosen from its row of `logits` ([len(tokens), V]; needed only when the request
        asked for logprobs); their logprobs if asked for."""
        self.out += tokens
        if self.top_logprobs_num is not None:
            if logits is None:
                raise RuntimeError("logprobs asked for, but no logits given with the tokens")
            chosen, top = token_logprobs(logits, tokens, self.top_logprobs_num)
            self.logprobs += chosen
            self.top_logprobs += top

    def logprob_meta(self) -> dict:
        """SGLang's logprob fields of a request with return_logprob (tokenizer_manager.py:2868-2870, 2960-2972):
        output tokens only (logprob_start_len -1 or the prompt's length: no input entries), cut where `out` was cut
        (a stop, or a verify step past max_new_tokens)."""
        n = len(self.out)
        meta = {"input_token_logprobs": [], "output_token_logprobs": self.logprobs[:n],
                "output_token_logprobs_length": n}
        if self.top_logprobs_num:
            meta.update(input_top_logprobs=[], output_top_logprobs=self.top_logprobs[:n])
        return meta

    @property
    def target_seq(self) -> PagedSequence:
        """`seq` of a request already prefilled."""
        if self.seq is None:
            raise RuntimeError("request used before its prefill: no target sequence")
        return self.seq
