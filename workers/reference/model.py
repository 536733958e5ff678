"""Qwen3/Llama-style decoder: GQA + RoPE (+ q/k RMSNorm for Qwen3), SwiGLU MLP, RMSNorm, LM head; HF parameter names."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specsweep_kernels import fused_ops

from .attention import AttentionBackend, AttentionMetadata, BatchMetadata
from .config import ModelConfig
from .kv_cache import KVPool

logger = logging.getLogger(__name__)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # one fused kernel on CUDA (F.rms_norm) instead of pow/mean/add/rsqrt/mul; fp32 math as HF's Qwen3
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def add_forward(self, x: Tensor, residual: Tensor | None, fused: bool) -> tuple[Tensor, Tensor]:
        """(norm(residual + x), residual + x); residual None: (norm(x), x). `fused`: one Triton kernel
        (specsweep_kernels.fused_ops.add_rms_norm, which updates `residual` in place)."""
        if fused:
            if residual is None:
                return fused_ops.add_rms_norm(x, weight=self.weight, eps=self.eps), x
            return fused_ops.add_rms_norm(x, weight=self.weight, eps=self.eps, residual=residual), residual
        residual = x if residual is None else residual + x
        return self(residual), residual


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    # positions: [T] -> cos, sin: [T, 1, D] (fp32, half-split layout as HF's rotate_half)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [T, H, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.window = cfg.window_of(layer_id)
        self.scale = cfg.head_dim ** -0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=bias)
        # Qwen3 normalises each head of q and k; Llama does not (cfg.qk_norm False: no parameters)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.qkv_weight: Tensor | None = None  # set by merge(): q/k/v weights as one [(Hq+2Hkv)*D, hidden]
        self.qkv_bias: Tensor | None = None

    def merge(self) -> None:
        """One QKV GEMM instead of three: the three weights become views into one concatenated tensor (no
        extra memory; q_proj/k_proj/v_proj keep working and keep their HF names)."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight = _concat_views([p.weight for p in projs])
        self.qkv_bias = _concat_views([p.bias for p in projs]) if self.q_proj.bias is not None else None

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], pool: KVPool, meta: AttentionMetadata | BatchMetadata,
                backend: AttentionBackend, fused: bool = False) -> Tensor:
        # x: [T, hidden] (a batch: T = sum T_i, the requests' rows concatenated)
        T = x.shape[0]
        qkv_weight = self.qkv_weight
        merged = qkv_weight is not None and qkv_weight.data_ptr() == self.q_proj.weight.data_ptr()
        if merged and qkv_weight is not None:
            qkv = F.linear(x, qkv_weight, self.qkv_bias).view(T, -1, self.head_dim)
            q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        else:
            q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
            k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
            v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        # norms, RoPE and the KV store in one kernel (q_norm and k_norm: both set or both None, cfg.qk_norm)
        if fused and merged and self.q_norm is not None and self.k_norm is not None:
            q, k = fused_ops.qk_norm_rope_store(
                qkv, num_q_heads=self.num_heads, num_kv_heads=self.num_kv_heads, q_norm_weight=self.q_norm.weight,
                k_norm_weight=self.k_norm.weight, eps=self.q_norm.eps, cos=rope[0], sin=rope[1],
                slots=meta.new_slots, k_pool=pool.k[self.layer_id], v_pool=pool.v[self.layer_id])
        else:
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)  # [T, Hq, D], [T, Hkv, D]
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            pool.store(self.layer_id, meta.new_slots, k, v)
        k_pool, v_pool = pool.k[self.layer_id], pool.v[self.layer_id]
        if isinstance(meta, BatchMetadata):
            out = backend.forward_batch(q, k, v, k_pool, v_pool, meta, scale=self.scale, window=self.window)
        else:
            out = backend.forward(q, k, v, k_pool, v_pool, meta, scale=self.scale, window=self.window)  # [T, Hq, D]
        return self.o_proj(out.reshape(T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_weight: Tensor | None = None  # set by merge()

    def merge(self) -> None:
        """One gate/up GEMM instead of two (weights become views into one tensor)."""
        self.gate_up_weight = _concat_views([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x: Tensor, fused: bool = False) -> Tensor:
        if self.gate_up_weight is not None and self.gate_up_weight.data_ptr() == self.gate_proj.weight.data_ptr():
            gate_up = F.linear(x, self.gate_up_weight)
            if fused:
                return self.down_proj(fused_ops.silu_mul(gate_up))
            gate, up = gate_up.chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _concat_views(params: list[Tensor]) -> Tensor:
    """Concatenate parameters along dim 0 and point each one's data at its slice of the result."""
    buffer = torch.cat([p.detach() for p in params], dim=0)
    offset = 0
    for p in params:
        n = p.shape[0]
        p.data = buffer[offset:offset + n]
        offset += n
    return buffer


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, pool, meta, backend, fused=False):
        """x: the previous layer's MLP output (the embeddings for layer 0, residual None). Returns this
        layer's MLP output and the residual stream before it: the next norm adds them (fused, one kernel)."""
        h, residual = self.input_layernorm.add_forward(x, residual, fused)
        a = self.self_attn(h, rope, pool, meta, backend, fused)
        h, residual = self.post_attention_layernorm.add_forward(a, residual, fused)
        return self.mlp(h, fused), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """`forward` runs the new tokens of one request (or a batch of requests) against their paged KV and returns
    hidden states."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.projections_merged = False  # merge_projections(): at load (build_model), else before the first forward
        # Triton element-wise kernels (kernels/specsweep_kernels/fused_ops.py) for norms, residual adds, q/k-norm + RoPE + KV
        # store and SiLU x up: set by the engine on CUDA unless --disable-fused-ops
        self.fused_ops = False

    @torch.inference_mode()
    def forward(self, tokens: Tensor, meta: AttentionMetadata | BatchMetadata, pool: KVPool,
                backend: AttentionBackend) -> Tensor:
        # tokens: [T] -> final hidden states [T, hidden] (normed); a batch: T = sum T_i
        if not self.projections_merged:  # a model built elsewhere (e.g. h200_e2e's on-device init)
            merge_projections(self)
        x = self.model.embed_tokens(tokens)
        rope = rope_cos_sin(meta.positions, self.config.head_dim, self.config.rope_theta)
        fused = self.fused_ops
        residual = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, rope, pool, meta, backend, fused)
        return self.model.norm.add_forward(x, residual, fused)[0]

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()  # [T, vocab]


def init_dummy_weights(model: CausalLM, seed: int) -> None:
    """Deterministic random weights, scaled so the logits are sharp (std ~4) and attention is peaked
    (q_norm gain 3), which keeps greedy output from falling into short loops. Drawn (in fp32) on the parameters'
    device: the same seed gives other values on CUDA than on the CPU."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    cfg = model.config
    for name, p in sorted(model.named_parameters()):
        if name.endswith("q_norm.weight"):
            init = torch.full(p.shape, 3.0, device=gen.device)
        elif name.endswith("norm.weight"):
            init = torch.ones(p.shape, device=gen.device)
        elif name.endswith(".bias"):
            init = torch.zeros(p.shape, device=gen.device)
        elif "embed_tokens" in name:
            init = torch.randn(p.shape, generator=gen, device=gen.device)
        elif name == "lm_head.weight":
            init = torch.randn(p.shape, generator=gen, device=gen.device) * (4.0 / cfg.hidden_size ** 0.5)
        else:  # [out, in] projections: unit gain, so every layer moves the residual stream
            init = torch.randn(p.shape, generator=gen, device=gen.device) / p.shape[1] ** 0.5
        with torch.no_grad():
            p.copy_(init.to(p.dtype))


def load_safetensors(model: CausalLM, model_dir: str | Path) -> None:
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks {missing[:5]}{'...' if len(missing) > 5 else ''}")
    if unexpected:
        logger.warning("ignoring %d unexpected tensors, e.g. %s", len(unexpected), unexpected[:3])


def build_model(cfg: ModelConfig, model_path: str, load_format: str, seed: int, dtype: torch.dtype,
                device: torch.device | str, *, init_on_device: bool = False) -> CausalLM:
    """init_on_device (dummy weights only): allocate on `device` and draw the weights there (seconds for an
    8B model on a GPU, where a CPU draw takes minutes), instead of drawing on the CPU and moving them."""
    if load_format == "dummy" and init_on_device:
        with torch.device("meta"):  # allocates nothing until to_empty
            model = CausalLM(cfg)
        model = model.to(dtype).to_empty(device=device)
        if cfg.tie_word_embeddings:  # to_empty gives every module its own storage
            model.lm_head.weight = model.model.embed_tokens.weight
        init_dummy_weights(model, seed)
    else:
        model = CausalLM(cfg)
        if load_format == "dummy":
            init_dummy_weights(model, seed)
        else:
            from .gguf_checkpoint import prepare_gguf, resolve_gguf

            gguf_path = resolve_gguf(model_path)
            load_safetensors(model, prepare_gguf(gguf_path) if gguf_path is not None else model_path)
        model = model.to(device=device, dtype=dtype)
    model.eval()
    merge_projections(model)
    return model


def skip_layers_kept(num_layers: int, keep: int) -> list[int]:
    """The layers a `keep`-layer self-draft runs: the first ceil(keep/2) and the last floor(keep/2), the middle
    skipped (Draft & Verify / SWIFT-style layer skipping)."""
    if not 1 <= keep <= num_layers:
        raise ValueError(f"draft layers {keep}: the model has {num_layers} (allowed 1..{num_layers})")
    head = -(-keep // 2)
    return list(range(head)) + list(range(num_layers - (keep - head), num_layers))


def layer_subset(model: CausalLM, layers: list[int]) -> CausalLM:
    """`model` running only `layers` (ascending indices), then its final norm and LM head. Shares every parameter
    with `model` (no memory); each layer keeps its layer_id, so it reads and writes that layer's KV pool rows."""
    cfg = model.config
    sub = dataclasses.replace(cfg, num_hidden_layers=len(layers),
                              layer_types=tuple(cfg.layer_types[i] for i in layers) if cfg.layer_types else ())
    with torch.device("meta"):  # the skeleton allocates nothing; every module is replaced by the model's own
        view = CausalLM(sub)
    view.model.embed_tokens, view.model.norm = model.model.embed_tokens, model.model.norm
    view.model.layers = nn.ModuleList([model.model.layers[i] for i in layers])
    view.lm_head = model.lm_head
    view.projections_merged, view.fused_ops = model.projections_merged, model.fused_ops
    return view.eval()


def merge_projections(model: CausalLM) -> None:
    """Merged QKV and gate/up weights, made once at load (after the dtype/device move, which would copy them
    apart again): fewer, larger GEMMs per layer."""
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, even when called inside a forward
        for module in model.modules():
            if isinstance(module, (Attention, MLP)):
                module.merge()
    model.projections_merged = True
