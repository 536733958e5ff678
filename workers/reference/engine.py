"""Engine: builds the target (and draft) runners from the resolved args and serves requests with continuous batching.

One scheduler thread (`_loop`) owns every running request. Between steps it admits waiting requests (FIFO, up to
`--max-running-requests` and while the KV pool can hold each one's prompt + max_new_tokens + draft headroom) and
prefills each on its own; then one step decodes all running requests together: a draft proposal per request
(batched), one target forward for all of them (a decode token or a draft tree each), each request's own
acceptance. Finished and cancelled requests leave between steps. No prefix cache (`cached_tokens` is always 0).
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import torch

from .attention import create_attention_backend
from .model_source import load_config
from .request import CANCEL_POLL_S, Cancelled, Output, Request, RequestError, SamplingParams
from .finish import finish_reason, trim_matched_stop
from .cuda_graph import make_runner  # CUDA graphs for specsweep_verify on CUDA
from .model import build_model, layer_subset, skip_layers_kept
from .runner import ModelRunner
from .spec_counters import DEFAULT_DECODE_LOG_INTERVAL, AcceptLengthWindow, spec_meta_fields
from .request_export import RequestExport
from .speculative import (ENV_FAULT_REPEAT_BONUS, Drafter, ModelDrafter, NgramDrafter, SamplingError, SelfDrafter,
                          sample, verify_batch)
from .tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


DETERMINISTIC_SEED = 42  # SGLang seeds unseeded requests with it under --enable-deterministic-inference


@dataclass
class Stats:
    """Cumulative since start; read by /metrics and /server_info."""

    num_requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_verify_calls: int = 0
    spec_accepted_tokens: int = 0  # drafts + bonus, over all verify steps
    e2e_seconds: float = 0.0
    ttft_seconds: float = 0.0
    max_batch_size: int = 0  # most requests in one decode step
    # seconds of batched target-verify forwards (host clock, verify_batch's verify_s), once per forward: /metrics'
    # sglang:forward_execution_seconds_total{category="target_verify"}, never reset (workers/engine_counters.py)
    verify_forward_seconds: float = 0.0


def _dtype(args) -> torch.dtype:
    name = "float32" if args.dtype == "auto" else args.dtype
    return DTYPES[name]


class Engine:
    def __init__(self, args):
        self.args = args
        self.request_export: RequestExport | None = None  # set by the server after its warm-up generation
        self.device = torch.device(args.device)
        self.config = load_config(args.model_path)
        self.tokenizer = load_tokenizer(args.model_path)
        self.context_length = args.context_length or self.config.max_position_embeddings
        self.algorithm = (args.speculative_algorithm or "NONE").upper()
        self.num_steps, self.topk, self.num_draft_tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
        torch.manual_seed(args.random_seed)
        # A request without a seed, as SGLang: seeded with 42 under --enable-deterministic-inference
        # (sampling/sampling_batch_info.py:157-171), else from one generator seeded by --random-seed (sampler.py:837)
        self._unseeded = torch.Generator().manual_seed(args.random_seed)
        self._unseeded_lock = threading.Lock()
        dtype = _dtype(args)
        self.model = build_model(self.config, args.model_path, args.load_format, args.random_seed, dtype, self.device,
                                 init_on_device=args.dummy_weights_on_device)
        self.model.fused_ops = self._fused_ops()
        self.target = self._runner(self.model)
        self.drafter = self._build_drafter(dtype)
        self.fault_repeat_bonus = os.environ.get(ENV_FAULT_REPEAT_BONUS) == "1"  # tests only: a broken pipeline
        if self.fault_repeat_bonus:
            logger.warning("%s=1: every verify step commits a wrong bonus token (a test fault)", ENV_FAULT_REPEAT_BONUS)
        self.eos_id = self.config.eos_token_id if self.config.eos_token_id is not None else getattr(self.tokenizer, "eos_token_id", None)
        self.max_running_requests = args.max_running_requests
        self.stats = Stats()
        self.accept_window = AcceptLengthWindow(getattr(args, "decode_log_interval", DEFAULT_DECODE_LOG_INTERVAL))
        self.cancelled = threading.Event()  # shutting down: every request ends with Cancelled
        self.cond = threading.Condition()  # guards `waiting`, `running` (membership) and `idle`
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admitted; the scheduler thread's
        self.step_lock = threading.Lock()  # held by the scheduler around each admit + step; flush_cache takes it
        self._thread: threading.Thread | None = None

    def _fused_ops(self) -> bool:
        """Triton element-wise kernels in the decoder layers: on CUDA, unless --disable-fused-ops."""
        return self.device.type == "cuda" and not getattr(self.args, "disable_fused_ops", False)

    def _runner(self, model, pool=None, eager: bool = False) -> ModelRunner:
        """eager: a plain ModelRunner even where CUDA graphs would be used (a runner sharing another's pool)."""
        a = self.args
        max_seq = self.context_length + self._headroom()
        kw = dict(page_size=a.page_size, max_total_tokens=a.max_total_tokens or max_seq, max_seq_tokens=max_seq,
                  chunked_prefill_size=a.chunked_prefill_size)
        backend = create_attention_backend(a.attention_backend, self.device)
        if eager:
            return ModelRunner(model, backend, device=self.device, pool=pool, **kw)
        return make_runner(a, model, backend, self.device, **kw)

    def _headroom(self) -> int:
        """KV positions a request may use past prompt + max_new_tokens: a draft tree, a partial page."""
        return (self.num_draft_tokens or 1) + 2 * self.args.page_size

    def _build_drafter(self, dtype) -> Drafter | None:
        a = self.args
        if self.algorithm == "NONE":
            return None
        if self.algorithm == "NGRAM":
            return NgramDrafter(self.num_steps, self.topk, self.num_draft_tokens,
                                a.speculative_ngram_min_match_window_size, a.speculative_ngram_max_match_window_size)
        path = a.speculative_draft_model_path
        draft_cfg = load_config(path)
        if draft_cfg.vocab_size != self.config.vocab_size:
            raise ValueError(f"draft vocab {draft_cfg.vocab_size} != target vocab {self.config.vocab_size}")
        draft_format = a.speculative_draft_load_format or a.load_format
        layers = getattr(a, "speculative_draft_num_layers", None)
        tree = (self.num_steps, self.topk, self.num_draft_tokens)
        if path == a.model_path and draft_format == a.load_format:
            if layers is not None:  # self-speculation: a subset of the target's layers, reading its KV
                view = layer_subset(self.model, skip_layers_kept(self.config.num_hidden_layers, layers))
                return SelfDrafter(self._runner(view, pool=self.target.pool, eager=True), *tree)
            # the oracle: same weights, its own KV pool (seeded with the target's prompt K/V: no second prefill)
            return ModelDrafter(self._runner(self.model), *tree, same_as_target=True)
        draft_model = build_model(draft_cfg, path, draft_format, a.random_seed, dtype, self.device,
                                  init_on_device=a.dummy_weights_on_device)
        draft_model.fused_ops = self._fused_ops()
        if layers is not None:
            draft_model = layer_subset(draft_model, skip_layers_kept(draft_cfg.num_hidden_layers, layers))
        return ModelDrafter(self._runner(draft_model), *tree)

    # ---- requests -------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def _pages(self, num_prompt: int, params: SamplingParams) -> int:
        """KV pages a request may hold at most (prompt + max_new_tokens + headroom), in each pool."""
        return -(-(num_prompt + params.max_new_tokens + self._headroom()) // self.args.page_size)

    @property
    def max_total_num_tokens(self) -> int:
        """The target's KV pool capacity in tokens: SGLang's /server_info field of that name
        (sglang/srt/managers/scheduler.py:1945, tp_worker.py:576)."""
        return self.target.pool.num_slots

    @property
    def max_req_input_len(self) -> int:
        """The prompt length from which `check` refuses a request whatever its max_new_tokens (>= 1): SGLang's
        /server_info field of that name means the same (scheduler.py:1946, aborted at managers/utils.py:272-287);
        the limits differ (SGLang: min(context, KV pool) - 6, sglang/srt/managers/tp_worker.py:568-572)."""
        return min(self.context_length, self.target.pool.num_slots - self._headroom())

    def check(self, input_ids: list[int], params: SamplingParams) -> None:
        if not input_ids:
            raise RequestError("the prompt is empty")
        bad = [t for t in input_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise RequestError(f"input_ids out of range [0, {self.config.vocab_size}): {bad[:5]}")
        if params.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
        total = len(input_ids) + params.max_new_tokens
        if total > self.context_length:
            raise RequestError(f"the request needs {len(input_ids)} prompt + {params.max_new_tokens} new = "
                               f"{total} tokens, more than the context length {self.context_length}")
        if total + self._headroom() > self.target.pool.num_slots:
            raise RequestError(f"the request needs {total} tokens (+{self._headroom()} for drafts and pages) but "
                               f"the KV pool holds {self.target.pool.num_slots} (--max-total-tokens)")

    def num_active(self) -> int:
        """Requests submitted and not yet finished (waiting or running)."""
        with self.cond:
            return len(self.waiting) + len(self.running)

    def generate(self, input_ids: list[int], params: SamplingParams,
                 on_tokens: Callable[[list[int]], None] | None = None,
                 cancel: threading.Event | None = None, top_logprobs_num: int | None = None) -> Output:
        """Greedy/sampled generation with or without speculation, batched with whatever else runs. on_tokens(all
        output ids) after each step, from the scheduler thread. Setting `cancel` (the client went away) raises
        Cancelled here at once; the request leaves the batch at the next step. `top_logprobs_num` (not None: SGLang's
        return_logprob) adds each output token's logprob and its top-n to meta_info (`token_logprobs`)."""
        self.check(input_ids, params)
        self._check_cancelled(cancel)
        seed = params.sampling_seed if params.sampling_seed is not None else self._request_seed()
        req = Request(list(input_ids), params, torch.Generator().manual_seed(seed), on_tokens, cancel,
                      top_logprobs_num)
        with self.cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
                self._thread.start()
            self.waiting.append(req)
            self.cond.notify_all()
        while not req.done.wait(CANCEL_POLL_S):
            self._check_cancelled(cancel)
        if req.error is not None:
            raise req.error
        if req.result is None:
            raise RuntimeError("request done without a result or an error")
        return req.result

    def _request_seed(self) -> int:
        """The seed of a request that gives none (see __init__)."""
        if self.args.enable_deterministic_inference:
            return DETERMINISTIC_SEED
        with self._unseeded_lock:
            return int(torch.randint(0, 2 ** 62, (1,), generator=self._unseeded))

    def _check_cancelled(self, cancel: threading.Event | None) -> None:
        if self.cancelled.is_set():
            raise Cancelled("the engine is shutting down")
        if cancel is not None and cancel.is_set():
            raise Cancelled("the client went away")

    # ---- the scheduler --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the scheduler thread (every waiting or running request ends with Cancelled)."""
        self.cancelled.set()
        with self.cond:
            thread, self._thread = self._thread, None
            self.cond.notify_all()
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.running and not self.cancelled.is_set():
                    self.cond.wait()
                if self.cancelled.is_set() and not self.waiting and not self.running:
                    return
            with self.step_lock:
                try:
                    self._admit()
                    if self.running:
                        self._step(self.running)
                except Exception as exc:  # a bug or an exhausted pool: every running request fails, the loop lives
                    logger.exception("engine step failed")
                    for req in self.running:
                        req.error = exc
                self._retire()

    def _admit(self) -> None:
        """Move waiting requests that fit (count and KV pages) into the batch, FIFO; prefill each on its own."""
        with self.cond:
            for req in [r for r in self.waiting if self._stopped(r)]:
                self.waiting.remove(req)
                self._end(req)
            used = sum(self._pages(len(r.input_ids), r.params) for r in self.running)
            admitted: list[Request] = []
            while self.waiting and len(self.running) + len(admitted) < self.max_running_requests:
                need = self._pages(len(self.waiting[0].input_ids), self.waiting[0].params)
                if used + need > self.target.pool.allocator.num_pages:
                    break
                used += need
                admitted.append(self.waiting.pop(0))
            self.running += admitted
        for req in admitted:
            try:
                self._prefill(req)
            except Exception as exc:
                logger.exception("prefill failed")
                req.error = exc

    def _prefill(self, req: Request) -> None:
        req.seq = self.target.new_sequence()
        logits = self.target.extend(req.seq, req.input_ids)
        if self.drafter:
            req.draft = self.drafter.start(req.input_ids, req.seq)  # the draft's prefill belongs to the prefill phase
        try:
            req.add_tokens(sample(logits, req.params.temperature, req.gen), logits)
        except SamplingError as exc:  # this request's own fault (HTTP 400): it leaves, the batch goes on
            req.error = RequestError(str(exc))
            return
        req.ttft = time.perf_counter() - req.t0
        self._after_tokens(req)

    def _step(self, batch: list[Request]) -> None:
        """One decode step of every request in `batch` (prefilled, unfinished): one batched target forward."""
        batch = [r for r in batch if r.finish is None and r.error is None and not self._stopped(r)]
        if not batch:
            return
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch))
        if self.drafter is None:
            hidden = self.target.forward_batch([r.target_seq for r in batch], [torch.tensor(r.out[-1:]) for r in batch])
            logits = self.target.model.logits(torch.cat(hidden))  # [B, V]
            for i, req in enumerate(batch):
                try:
                    req.add_tokens(sample(logits[i:i + 1], req.params.temperature, req.gen), logits[i:i + 1])
                except SamplingError as exc:  # only this request fails (400); the others keep their tokens
                    req.error = RequestError(str(exc))
        else:
            trees = self.drafter.propose([r.draft for r in batch], [r.context for r in batch])
            results = verify_batch(self.target, [r.target_seq for r in batch], trees,
                                   [r.params.temperature for r in batch], [r.gen for r in batch],
                                   repeat_bonus=self.fault_repeat_bonus)
            for req, res in zip(batch, results):  # every step counts, the last one in full (spec_counters)
                if res.error is not None:
                    req.error = RequestError(str(res.error))
                    continue
                req.steps.append({"accept_len": len(res.committed), "accepted_drafts": res.accepted,
                                  "tree_depth": res.tree_depth, "tree_nodes": res.tree_nodes,
                                  "verify_s": res.verify_s, "batch_size": len(batch)})
                req.add_tokens(res.committed, res.committed_logits() if req.top_logprobs_num is not None else None)
            ok = [res for res in results if res.error is None]
            self.accept_window.decode_iteration(len(ok), sum(len(res.committed) for res in ok))
            self.stats.verify_forward_seconds += results[0].verify_s if results else 0.0  # one batched forward
        for req in batch:
            if req.error is None:
                self._after_tokens(req)

    def _after_tokens(self, req: Request) -> None:
        req.finish = finish_reason(req.out, req.params, self.decode, self.eos_id)
        if req.on_tokens and req.finish is None:  # a finished request's last tokens go out with its Output, trimmed
            req.on_tokens(req.out)

    def _stopped(self, req: Request) -> bool:
        return self.cancelled.is_set() or (req.cancel is not None and req.cancel.is_set())

    def _retire(self) -> None:
        """Requests that finished, failed or were cancelled leave the batch: pages back, result or error set."""
        with self.cond:
            leaving = [r for r in self.running if r.finish is not None or r.error is not None or self._stopped(r)]
            self.running = [r for r in self.running if r not in leaving]
        for req in leaving:
            self._end(req)

    def _end(self, req: Request) -> None:
        try:
            if req.seq is not None:
                req.seq.release()
            if self.drafter and req.draft is not None:
                self.drafter.finish(req.draft)
        finally:
            if req.error is None and req.finish is None:
                req.error = Cancelled("the engine is shutting down" if self.cancelled.is_set()
                                      else "the client went away")
            elif req.error is None:
                e2e = time.perf_counter() - req.t0
                self._account(len(req.input_ids), len(req.out), req.steps, req.ttft, e2e)
                meta = self._meta(req.input_ids, req.out, req.finish, req.steps, req.ttft, e2e)
                if req.top_logprobs_num is not None:
                    meta.update(req.logprob_meta())
                req.result = Output(req.out, meta)
                if self.request_export is not None:  # SGLang's --export-metrics-to-file (request_export.py)
                    self.request_export.write(meta, req.params, len(req.input_ids))
            req.done.set()

    def output_text(self, out: Output, params: SamplingParams) -> str:
        """The text of a finished request, as SGLang's detokenizer returns it (finish.trim_matched_stop)."""
        return trim_matched_stop(self.decode(out.output_ids), out.meta_info.get("finish_reason"), params.no_stop_trim)

    def _meta(self, input_ids, out, finish, steps, ttft, e2e) -> dict:
        meta = {"id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(input_ids),
                "completion_tokens": len(out), "cached_tokens": 0, "e2e_latency": e2e, "ttft": ttft,
                "first_token_latency": ttft}
        if self.drafter is not None and steps:  # SGLang 0.5.23's fields and semantics (spec_counters), plus our steps
            spec = spec_meta_fields([s["accepted_drafts"] for s in steps], len(out), self.num_draft_tokens)
            if spec:
                meta.update(spec, spec_steps=[{k: s[k] for k in ("accept_len", "tree_depth", "tree_nodes", "verify_s",
                                                                 "batch_size")} for s in steps])
        return meta

    def _account(self, prompt_len, out_len, steps, ttft, e2e) -> None:
        st = self.stats
        st.num_requests += 1
        st.prompt_tokens += prompt_len
        st.generation_tokens += out_len
        st.spec_verify_calls += len(steps)
        st.spec_accepted_tokens += sum(s["accept_len"] for s in steps)
        st.ttft_seconds += ttft
        st.e2e_seconds += e2e

    def flush_cache(self) -> None:
        """No prefix cache to drop; resets the page pools. Only with no request waiting or running (RequestError)."""
        with self.step_lock:
            if self.num_active():
                raise RequestError("cannot flush the cache while a request is running")
            self.target.pool.flush()
            if isinstance(self.drafter, ModelDrafter):
                self.drafter.runner.pool.flush()
            self.accept_window.reset()  # as SGLang's flush resets its MetricsReporter (spec_counters)

    def avg_spec_accept_length(self) -> float | None:
        """/server_info's avg_spec_accept_length: complete --decode-log-interval windows since the last flush, None
        before the first (spec_counters.AcceptLengthWindow)."""
        return self.accept_window.average() if self.drafter is not None else None
