"""What each supported SGLang version accepts, spells and reports: one table, read by the plan-time rules
(orchestrator/config/validate.py), the launch argv (workers/sglang/argv.py), the meta_info reader (workers/meta_info.py) and the /metrics
counters (workers/engine_counters.py).

Public API:

    SGLANG_VERSIONS: dict[str, SGLangFacts]          the supported versions, oldest first
    sglang_facts(version) -> SGLangFacts             ValueError naming the supported versions
    SGLANG_PLUGIN_BACKENDS, SGLANG_DRAFT_BACKENDS, SGLANG_EAGLE_DRAFT_WORKER_BACKENDS, SGLANG_BACKEND_PAGE_SIZES,
    SPEC_MAX_RUNNING_REQUESTS, DEVICE_TIMER_ENV, GENERATION_TOKENS, VERIFY_CALLS
                                                     version-independent facts (0.5.10-0.5.23)
    resolved_backends(attention, algorithm) -> ResolvedBackends   which backend runs prefill, decode, verify
    sglang_draft_backend(attention, algorithm) -> str | None      the --speculative-draft-attention-backend we pass

Sources: the released wheels (0.5.10 `server_args.py`; 0.5.23
`arg_groups/{choices,overrides,speculative_hook,attention_hook}.py`, `speculative/draft_utils.py`).
tests/workers/sglang/test_argv.py feeds every conf/ combination the rules accept to SGLang's own parser, and
tests/workers/test_meta_info.py reads each version's `meta_info` names. Standard library and specsweep_common only.
"""

from __future__ import annotations

from dataclasses import dataclass

from specsweep_common.spec import LOAD_FORMATS, Algorithm, AttentionSpec


@dataclass(frozen=True)
class MetaNames:
    """`meta_info` field names of the speculative-decoding counters of a finished /generate request."""

    verify_ct: str
    accepted: str  # accepted draft tokens (bonus excluded)
    proposed: str  # proposed draft tokens
    histogram: str  # index k: verify steps that accepted k drafts
    accept_length: str


@dataclass(frozen=True)
class SGLangFacts:
    version: str
    backends: tuple[str, ...]  # --attention-backend / --decode- / --prefill- choices, plus our plugin
    algorithms: tuple[Algorithm, ...]  # --speculative-algorithm values that exist
    eagle_paged_tree_backends: tuple[str, ...]  # EAGLE family: topk > 1 with page_size > 1
    ngram_paged_tree_backends: tuple[str, ...]  # NGRAM: topk (= max BFS breadth) > 1 with page_size > 1
    draft_window: bool  # --speculative-draft-window-size exists
    cuda_graph_max_bs: str  # the decode-batch capture-limit flag
    wrong_cuda_graph_flags: tuple[str, ...]  # the other versions' spellings, refused in extra_args
    disable_cuda_graph: tuple[str, ...]  # argv that turns CUDA graphs off
    plugin_entry_points: bool  # sglang.srt.plugins loads `sglang.srt.plugins` entry points
    load_formats: tuple[str, ...]  # --load-format choices
    meta: MetaNames

    @property
    def dflash(self) -> bool:
        """--speculative-algorithm DFLASH and --speculative-dflash-block-size exist."""
        return Algorithm.DFLASH in self.algorithms


# This project's attention-backend plugins (kernels/specsweep_kernels/sglang_plugin.py) -> the draft backend the
# SGLang adapter passes when none is configured (SGLang's draft workers only know their built-in backends).
SGLANG_PLUGIN_BACKENDS: dict[str, str] = {"specsweep_verify": "triton"}

_BACKENDS_0_5_10 = (
    "triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla",
    "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
)
# 0.5.18: `ATTENTION_BACKEND_CHOICES`, sglang/srt/server_args.py:181-207 of that wheel (the CPU release:
# workers/sglang/cpu.py)
_BACKENDS_0_5_18 = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "compressed", "cutlass_mla", "fa3", "fa4",
    "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "dual_chunk_flash_attn",
    "hpc_ops", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
)
_BACKENDS_0_5_23 = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
    "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla",
    "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx",
    "ascend", "intel_xpu",
)

