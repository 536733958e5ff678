"""`specsweep_verify`: this project's verify kernel as an SGLang attention backend (a plugin, no fork).

    register()          add `specsweep_verify` to `--attention-backend` choices and register its factory
    backend_class()     the backend class (a subclass of SGLang's `TritonAttnBackend`), built on first use
    tree_mask_from_custom_mask(custom_mask, mask_indptr, prefix_lens, num_tokens) -> [B, T, T] bool
    decode_page_table(req_to_token, req_pool_indices, seq_lens) -> (page_table [B, W] int32, prefix_lens [B] int32)
    verify_step_inputs(...) / decode_step_inputs(...)   one step's prefix addressing + tree mask for verify_attention
    StepCache           what the layers of one forward step share: those inputs and one plan_verify() per workspace
    run_layer_attention(step_cache, ...)                 one layer: the step's plan, then verify_attention(plan=...)
    verify_width(parent) -> int     the TARGET_VERIFY tokens per request SGLang resolved (what the backend is sized for)
    DispatchCounts(sink)            each layer call of verify / decode counted: on the kernel, or a fallback + reason

How SGLang finds it (the `sglang.srt.plugins` entry-point group, `sglang/srt/plugins/__init__.py:29,57`):
- SGLang >= 0.5.16: the `sglang.srt.plugins` entry point `specsweep_verify` in pyproject.toml; SGLang's
  `load_plugins()` runs `register()` in the launcher, every scheduler, the detokenizer and the DP controller.
- SGLang 0.5.10 (no plugin framework): `python -m workers.sglang.launch ...` registers at module top level, so
  the spawned scheduler processes (which re-import `__main__` as `__mp_main__`) register too.
Both are what workers/sglang/argv.py emits for `attention=specsweep_verify`. `register()` is idempotent.

What runs our kernel: `forward_extend` in TARGET_VERIFY mode (T draft tokens per request against the cached
prefix, `spec_info.custom_mask` -> tree mask; None = a linear chain, causal) and `forward_decode` (T = 1). Everything
else (prefill / plain extend, draft-extend, MLA, sliding window, sinks, logit soft-cap, fp8 KV scales, decode
context parallelism, head dims the kernel does not take, T > 64) goes to `TritonAttnBackend` unchanged. Because
MLA layers would silently run Triton, `orchestrator.config.validate` refuses specsweep_verify with an MLA model on SGLang,
and refuses split backends where SGLang would verify on the other backend (docs/sglang.md).
Sizing: the workspace and the largest T the kernel takes come from `verify_width()`, the verify width SGLang
resolved (the parent Triton backend's own per-request width), never from the raw `server_args` field, which
0.5.23 leaves None under DFLASH (every 16-token verify would then have gone to Triton unseen).
Counting: every verify / decode layer call is counted by `DispatchCounts` into the prometheus counter
`specsweep_common.plugin_counters.COUNTER` (labels phase, path = kernel | fallback, reason), including CUDA-graph
replays (the hook before each replay re-sends the captured step's counts); SGLang's /metrics sums it over the
scheduler processes, and the server worker records per-run deltas (`plugin_kernel_calls`, `plugin_fallback_calls`,
by reason) so a run labelled specsweep_verify proves the kernel ran.
Metadata is the parent's: `forward_metadata.kv_indptr/kv_indices` (verify prefix, token slot ids at any page
size), `req_to_token` rows (decode prefix), and its CUDA-graph buffers; the kernel's workspace is allocated in
`init_cuda_graph_state` (or on first use) for the largest batch, so replays allocate nothing.
Once per forward step, not per layer (StepCache): the prefix addressing and tree mask are built from that metadata,
and, at batch >= 2, one plan_verify() kernel splits the step's prefix work on each workspace; every layer passes
plan= to verify_attention. At batch 1 nothing is planned (the kernels split one request themselves). Under CUDA-graph
capture the first layer's gathers and plan kernel are recorded once and the other layers read their outputs; a
replay re-runs them on the in-place-updated metadata.

The forward paths need a CUDA GPU and a running SGLang model runner: they are not exercised on CPU.
tests/kernels/test_sglang_plugin.py checks on CPU that the plugin loads through `load_plugins()`, that the name
parses as `--attention-backend`, that the class subclasses the real `TritonAttnBackend`, leaves none of
`AttentionBackend`'s methods unimplemented and ends a step at every metadata hook SGLang has; the pure helpers above
against hand-built metadata; and, through Triton's interpreter, layers of one step sharing one plan launch, results
equal to the torch reference.
SGLang is imported only inside `register()` / `backend_class()`: importing this module needs torch alone.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import torch

from specsweep_common import plugin_counters as pc

logger = logging.getLogger(__name__)

NAME = "specsweep_verify"
MAX_VERIFY_TOKENS = 64  # specsweep_kernels.verify_attention: T in 1..64


def register() -> None:
    """Make `--attention-backend specsweep_verify` parse and build our backend (safe to call again)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.server_args import add_attention_backend_choices

    if NAME in ATTENTION_BACKENDS:
        return
    try:
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES  # >= 0.5.20
    except ImportError:
        from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES  # 0.5.10
    if NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([NAME])
    register_attention_backend(NAME)(create_backend)
    logger.info("registered SGLang attention backend %s", NAME)


