"""Validation of typed run configs, before any Ray, MLflow or engine work.

Every rule returns `Problem(key, value, allowed)`; a sweep collects the problems of all its points and raises one
`ConfigError` listing each. What is checked where:

- each leaf's range, choices and length: its declared domain (`orchestrator/config/domains.py`, at conversion);
- what holds on every engine (the model's shape, the drafter's own consistency, the driver's settings): here;
- what one engine refuses or needs: that engine's own rules, `workers/<engine>/rules.py`, reached through its
  adapter (`workers.registry.adapter_for(kind).plan_problems`, `.context_problem`, `.draft_path_allowed`). This
  module names no engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.config.context import check_context
from orchestrator.config.log_pattern_rules import log_pattern_problems
from specsweep_common.problem import Problem
from specsweep_common.spec import EAGLE_FAMILY, NEEDS_DRAFT_PATH, Algorithm, AttentionKind, JobKind, ProbeKind
from workers.registry import adapter_for

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig


def validate_run(rc: RunConfig, *, check_max_context: bool = True) -> list[Problem]:
    """Every problem of one grid point. In a sweep, `check_max_context=False`: over-max points are
    dropped at planning, not errors."""
    out: list[Problem] = []

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    out += log_pattern_problems(rc)
    if rc.job is JobKind.KERNEL:  # no engine, model, drafter or probe: the shape and where it runs
        return out + kernel_problems(rc) + _driver_problems(rc)
    if rc.tp_size % rc.nnodes:
        bad("tp_size", rc.tp_size, f"a multiple of nnodes={rc.nnodes} (each node runs tp_size / nnodes ranks)")
    if check_max_context and (p := check_context(rc)):
        out.append(p)
    out += _model_problems(rc)
    out += _drafter_problems(rc)
    out += adapter_for(rc.engine.kind).plan_problems(rc)
    if rc.probe.kind is ProbeKind.PREDICTABLE and not rc.probe.sentence:
        bad("probe.sentence", rc.probe.sentence, "a non-empty sentence")
    return out + _driver_problems(rc)


def _driver_problems(rc: RunConfig) -> list[Problem]:
    out: list[Problem] = []

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    if rc.cluster.address is None and rc.cluster.kind.value == "ray":
        bad("cluster.address", None, "a Ray address (e.g. auto or ray://head:10001) when cluster.kind=ray")
    if not rc.tracking.uri:
        bad("tracking.uri", rc.tracking.uri, "an MLflow tracking URI")
    return out


# Kernel jobs on CPU run through the Triton interpreter (numpy): no bfloat16 there.
KERNEL_CPU_DTYPES = ("float32", "float16")


def kernel_problems(rc: RunConfig) -> list[Problem]:
    """job=kernel: a sane shape, and a dtype the device can run."""
    k = rc.kernel
    out: list[Problem] = []
    if k is None:  # the layout or dtype was already refused at conversion
        return out

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(key, value, allowed, rc.overrides))

    if k.mla and k.num_kv_heads != 1:
        bad("kernel.num_kv_heads", k.num_kv_heads, "1 with an MLA layout (one latent head)")
    elif k.num_q_heads % k.num_kv_heads:
        bad("kernel.num_kv_heads", k.num_kv_heads, f"a divisor of kernel.num_q_heads ({k.num_q_heads})")
    if k.mla and k.v_head_dim > k.head_dim:
        bad("kernel.v_head_dim", k.v_head_dim, f"<= kernel.head_dim ({k.head_dim}) with MLA (V is a prefix of K)")
    if rc.engine.device == "cpu" and k.dtype not in KERNEL_CPU_DTYPES:
        bad("kernel.dtype", k.dtype, "one of " + ", ".join(KERNEL_CPU_DTYPES)
            + " with engine.device=cpu (the Triton interpreter); bfloat16 needs engine.device=cuda")
    return out


def _model_problems(rc: RunConfig) -> list[Problem]:
    m, out = rc.model, []
    if m.attention_kind is AttentionKind.MLA and m.num_kv_heads != 1:
        out.append(Problem("model.num_kv_heads", m.num_kv_heads, "1 for MLA (one latent head)", rc.overrides))
    elif m.num_q_heads % m.num_kv_heads:
        out.append(Problem("model.num_kv_heads", m.num_kv_heads,
                           f"a divisor of model.num_q_heads ({m.num_q_heads})", rc.overrides))
    return out


def _drafter_problems(rc: RunConfig) -> list[Problem]:
    d, out = rc.drafter, []

    def bad(key: str, value: Any, allowed: str) -> None:
        out.append(Problem(f"drafter.{key}", value, allowed, rc.overrides))

    if d.algorithm is Algorithm.NONE:
        return out
    if d.algorithm in NEEDS_DRAFT_PATH and not d.draft_model_path:
        bad("draft_model_path", d.draft_model_path, adapter_for(rc.engine.kind).draft_path_allowed(rc))
    for key in ("num_steps", "topk", "num_draft_tokens"):
        if getattr(d, key) < 1:
            bad(key, getattr(d, key), f"an integer >= 1 with algorithm {d.algorithm.value}")
    if d.algorithm in EAGLE_FAMILY and d.topk == 1 and d.num_steps >= 1 \
            and d.num_draft_tokens != d.num_steps + 1:
        bad("num_draft_tokens", d.num_draft_tokens,
            f"num_steps + 1 = {d.num_steps + 1} when topk = 1 (the engine forces it)")
    if d.is_oracle and d.draft_model_path != rc.model.path:
        bad("draft_model_path", d.draft_model_path, f"the target's own path {rc.model.path!r} for the oracle")
    if d.is_oracle and d.algorithm is not Algorithm.STANDALONE:
        bad("algorithm", d.algorithm.value, "STANDALONE for the oracle")
    if d.draft_num_layers is not None:
        if d.algorithm is not Algorithm.STANDALONE:
            bad("draft_num_layers", d.draft_num_layers, f"null with algorithm {d.algorithm.value} (STANDALONE only)")
        elif d.is_oracle:
            bad("draft_num_layers", d.draft_num_layers, "null for the oracle (it drafts with every layer)")
        elif d.draft_model_path == rc.model.path and d.draft_num_layers > rc.model.num_layers:
            bad("draft_num_layers", d.draft_num_layers,
                f"1..{rc.model.num_layers} (the layers of model {rc.model.name}), or null")
    return out
