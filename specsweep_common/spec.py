"""The typed contract between planning (orchestrator/, pure) and execution (workers/: Ray actors, engines).

Hydra's DictConfig is converted once, at the entry (orchestrator/config/schema.py), into these frozen dataclasses;
nothing below the entry sees a DictConfig. Their fields and defaults are the config's own: the Hydra structured
configs are generated from them. Planning builds `ServerGroup`s of `RunSpec`s; execution turns each `RunSpec`
into exactly one `RunResult`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from specsweep_common.domain import (ARGV, DELAY_S, IDENT, NAME, PATH, SECONDS, TOKENS, Choice,
                                     Int, Num, Text, domain)


# Fields marked NOT_IDENTITY (names, paths) never enter run_hash / ServerSpec.key.
NOT_IDENTITY = {"identity": False}
# A field renamed after run hashes were recorded keeps its old name in `stable_hash` (`{HASHED_AS: old}`), so
# resume still finds the runs recorded before the rename.
HASHED_AS = "hashed_as"
# Fields added after run hashes were recorded: left at None they stay out of run_hash, so old hashes hold.
IDENTITY_IF_SET = {"omit_if_none": True}
# Fields added after run hashes were recorded, with a default that means "as before": left at the default they
# stay out of run_hash.
IDENTITY_IF_NOT_DEFAULT = {"omit_if_default": True}


class EngineKind(str, enum.Enum):
    """The engines, and the two facts about a kind that code reading a stored run needs without the engine's
    adapter (the MLflow store, the report and the diagnosis import nothing of workers/): everything else an engine
    does or refuses is its adapter's (workers/registry.py)."""

    REFERENCE = "reference"
    SGLANG = "sglang"
    STUB = "stub"  # simulation engine (workers/stub/server.py): the seam's HTTP API with timed dummy tokens

    @property
    def simulated(self) -> bool:
        """Its commits and timings are simulated: its runs are recorded in their own experiment
        (`<sweep_name>-stub`), never judged by the diagnosis, never in one sweep with a real engine's."""
        return self is EngineKind.STUB

    @property
    def loads_kernel_plugin(self) -> bool:
        """The specsweep_verify attention backend is a plugin this engine loads (SGLang's attention-backend entry
        point, specsweep_kernels/sglang_plugin.py), whose dispatch the preflight and the diagnosis check; the
        reference engine calls the kernel directly."""
        return self is EngineKind.SGLANG

    @classmethod
    def named(cls, value: str) -> EngineKind | None:
        """The kind a stored run's `engine` tag names; None for a name this version does not know."""
        return cls._value2member_map_.get(value)  # type: ignore[return-value]


def engine_mix_allowed(kinds: frozenset[EngineKind] | set[EngineKind]) -> str | None:
    """What is allowed when one sweep mixes a simulated engine with a real one; None when it does not."""
    if any(k.simulated for k in kinds) and not all(k.simulated for k in kinds):
        return ("the stub engine alone or real engines alone in one sweep (stub runs are simulated and "
                "recorded in their own experiment, `<sweep_name>-stub`)")
    return None


class Algorithm(str, enum.Enum):
    """`--speculative-algorithm` values (SGLang names); NONE means no speculation flag at all."""

    NONE = "NONE"
    NGRAM = "NGRAM"
    STANDALONE = "STANDALONE"
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    DFLASH = "DFLASH"


# the algorithms whose server args SGLang 0.5.23 resolves as one family (a draft tree of topk x num_steps;
# `is_eagle() or is_standalone()` -> `_handle_eagle_family`: sglang/srt/speculative/spec_info.py:263-264), and those
# that need a draft model path
EAGLE_FAMILY = (Algorithm.EAGLE, Algorithm.EAGLE3, Algorithm.STANDALONE)
NEEDS_DRAFT_PATH = (Algorithm.STANDALONE, Algorithm.EAGLE3, Algorithm.DFLASH)


# probe.repeats: at most this many prompts a point (the t-interval is already within 2 % of the normal one at 30)
MAX_REPEATS = 64


class ProbeKind(str, enum.Enum):
    PREDICTABLE = "predictable"
    NOVEL = "novel"
    FILE = "file"


class AttentionKind(str, enum.Enum):
    GQA = "gqa"
    MLA = "mla"