def create_backend(model_runner: Any) -> Any:
    """The factory SGLang calls with its ModelRunner."""
    return backend_class()(model_runner)


# ---------------------------------------------------------------- metadata -> kernel arguments (pure torch)


def tree_mask_from_custom_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor, prefix_lens: torch.Tensor,
                               num_tokens: int) -> torch.Tensor:
    """SGLang's flattened verify mask -> our [B, T, T] tree mask.

    custom_mask: flat bool, per request b a row-major [T, prefix_b + T] block starting at mask_indptr[b];
    column prefix_b + j of row i says whether draft token i sees draft token j (the prefix columns are all True).
    """
    t = num_tokens
    rows = torch.arange(t, device=custom_mask.device)
    width = prefix_lens.to(torch.int64) + t  # [B]
    start = mask_indptr[:-1].to(torch.int64) + prefix_lens.to(torch.int64)  # first tree column of row 0
    idx = start[:, None, None] + rows[None, :, None] * width[:, None, None] + rows[None, None, :]
    return custom_mask[idx].to(torch.bool).contiguous()


def causal_tree_mask(batch: int, num_tokens: int, device: torch.device) -> torch.Tensor:
    """A linear draft chain (DFLASH, EAGLE topk=1, decode): token i sees tokens 0..i."""
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril().expand(
        batch, num_tokens, num_tokens).contiguous()