SGLANG_VERSIONS: dict[str, SGLangFacts] = {
    "0.5.10": SGLangFacts(
        version="0.5.10", backends=_BACKENDS_0_5_10 + tuple(SGLANG_PLUGIN_BACKENDS),
        algorithms=(Algorithm.NGRAM, Algorithm.STANDALONE, Algorithm.EAGLE, Algorithm.EAGLE3),
        eagle_paged_tree_backends=("flashinfer", "fa3"), ngram_paged_tree_backends=("flashinfer",),
        draft_window=False, cuda_graph_max_bs="--cuda-graph-max-bs",
        wrong_cuda_graph_flags=("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"),
        disable_cuda_graph=("--disable-cuda-graph",), plugin_entry_points=False,
        # LOAD_FORMAT_CHOICES, sglang/srt/server_args.py:79-96 of 0.5.10
        load_formats=tuple(f for f in LOAD_FORMATS if f not in ("instanttensor", "presharded", "expert_pack")),
        meta=MetaNames(verify_ct="spec_verify_ct", accepted="spec_accept_token_num",
                       proposed="spec_draft_token_num", histogram="spec_accept_histogram",
                       accept_length="spec_accept_length")),
    # 0.5.18: 0.5.23's flag spellings (--cuda-graph-max-bs is a deprecated alias there, server_args.py:8774-8779)
    # and meta_info names (srt/managers/io_struct.py:1487-1491); the release SGLang's CPU backend is built from
    "0.5.18": SGLangFacts(
        version="0.5.18", backends=_BACKENDS_0_5_18 + tuple(SGLANG_PLUGIN_BACKENDS),
        algorithms=(Algorithm.NGRAM, Algorithm.STANDALONE, Algorithm.EAGLE, Algorithm.EAGLE3, Algorithm.DFLASH),
        eagle_paged_tree_backends=("flashinfer", "fa3", "triton"), ngram_paged_tree_backends=("flashinfer",),
        draft_window=True, cuda_graph_max_bs="--cuda-graph-max-bs-decode",
        wrong_cuda_graph_flags=(),
        disable_cuda_graph=("--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"),
        plugin_entry_points=True,  # LOAD_FORMAT_CHOICES in 0.5.18's server_args.py: no instanttensor, expert_pack
        load_formats=tuple(f for f in LOAD_FORMATS if f not in ("instanttensor", "expert_pack")),
        meta=MetaNames(verify_ct="spec_verify_ct", accepted="spec_num_correct_drafts",
                       proposed="spec_num_proposed_drafts", histogram="spec_correct_drafts_histogram",
                       accept_length="spec_accept_length")),
    # 0.5.20 removed --cuda-graph-max-bs (argparse: "ambiguous option"); --disable-cuda-graph is deprecated.
    "0.5.23": SGLangFacts(
        version="0.5.23", backends=_BACKENDS_0_5_23 + tuple(SGLANG_PLUGIN_BACKENDS),
        algorithms=(Algorithm.NGRAM, Algorithm.STANDALONE, Algorithm.EAGLE, Algorithm.EAGLE3, Algorithm.DFLASH),
        eagle_paged_tree_backends=("flashinfer", "fa3", "triton"), ngram_paged_tree_backends=("flashinfer",),
        draft_window=True, cuda_graph_max_bs="--cuda-graph-max-bs-decode",
        wrong_cuda_graph_flags=("--cuda-graph-max-bs",),
        disable_cuda_graph=("--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"),
        plugin_entry_points=True, load_formats=LOAD_FORMATS,  # sglang/srt/arg_groups/choices.py:3-28
        meta=MetaNames(verify_ct="spec_verify_ct", accepted="spec_num_correct_drafts",
                       proposed="spec_num_proposed_drafts", histogram="spec_correct_drafts_histogram",
                       accept_length="spec_accept_length")),
}