class JobKind(str, enum.Enum):
    """What a grid point runs: an engine with a probe, or one verify-kernel shape (workers/kernel_job.py)."""

    ENGINE = "engine"
    KERNEL = "kernel"


# Kernel layouts by name: (num_q_heads, num_kv_heads, head_dim, v_head_dim, mla). `kernel.num_*` override them.
# specsweep_kernels.problems.LAYOUTS builds its Layouts from these.
KERNEL_LAYOUTS: dict[str, tuple[int, int, int, int, bool]] = {
    "gqa": (32, 8, 128, 128, False),  # Qwen3-8B-like
    "mla": (16, 1, 576, 512, True),  # DeepSeek-V3 latent (512 + 64 rope), one latent head
    "gqa-small": (8, 2, 32, 32, False),  # CPU interpreter tests
}


@dataclass(frozen=True)
class KernelSpec:
    """One verify-kernel benchmark shape (job=kernel): the whole identity of a kernel run."""

    layout: str = field(metadata=NOT_IDENTITY)  # preset name; the resolved heads/dims below are the identity
    num_q_heads: int
    num_kv_heads: int
    head_dim: int  # K head dim (MLA: 576)
    v_head_dim: int
    mla: bool
    prefix: int  # prefix (KV) tokens
    tokens: int  # T: tree tokens verified per step
    page_size: int
    dtype: str
    device: str  # cuda (graph-replay timing, floor_frac) | cpu (Triton interpreter)
    seed: int = 0

    @property
    def name(self) -> str:
        return f"layout={self.layout} prefix={self.prefix} T={self.tokens} page={self.page_size}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "KernelSpec":
        return cls(**json.loads(text))