def decode_page_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                      seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: the prefix is every cached token but the one being decoded (our kernel takes it as k_new).

    Returns the request rows of `req_to_token` (token slot ids, read with page_size=1) and seq_lens - 1.
    """
    page_table = req_to_token[req_pool_indices.to(torch.int64)].to(torch.int32)
    return page_table, (seq_lens - 1).to(torch.int32)


def verify_step_inputs(*, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, custom_mask: torch.Tensor | None,
                       mask_indptr: torch.Tensor, batch: int, num_tokens: int,
                       device: torch.device) -> dict[str, Any]:
    """TARGET_VERIFY: verify_attention's prefix addressing and tree mask from the parent's forward_metadata
    (custom_mask None: a linear chain)."""
    kv_indptr = kv_indptr[: batch + 1].to(torch.int32)
    if custom_mask is None:
        tree_mask = causal_tree_mask(batch, num_tokens, device)
    else:
        tree_mask = tree_mask_from_custom_mask(custom_mask, mask_indptr[: batch + 1], kv_indptr[1:] - kv_indptr[:-1],
                                               num_tokens)
    return {"kv_indptr": kv_indptr, "kv_indices": kv_indices.to(torch.int32), "tree_mask": tree_mask}


def decode_step_inputs(*, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                       batch: int, device: torch.device) -> dict[str, Any]:
    """Decode (T = 1): the prefix as a page table of token slots (decode_page_table) and a one-token mask."""
    page_table, prefix_lens = decode_page_table(req_to_token, req_pool_indices[:batch], seq_lens[:batch])
    return {"page_table": page_table, "prefix_lens": prefix_lens, "page_size": 1,
            "tree_mask": causal_tree_mask(batch, 1, device)}


class StepCache:
    """What the layers of one forward step share: the step's verify_attention inputs (`inputs`) and, per workspace,
    one plan_verify() (`plan`), so a step launches one plan kernel instead of one per layer.

    A step ends (everything is dropped) at new_step(), which the backend calls from each of SGLang's per-step
    metadata hooks, and at enter() with another forward-batch object or another CUDA-graph capture state than the
    step's. The capture check matters: SGLang builds one ForwardBatch per captured batch size and runs the model
    with it three times, two eager warm-ups and then the captured run (0.5.23 runner_backend/full_cuda_graph_backend.py
    capture_one, init_forward_metadata_in_graph before each run; 0.5.10 model_executor/cuda_graph_runner.py
    capture_one_batch_size, one init_forward_metadata_capture_cuda_graph before all three). A plan kept from a
    warm-up would leave the plan kernel out of the graph, and every replay would reuse the warm-up's split.
    Why not a cache attribute on the ForwardBatch (a plain @dataclass, no slots: assignment works in 0.5.10 and
    0.5.23, model_executor/forward_batch_info.py): besides the warm-ups, 0.5.23 copies batches with copy.copy
    (runner/prefill_cuda_graph_runner.py: a padded view with another batch_size; runner/row_bucket_graph_runner.py),
    and the copy would carry the other batch's plan.

    A workspace holds one plan at a time (a new plan overwrites it), so the cache keeps one per workspace, made
    again when block_n, num_splits, the batch or the prefix-lengths tensor differ from the kept one's.
    """

    def __init__(self) -> None:
        self._owner: weakref.ref | None = None
        self._capturing = False
        self._inputs: dict[Hashable, dict[str, Any]] = {}
        self._params: dict[tuple, tuple[Any, int]] = {}  # launch shapes -> verify_launch_params()
        self._plans: dict[int, tuple] = {}  # id(workspace) -> (workspace, lens, (block_n, num_splits, batch), plan)

    def new_step(self) -> None:
        self._owner = None
        self._inputs.clear()
        self._params.clear()
        self._plans.clear()

    def enter(self, owner: Any, *, capturing: bool) -> None:
        """Called by each layer with its forward batch: starts a new step unless it is the step's batch, in the
        step's capture state."""
        if self._owner is None or self._owner() is not owner or self._capturing != capturing:
            self.new_step()
            self._owner = weakref.ref(owner)
            self._capturing = capturing

    def inputs(self, key: Hashable, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """make() once per step and key (the first layer); the same tensors for the others."""
        if key not in self._inputs:
            self._inputs[key] = make()
        return self._inputs[key]

    def plan_of(self, workspace: Any) -> Any:
        """The plan this step keeps for workspace (None: none yet, or batch 1)."""
        kept = self._plans.get(id(workspace))
        return kept[3] if kept is not None and kept[0] is workspace else None

    def plan(self, **call: Any) -> Any:
        """The step's plan_verify() for verify_attention(**call) (its arguments but plan), or None at batch 1
        (both kernels split one request themselves) and where the torch reference runs instead of the kernels."""
        from specsweep_kernels.verify_attention import (kernel_is_interpreted, plan_verify, step_needs_plan,
                                                        verify_launch_params)

        q, ws = call["q"], call["workspace"]
        batch = q.shape[0]
        if not step_needs_plan(batch) or (q.device.type != "cuda" and not kernel_is_interpreted()):
            return None
        lens_name = "kv_indptr" if call.get("kv_indptr") is not None else "prefix_lens"
        lens = call[lens_name]
        shapes = (tuple(q.shape), q.dtype, q.device, tuple(call["k_buffer"].shape[1:]), call.get("v_buffer") is None,
                  call["out"].shape[-1], call.get("page_size", 1), lens_name, call.get("impl", "auto"), ws.max_splits)
        if shapes not in self._params:
            self._params[shapes] = verify_launch_params(**call)
        config, num_splits = self._params[shapes]
        key = (config.block_n, num_splits, batch)
        kept = self._plans.get(id(ws))
        if kept is None or kept[0] is not ws or kept[1] is not lens or kept[2] != key:
            plan = plan_verify(workspace=ws, block_n=config.block_n, num_splits=num_splits, **{lens_name: lens})
            kept = self._plans[id(ws)] = (ws, lens, key, plan)
        return kept[3]


def run_layer_attention(step_cache: StepCache, *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_buffer: torch.Tensor, v_buffer: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                        head_dim: int, sm_scale: float, batch: int, num_tokens: int, workspace: Any,
                        inputs: dict[str, Any]) -> torch.Tensor:
    """One layer's verify / decode attention with the step's plan. q [B*T, Hq*D], k / v [B*T, Hkv*D] (any
    view of those), the layer's pool buffers [slots, Hkv, D]; inputs from verify_step_inputs / decode_step_inputs.
    Returns [B*T, Hq*D]."""
    from specsweep_kernels.verify_attention import verify_attention

    out = q.new_empty((batch, num_tokens, num_q_heads, head_dim))
    call = dict(q=q.reshape(batch, num_tokens, num_q_heads, head_dim), k_buffer=k_buffer, v_buffer=v_buffer,
                k_new=k.reshape(batch, num_tokens, num_kv_heads, head_dim),
                v_new=v.reshape(batch, num_tokens, num_kv_heads, head_dim), sm_scale=sm_scale, out=out,
                workspace=workspace, **inputs)
    verify_attention(**call, plan=step_cache.plan(**call))
    return out.view(batch * num_tokens, num_q_heads * head_dim)


# ---------------------------------------------------------------- how wide a verify the backend is sized for


def spec_capacity() -> int | None:
    """0.5.23: the most draft tokens speculation may use in this process, adaptive states included
    (`sglang/srt/runtime_context.py:1982-2000`, over the bag published by the scheduler); None elsewhere."""
    try:
        from sglang.srt.runtime_context import max_speculative_num_draft_tokens
        value = max_speculative_num_draft_tokens()
    except Exception:  # 0.5.10 (no runtime context), or nothing published in this process
        return None
    return value if isinstance(value, int) else None


def verify_width(parent: Any) -> int:
    """Tokens per request of a TARGET_VERIFY forward, as the parent TritonAttnBackend `parent` sized itself:
    0.5.23 `target_verify_num_tokens_per_req = model_runner.decode_num_tokens_per_req()`
    (`sglang/srt/layers/attention/triton_backend.py:233`; the resolved width, `model_executor/model_runner.py:876-897`
    -> `speculative/spec_utils.py:104-109`) and `num_draft_tokens = get_spec().speculative_num_draft_tokens`
    (`triton_backend.py:227`); 0.5.10 `num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens`
    (its `triton_backend.py:88`, resolved in place by `__post_init__`); and `spec_capacity()`. The largest; 1
    without speculation (decode is T = 1).

    Not `model_runner.server_args.speculative_num_draft_tokens`: in 0.5.23 the record keeps the raw input and
    resolution is declared beside it (`sglang/srt/arg_groups/overrides.py:110-137`), so under DFLASH, whose
    width comes from `--speculative-dflash-block-size` (`arg_groups/speculative_hook.py:368-424`), it is None."""
    widths = (getattr(parent, "target_verify_num_tokens_per_req", None), getattr(parent, "num_draft_tokens", None),
              spec_capacity())
    return max((int(w) for w in widths if isinstance(w, int) and not isinstance(w, bool) and w > 0), default=1)


# ---------------------------------------------------------------- counting what ran where


class DispatchCounts:
    """Each layer's attention call of the phases the kernel claims ("verify": TARGET_VERIFY, "decode"), on our
    kernel or handed to SGLang's Triton backend with a reason (`specsweep_common.plugin_counters.FALLBACK_REASONS`),
    sent to `sink(phase, path, reason, n)` (the prometheus counter: `prometheus_sink`).

    CUDA graphs: a replay runs no Python, so the layers cannot count themselves. Every forward whose layers ran
    Python (eager, the capture warm-ups, the captured run) is kept as its phase's record (layer calls by outcome);
    `replay(phase)`, called from the hook SGLang runs before each replay (REPLAY_HOOKS), sends that record again.
    A captured run (`capturing=True`) is recorded but not sent: capture executes nothing. A forward step ends at
    `new_step()` (every metadata hook), and where a layer repeats within a step (0.5.10 runs its two warm-ups and
    the captured run after one capture hook) or the capture state changes."""

    def __init__(self, sink: Callable[[str, str, str, float], None]):
        self._sink = sink
        self._step: Counter = Counter()  # (phase, path, reason) -> layer calls of the step under way
        self._layers: set = set()
        self._capturing = False
        self.recorded: dict[str, Counter] = {}  # phase -> its last complete step

    def new_step(self) -> None:
        phases = {key[0] for key in self._step}
        if len(phases) == 1:
            self.recorded[phases.pop()] = self._step
        self._step, self._layers = Counter(), set()

    def layer(self, phase: str, layer_id: Any, reason: str | None, *, capturing: bool = False) -> None:
        if layer_id in self._layers or (self._step and capturing != self._capturing):
            self.new_step()
        self._layers.add(layer_id)
        self._capturing = capturing
        key = (phase, pc.KERNEL, "") if reason is None else (phase, pc.FALLBACK, reason)
        self._step[key] += 1
        if not capturing:
            self._sink(*key, 1)

    def replay(self, phase: str) -> None:
        record = self.recorded.get(phase)
        if not record:
            self._sink(phase, pc.FALLBACK, "replay_unrecorded", 1)
            return
        for key, n in record.items():
            self._sink(*key, n)


@functools.lru_cache(maxsize=None)
def prometheus_counter() -> Any:
    """The process's counter (`specsweep_common.plugin_counters.COUNTER`), created on first use: in a scheduler,
    after SGLang put PROMETHEUS_MULTIPROC_DIR in the environment, so that SGLang's /metrics sums it over processes.
    Never import prometheus_client earlier in the launcher: it picks its value class once, at import. None when
    prometheus_client is missing."""
    try:
        from prometheus_client import Counter as PromCounter
    except ImportError:
        logger.warning("prometheus_client is missing: %s calls are not counted", NAME)
        return None
    counter = PromCounter(pc.COUNTER, "specsweep_verify attention calls per layer: on the kernel or handed to "
                          "SGLang's Triton backend (reason)", labelnames=pc.LABELS)
    for phase in pc.PHASES:  # present (at 0) from start-up, so a run with no call reads 0, not nothing
        counter.labels(phase, pc.KERNEL, "")
    return counter


def prometheus_sink(phase: str, path: str, reason: str, n: float) -> None:
    counter = prometheus_counter()
    if counter is not None:
        counter.labels(phase, path, reason).inc(n)


# SGLang's once-per-step metadata hooks (each one the backend has ends our step): init_forward_metadata (eager,
# every version); 0.5.10: the capture / replay pair; 0.5.23: out_graph (capture, replay) and in_graph (before each
# warm-up and the captured run, recorded into the graph).
STEP_HOOKS = ("init_forward_metadata", "init_forward_metadata_capture_cuda_graph",
              "init_forward_metadata_replay_cuda_graph", "init_forward_metadata_out_graph",
              "init_forward_metadata_in_graph")


# The hooks SGLang calls before replaying a captured CUDA graph (the layers' Python does not run then), with how
# to tell from their arguments which forward mode is replayed: 0.5.23 `init_forward_metadata_out_graph(
# forward_batch, in_capture=False)` (base_attn_backend.py:117-137: called at capture with in_capture=True and
# before each replay; TritonAttnBackend keeps its own eager body, triton_backend.py:870); 0.5.10
# `init_forward_metadata_replay_cuda_graph(bs, ..., forward_mode, spec_info, ...)` (triton_backend.py:664).
REPLAY_HOOKS = ("init_forward_metadata_out_graph", "init_forward_metadata_replay_cuda_graph")


def replayed_phase(parent: Callable, name: str, args: tuple, kwargs: dict) -> str | None:
    """The phase ("verify" / "decode") a replay hook call announces; None for a capture, another forward mode or
    a hook that is no replay hook."""
    if name not in REPLAY_HOOKS:
        return None
    try:
        bound = inspect.signature(parent).bind(None, *args, **kwargs).arguments
    except TypeError:
        return None
    if name == "init_forward_metadata_out_graph":
        if bound.get("in_capture", False):
            return None
        mode = getattr(bound.get("forward_batch"), "forward_mode", None)
    else:
        mode = bound.get("forward_mode")
    return phase_of(mode)


def phase_of(mode: Any) -> str | None:
    if mode is None:
        return None
    if mode.is_target_verify():
        return "verify"
    return "decode" if mode.is_decode() else None


def _ends_step(parent: Callable, name: str) -> Callable:
    @functools.wraps(parent)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._step_cache.new_step()
        self._dispatch.new_step()
        phase = replayed_phase(parent, name, args, kwargs)
        if phase is not None:
            self._dispatch.replay(phase)
        return parent(self, *args, **kwargs)
    return hook


# ---------------------------------------------------------------- the backend class


@functools.lru_cache(maxsize=None)
def backend_class() -> type:
    """Build the subclass on first use (SGLang's Triton backend is imported only here)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from specsweep_kernels.verify_attention import allocate_workspace

    class SpecsweepVerifyAttnBackend(TritonAttnBackend):
        """TritonAttnBackend whose TARGET_VERIFY and decode attention run `specsweep_kernels.verify_attention`."""

        def __init__(self, model_runner: Any, *args: Any, **kwargs: Any):
            self._step_cache = StepCache()  # before the parent's __init__, which may already call a metadata hook
            self._dispatch = DispatchCounts(prometheus_sink)
            super().__init__(model_runner, *args, **kwargs)
            self._workspaces: dict[tuple[int, int], Any] = {}
            self._max_bs = int(getattr(model_runner.req_to_token_pool, "size", 1))
            self._max_tokens = min(MAX_VERIFY_TOKENS, verify_width(self))
            prometheus_counter()

        # -- CUDA graphs: allocate the workspace before capture
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args: Any, **kwargs: Any):
            super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
            self._max_bs = max(self._max_bs, max_bs)

        def _workspace(self, num_q_heads: int, v_head_dim: int, device: torch.device) -> Any:
            key = (num_q_heads, v_head_dim)
            ws = self._workspaces.get(key)
            if ws is None:
                ws = allocate_workspace(max_batch=self._max_bs, max_tokens=self._max_tokens,
                                        num_q_heads=num_q_heads, v_head_dim=v_head_dim, device=device)
                self._workspaces[key] = ws
            return ws

        def _fallback_reason(self, layer: Any, num_tokens: int, k: Any, kwargs: dict) -> str | None:
            """None when the kernel takes this layer's call, else why not (FALLBACK_REASONS)."""
            d = layer.qk_head_dim
            checks = (("no_k", k is None), ("mla", self.use_mla),
                      ("head_dim", not (d == layer.v_head_dim and d & (d - 1) == 0 and 16 <= d <= 256)),
                      ("tokens", not 1 <= num_tokens <= self._max_tokens),
                      ("extra_inputs", any(kwargs.get(x) is not None for x in ("sinks", "score_mod", "aux_tensors"))),
                      ("logit_cap", bool(getattr(layer, "logit_cap", 0))),
                      ("sliding_window", getattr(layer, "sliding_window_size", -1) not in (-1, None)),
                      ("kv_scale", getattr(layer, "k_scale", None) is not None),
                      ("dcp", getattr(self, "dcp_size", 1) != 1),
                      ("cross_attention", bool(getattr(layer, "is_cross_attention", False))))
            return next((reason for reason, applies in checks if applies), None)

        def _dispatched(self, phase: str, layer: Any, num_tokens: int, q: torch.Tensor, k: Any,
                        kwargs: dict) -> bool:
            """Whether the kernel runs this layer's call; counted either way."""
            reason = self._fallback_reason(layer, num_tokens, k, kwargs)
            capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
            self._dispatch.layer(phase, getattr(layer, "layer_id", id(layer)), reason, capturing=capturing)
            return reason is None

        def _save_kv(self, forward_batch: Any, layer: Any, k: torch.Tensor, v: torch.Tensor) -> None:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)

        def _step(self, forward_batch: Any, q: torch.Tensor) -> StepCache:
            capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
            self._step_cache.enter(forward_batch, capturing=capturing)
            return self._step_cache

        def _run(self, q, k, v, layer, forward_batch, num_tokens, inputs) -> torch.Tensor:
            hq, d = layer.tp_q_head_num, layer.qk_head_dim
            pool = forward_batch.token_to_kv_pool
            return run_layer_attention(
                self._step_cache, q=q, k=k, v=v, k_buffer=pool.get_key_buffer(layer.layer_id),
                v_buffer=pool.get_value_buffer(layer.layer_id), num_q_heads=hq, num_kv_heads=layer.tp_k_head_num,
                head_dim=d, sm_scale=layer.scaling, batch=forward_batch.batch_size, num_tokens=num_tokens,
                workspace=self._workspace(hq, d, q.device), inputs=inputs)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            mode = forward_batch.forward_mode
            num_tokens = q.shape[0] // max(1, forward_batch.batch_size)
            if not mode.is_target_verify() or not self._dispatched("verify", layer, num_tokens, q, k, kwargs):
                return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            if save_kv_cache:
                self._save_kv(forward_batch, layer, k, v)
            meta = self.forward_metadata
            inputs = self._step(forward_batch, q).inputs(("verify", num_tokens), lambda: verify_step_inputs(
                kv_indptr=meta.kv_indptr, kv_indices=meta.kv_indices, custom_mask=meta.custom_mask,
                mask_indptr=meta.mask_indptr, batch=forward_batch.batch_size, num_tokens=num_tokens, device=q.device))
            return self._run(q, k, v, layer, forward_batch, num_tokens, inputs)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            if not self._dispatched("decode", layer, 1, q, k, kwargs):
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            if save_kv_cache:
                self._save_kv(forward_batch, layer, k, v)
            inputs = self._step(forward_batch, q).inputs(("decode",), lambda: decode_step_inputs(
                req_to_token=self.req_to_token, req_pool_indices=forward_batch.req_pool_indices,
                seq_lens=forward_batch.seq_lens, batch=forward_batch.batch_size, device=q.device))
            return self._run(q, k, v, layer, forward_batch, 1, inputs)

    for name in STEP_HOOKS:
        if hasattr(TritonAttnBackend, name):
            setattr(SpecsweepVerifyAttnBackend, name, _ends_step(getattr(TritonAttnBackend, name), name))
    SpecsweepVerifyAttnBackend.__module__ = __name__
    return SpecsweepVerifyAttnBackend