SGLANG_DRAFT_BACKENDS = ("flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu")
# Backends the EAGLE-family draft worker has (`speculative/draft_utils.py`).
SGLANG_EAGLE_DRAFT_WORKER_BACKENDS = (
    "flashinfer", "triton", "intel_amx", "intel_xpu", "aiter", "fa3", "hybrid_linear_attn", "flashmla",
    "trtllm_mha", "trtllm_mla", "cutedsl_mla", "dsa", "nsa", "ascend", "fa4", "dsv4",
)
# Page sizes a backend forces (`overrides.py` _mla_backend_page_constraints etc.): SGLang would silently run
# another page size than the grid point says.
SGLANG_BACKEND_PAGE_SIZES: dict[str, tuple[int, ...]] = {
    "flashmla": (64,), "hpc_ops": (64,), "trtllm_mla": (32, 64), "cutedsl_mla": (32, 64),
    "trtllm_mha": (16, 32, 64, 128), "intel_xpu": (64, 128),
}
SPEC_MAX_RUNNING_REQUESTS = 48  # --max-running-requests SGLang sets with speculation when it is unset
DEVICE_TIMER_ENV = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"  # sglang/srt/environ.py:479: per-forward device timing
# /metrics counters both real engines export (the reference engine under SGLang's names): each grows when a request
# finishes, by its completion_tokens and its spec_verify_ct (sglang/srt/observability/metrics_collector.py:2110-2112)
GENERATION_TOKENS = "sglang:generation_tokens_total"  # metrics_collector.py:1860-1861
VERIFY_CALLS = "sglang:spec_verify_calls_total"  # metrics_collector.py:1865-1866
# the device timer's counter (with DEVICE_TIMER_ENV) and the category of a verify forward
FORWARD_SECONDS = "sglang:forward_execution_seconds_total"  # metrics_collector.py:1054-1061
VERIFY_CATEGORY = "target_verify"  # eager_runner.py:344-350, decode_cuda_graph_runner.py:1986-1988


def sglang_facts(version: str) -> SGLangFacts:
    try:
        return SGLANG_VERSIONS[version]
    except KeyError:
        raise ValueError(f"SGLang {version!r} is not supported; supported: {', '.join(SGLANG_VERSIONS)}") from None


@dataclass(frozen=True)
class ResolvedBackends:
    """The attention backends an SGLang server runs, per forward mode."""

    prefill: str  # prefill / extend
    decode: str  # decode (one token)
    verify: str | None  # TARGET_VERIFY; None without speculation

    def params(self) -> dict[str, str]:
        return {"attention.resolved.prefill": self.prefill, "attention.resolved.decode": self.decode,
                "attention.resolved.verify": self.verify or "none"}


def resolved_backends(a: AttentionSpec, algorithm: Algorithm) -> ResolvedBackends:
    """The split fields fall back to --attention-backend (`attention_backends_of`); TARGET_VERIFY runs on the
    decode backend with --speculative-attention-mode decode, else on the prefill backend
    (`HybridAttnBackend._select_backend`; the DeepSeek models dispatch the same way)."""
    prefill, decode = a.prefill_backend or a.backend, a.decode_backend or a.backend
    if algorithm is Algorithm.NONE:
        return ResolvedBackends(prefill, decode, None)
    return ResolvedBackends(prefill, decode, decode if a.speculative_attention_mode == "decode" else prefill)


def sglang_draft_backend(a: AttentionSpec, algorithm: Algorithm) -> str | None:
    """The `--speculative-draft-attention-backend` the SGLang adapter passes: the configured one, else for a
    plugin target backend with a draft worker (EAGLE family, DFLASH) the plugin's default draft backend."""
    if a.draft_backend or algorithm in (Algorithm.NONE, Algorithm.NGRAM):
        return a.draft_backend
    for backend in (a.backend, a.decode_backend, a.prefill_backend):
        if backend in SGLANG_PLUGIN_BACKENDS:
            return SGLANG_PLUGIN_BACKENDS[backend]
    return None


__all__ = ["MetaNames", "ResolvedBackends", "SGLANG_BACKEND_PAGE_SIZES", "SGLANG_DRAFT_BACKENDS",
           "SGLANG_EAGLE_DRAFT_WORKER_BACKENDS", "SGLANG_PLUGIN_BACKENDS", "SGLANG_VERSIONS", "SGLangFacts",
           "SPEC_MAX_RUNNING_REQUESTS", "resolved_backends", "sglang_draft_backend", "sglang_facts"]