class RunState(str, enum.Enum):
    """MLflow run statuses we produce."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class FailureReason(str, enum.Enum):
    ENGINE_START_FAILED = "engine_start_failed"
    ENGINE_DIED = "engine_died"
    TIMEOUT = "timeout"
    NODE_LOST = "node_lost"
    BAD_RESPONSE = "bad_response"
    INTERRUPTED = "interrupted"
    WORKER_ERROR = "worker_error"  # an unexpected exception inside the worker (a bug, not the engine)
    ENGINE_HUNG = "engine_hung"  # alive but its health path unanswered for engine.health_timeout_s: killed, restarted
    DISK_FULL = "disk_full"  # the tracking store's disk filled up while the sweep recorded (closed once writable)


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DTYPES = tuple(DTYPE_BYTES)
DEVICES = ("cpu", "cuda")
# How a checkpoint's weights are stored, in bytes per weight (`model.weight_dtype`; the weights-fit rule,
# workers/sglang/startup_rules.py).
WEIGHT_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0, "float8_e5m2": 1.0,
                "int8": 1.0, "int4": 0.5, "float4_e2m1": 0.5}
# `model.load_format`: every value an engine here takes, SGLang 0.5.23's --load-format choices
# (`LOAD_FORMAT_CHOICES`, sglang/srt/arg_groups/choices.py:3-28); the reference engine takes auto, safetensors,
# gguf and dummy (workers/reference/config.py LOAD_FORMATS), SGLang 0.5.10 all but three
# (specsweep_common/sglang_facts.py): the engines' rules refuse the rest per engine.
LOAD_FORMATS = ("auto", "pt", "safetensors", "instanttensor", "npcache", "dummy", "sharded_state", "presharded",
                "gguf", "expert_pack", "bitsandbytes", "mistral", "layered", "flash_rl", "remote", "remote_instance",
                "fastsafetensors", "private", "runai_streamer")


@dataclass(frozen=True)
class ModelSpec:
    name: str = field(metadata=domain(NAME, NOT_IDENTITY))  # config-group name, e.g. "tiny", "qwen3-8b"
    path: str = field(metadata=domain(PATH))  # built-in name ("tiny") or a checkpoint directory / HF id
    max_context_len: int = field(metadata=domain(TOKENS))  # tokens
    num_layers: int = field(metadata=domain(Int(1, 4096)))
    hidden_size: int = field(metadata=domain(Int(1, 2 ** 20)))
    num_q_heads: int = field(metadata=domain(Int(1, 4096)))
    num_kv_heads: int = field(metadata=domain(Int(1, 4096)))  # 1 for MLA (one latent head)
    head_dim: int = field(metadata=domain(Int(1, 4096)))  # K head dim (MLA: 576 = 512 latent + 64 rope)
    v_head_dim: int = field(metadata=domain(Int(1, 4096)))  # V head dim (MLA: 512)
    attention_kind: AttentionKind = AttentionKind.GQA
    dtype: str = field(default="float32", metadata=domain(Choice(*DTYPES)))  # KV/weights dtype the engine runs in
    # "dummy" (seeded random weights) or "auto"; SGLang knows more (gguf, safetensors, ...)
    load_format: str = field(default="dummy", metadata=domain(Choice(*LOAD_FORMATS)))
    # Weight size, for the plan-time check that the weights fit the GPUs (workers/sglang/startup_rules.py); they
    # describe the checkpoint at `path`, so they are no part of a run's identity. num_params: parameters of the
    # checkpoint (its model card; None: a lower bound from the attention shape); weight_dtype: how its weights are
    # stored where that is not `dtype` (DeepSeek-V3: float8_e4m3fn, its config.json quantization_config).
    num_params: int | None = field(default=None, metadata=domain(Int(1, 10 ** 14), NOT_IDENTITY))
    weight_dtype: str | None = field(default=None, metadata=domain(Choice(*WEIGHT_BYTES), NOT_IDENTITY))

    @property
    def kv_bytes_per_token(self) -> int:
        """K+V bytes one token occupies across all layers (MLA: one shared latent row)."""
        return kv_bytes_per_token(num_kv_heads=self.num_kv_heads, k_head_dim=self.head_dim,
                                  v_head_dim=self.v_head_dim, elt=DTYPE_BYTES[self.dtype],
                                  mla=self.attention_kind is AttentionKind.MLA, num_layers=self.num_layers)




def kv_bytes_per_token(*, num_kv_heads: int, k_head_dim: int, v_head_dim: int, elt: int, mla: bool = False,
                       num_layers: int = 1) -> int:
    """KV cache bytes of one token over `num_layers` layers: a K and a V row per KV head, or with MLA one
    latent row of k_head_dim per head whose first v_head_dim entries are read as V."""
    return num_layers * num_kv_heads * (k_head_dim if mla else k_head_dim + v_head_dim) * elt


@dataclass(frozen=True)
class DrafterSpec:
    name: str = field(metadata=domain(NAME, NOT_IDENTITY))  # config-group name: none, ngram, oracle, ...
    algorithm: Algorithm = Algorithm.NONE
    # the oracle sets this to the target's own path
    draft_model_path: str | None = field(default=None, metadata=domain(PATH))
    num_steps: int = field(default=0, metadata=domain(Int(0, 256)))  # tree depth
    topk: int = field(default=1, metadata=domain(Int(0, 256)))  # tree breadth
    num_draft_tokens: int = field(default=0, metadata=domain(Int(0, 4096)))  # max tree nodes
    is_oracle: bool = False  # the target drafts for itself: commit must be num_steps + 1
    # additional engine argv, e.g. DFLASH block size
    extra_args: tuple[str, ...] = field(default=(), metadata=domain(ARGV))
    # DFLASH draft window (tokens)
    draft_window_size: int | None = field(default=None, metadata=domain(TOKENS, IDENTITY_IF_SET))
    # reference engine: the draft model's first N layers + its norm and LM head (self-speculation when the draft
    # is the target); --speculative-draft-num-layers
    draft_num_layers: int | None = field(default=None, metadata=domain(Int(1, 4096), IDENTITY_IF_SET))


@dataclass(frozen=True)
class AttentionSpec:
    name: str = field(metadata=domain(NAME, NOT_IDENTITY))  # config-group name
    backend: str = field(metadata=domain(IDENT))  # --attention-backend
    decode_backend: str | None = field(default=None, metadata=domain(IDENT))
    prefill_backend: str | None = field(default=None, metadata=domain(IDENT))
    # --speculative-draft-attention-backend
    draft_backend: str | None = field(default=None, metadata=domain(IDENT))
    # SGLang --speculative-attention-mode: which of prefill/decode backend runs TARGET_VERIFY (None: SGLang's
    # default, prefill). specsweep_common.sglang_facts.resolved_backends says which backend verifies.
    speculative_attention_mode: str | None = field(default=None, metadata=domain(Choice("prefill", "decode"),
                                                                                IDENTITY_IF_SET))


@dataclass(frozen=True)
class SGLangOptions:
    """SGLang-only launch settings (`engine.sglang`); workers/sglang/argv.py turns them into the version's flags."""

    # None: SGLang's own choice
    mem_fraction_static: float | None = field(default=None, metadata=domain(Num(0, 0.999, lo_open=True)))
    # --cuda-graph-max-bs-decode (>= 0.5.20) / --cuda-graph-max-bs (0.5.10)
    cuda_graph_max_bs: int | None = field(default=None, metadata=domain(Int(1, 4096)))
    disable_cuda_graph: bool = False
    # None: SGLang sets 48 with speculation
    max_running_requests: int | None = field(default=None, metadata=domain(Int(1, 65536)))
    log_level: str | None = field(default=None, metadata=domain(Choice("debug", "info", "warning", "error",
                                                                        "critical")))
    # --max-total-tokens, the KV pool's size in tokens (None: SGLang sizes it from the memory fraction). A CPU
    # server sizes it from host memory: SmolLM2-135M's scheduler held 18.4 GB on the 24 GiB VM (2026-12-06)
    max_total_tokens: int | None = field(default=None, metadata=domain(Int(16, 1 << 30)))


# The stub engine's timing flags (workers/stub/server.py parse_args), in StubOptions field order.
STUB_FLAGS = ("--stub-token-s", "--stub-prefill-s", "--stub-startup-s", "--stub-rendezvous-timeout-s")


@dataclass(frozen=True)
class StubOptions:
    """The stub engine's timing (`engine.stub`, engine.kind=stub only). The stub is started with `engine.extra_args`
    (workers/stub/adapter.py StubAdapter), so planning prepends `argv()`; the flag names are workers/stub/server.py's."""

    token_s: float = field(default=0.005, metadata=domain(DELAY_S))  # seconds per generated token (decode)
    prefill_s: float = field(default=0.0, metadata=domain(DELAY_S))  # seconds per prompt token
    startup_s: float = field(default=0.2, metadata=domain(DELAY_S))  # seconds before /health answers 200
    # multi-node: how long rank 0 waits for the other ranks (and they for it)
    rendezvous_timeout_s: float = field(default=120.0, metadata=domain(SECONDS))

    def argv(self) -> tuple[str, ...]:
        values = (self.token_s, self.prefill_s, self.startup_s, self.rendezvous_timeout_s)
        return tuple(a for flag, v in zip(STUB_FLAGS, values) for a in (flag, repr(float(v))))


@dataclass(frozen=True)
class EngineSpec:
    kind: EngineKind
    # engine version the flag set targets ("0.5.23" for SGLang; ours for the reference)
    version: str = field(metadata=domain(IDENT))
    device: str = field(default="cpu", metadata=domain(Choice(*DEVICES)))  # reference engine: cpu | cuda
    startup_timeout_s: float = field(default=300.0, metadata=domain(SECONDS))
    request_timeout_s: float = field(default=600.0, metadata=domain(SECONDS))
    # while a run is in flight, an engine whose health path answers nothing for this long is hung: killed and
    # restarted like a crashed one, and only that run fails (workers/health_watch.py). Longer than SGLang's own
    # health-generation wait (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s: sglang/srt/entrypoints/http_server.py:218).
    health_timeout_s: float = field(default=60.0, metadata=domain(SECONDS, NOT_IDENTITY))
    extra_args: tuple[str, ...] = field(default=(), metadata=domain(ARGV))
    env: tuple[tuple[str, str], ...] = ()
    # the interpreter the engine's server runs in (null: the worker's own). SGLang on CPU runs in its own
    # environment, made by `make setup-sglang` (workers/sglang/cpu.py finds it when this is null)
    python: str | None = field(default=None, metadata=domain(Text(4096, empty=True, what="a path"), NOT_IDENTITY))
    sglang: SGLangOptions | None = field(default=None, metadata=IDENTITY_IF_SET)  # kind=sglang only
    stub: StubOptions | None = field(default=None, metadata=IDENTITY_IF_SET)  # kind=stub only


@dataclass(frozen=True)
class ServerSpec:
    """Everything that determines one engine process. Runs with equal ServerSpecs share a server."""

    engine: EngineSpec
    model: ModelSpec
    drafter: DrafterSpec
    attention: AttentionSpec
    page_size: int
    # the server's context window (its --context-length; config key server_context_len, or the model's
    # max_context_len), covering every run of its group
    server_context_len: int = field(metadata={HASHED_AS: "context_length"})
    seed: int = 0
    tp_size: int = 1
    nnodes: int = 1
    host: str = "127.0.0.1"
    job: JobKind | None = field(default=None, metadata=IDENTITY_IF_SET)  # KERNEL: no engine, kernel shapes

    @property
    def key(self) -> str:
        return stable_hash(self)[:12]

    @property
    def on_gpu(self) -> bool:
        """The engine runs on GPUs: engine.device=cuda (SGLang's conf says cuda; engine=sglang_cpu says cpu)."""
        return self.engine.device == "cuda"


@dataclass(frozen=True)
class ProbeSpec:
    kind: ProbeKind
    context_len: int  # prompt tokens to build
    gen_tokens: int  # tokens to generate (temperature 0, ignore_eos)
    sentence: str = field(default="The cat sat on the mat. ",  # predictable
                          metadata=domain(Text(10000, empty=True, what="a sentence")))
    # file probe: text or JSONL
    path: str | None = field(default=None, metadata=domain(Text(4096, empty=True, what="a path"), NOT_IDENTITY))
    content_sha256: str | None = None  # file probe: identity is the file's content, not its path
    seed: int = 0  # novel text
    # an instruction closing the prompt: context text + this, as one user turn in the model's chat template, with the
    # assistant's turn opened (workers/prompts.py). Empty: the context text alone (a plain continuation).
    task: str = field(default="", metadata=domain(Text(2000, empty=True, what="an instruction"),
                                                  IDENTITY_IF_NOT_DEFAULT))
    temperature: float = 0.0
    # requests in flight at once (one client thread each)
    concurrency: int = field(default=1, metadata=domain(Int(1, 1024), IDENTITY_IF_NOT_DEFAULT))
    # prompts per point, one after another: the same kind, a different text each (workers/prompts.py); the run
    # records each metric's mean and 95 % interval over them (workers/repeats.py)
    repeats: int = field(default=1, metadata=domain(Int(1, MAX_REPEATS), IDENTITY_IF_NOT_DEFAULT))


@dataclass(frozen=True)
class RunSpec:
    job_index: int  # position in the Hydra multirun (JobReturns come back in this order)
    server: ServerSpec
    probe: ProbeSpec
    run_hash: str  # stable_hash of (server, probe) — never of names, paths or the sweep
    name: str  # human name: "ctx=16k probe=predictable drafter=ngram page=1 attn=torch"
    params: tuple[tuple[str, str], ...] = ()  # flattened resolved config, for MLflow params
    overrides: tuple[str, ...] = ()  # this job's Hydra overrides
    kernel: KernelSpec | None = None  # job=kernel: the shape (the probe is then unused)
    # `metrics.log_patterns`: named-group regexes over the engine log lines this run produced -> per-step series.
    # Not identity: they change what is extracted, never the result (run_hash is of server and probe only).
    log_patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerGroup:
    server: ServerSpec
    runs: tuple[RunSpec, ...]

    @property
    def group_id(self) -> str:
        return self.server.key


@dataclass
class RunResult:
    """Exactly one per RunSpec; failures are data, not exceptions."""

    run: RunSpec
    state: RunState
    reason: FailureReason | None = None
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)  # e.g. "commit_len" per step
    artifacts: dict[str, str] = field(default_factory=dict)  # file name -> text (continuation, steps CSV, log tail)
    tags: dict[str, str] = field(default_factory=dict)  # node, GPU, engine version, attempt
    started_at: float = 0.0  # unix seconds
    ended_at: float = 0.0
    engine_time_s: float = 0.0  # wall time spent inside the engine for this run (probe requests)


def _canonical(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.metadata.get(HASHED_AS, f.name): _canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.metadata.get("identity", True)
                and not (f.metadata.get("omit_if_none") and getattr(obj, f.name) is None)
                and not (f.metadata.get("omit_if_default") and getattr(obj, f.name) == f.default)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_canonical(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items())}
    return obj


def stable_hash(*parts: Any) -> str:
    """sha256 of the canonical JSON of dataclasses/enums/primitives."""
    blob = json.dumps([_canonical(p) for p in parts], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
