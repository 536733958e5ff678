"""Runs on random weights are plumbing: no diagnosis rule judges the drafter or the pipeline from them.

A model with dummy weights has near-flat or arbitrary logits: SGLang's dummy init is uniform in [-1e-3, 1e-3]
(`initialize_dummy_weights`, sglang/srt/model_loader/weight_utils.py:1740-1777; the draft model loads with the
target's --load-format unless --speculative-draft-load-format is given, sglang/srt/model_executor/model_runner.py:
1538-1549), and the reference engine's built-in `tiny` and `tiny-draft` have only seeded random weights
(workers/reference/model.py `init_dummy_weights`; `load_format=auto` has no checkpoint for them). Greedy choices then
flip on near-ties (the oracle misses in bf16) and commit lengths say nothing about how well a drafter predicts text:
a bare `+sweep=longctx` on tiny showed 1.52 vs 1.11, in the other order at 16k. So rules (a) and (b) leave such runs
out, as every rule leaves out the stub engine's; (c) and (d) judge step time, which random weights do not change.

    dummy_weights_reason(params) -> str    why a run's weights are random, from its MLflow params ("" = real)
    scoped(check_detail, evaluated, judged, dummy_reasons) -> str
        a rule (a)/(b) check's detail once the dummy-weight runs are left out
    dummy_note(dummy_reasons) -> str       the report's paragraph on what it did not judge and why
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from specsweep_common.builtin_models import BUILTIN_MODELS

RANDOM_WEIGHT_MODELS = tuple(BUILTIN_MODELS)  # the reference engine's built-in models: no checkpoint exists
JUDGED_RULES = "rules (a) and (b), which judge the pipeline and the drafter,"


def dummy_weights_reason(params: Mapping[str, str]) -> str:
    """"" for a run whose target and draft weights are real (or unknown: older runs without these params)."""
    if params.get("model.load_format") == "dummy":
        return "model.load_format=dummy"
    if params.get("model.path") in RANDOM_WEIGHT_MODELS:
        return f"model.path={params['model.path']} (random built-in weights)"
    if params.get("drafter.draft_model_path") in RANDOM_WEIGHT_MODELS:
        return f"drafter.draft_model_path={params['drafter.draft_model_path']} (random built-in weights)"
    return ""


def _why(reasons: Sequence[str]) -> str:
    counts = ", ".join(f"{n} with {r}" for r, n in sorted(Counter(reasons).items()))
    return (f"{len(reasons)} run(s) ran on dummy weights ({counts}): random logits say nothing about the drafter or "
            "the pipeline, so they are plumbing, like the stub engine's")


def scoped(detail: str, evaluated: bool, judged: int, dummy_reasons: Sequence[str]) -> str:
    """`detail` of a rule that examined only the `judged` real-weight runs, with the dummy-weight ones left out."""
    why = _why(dummy_reasons)
    if evaluated:
        return f"{detail}; {why} and were left out"
    return why if judged == 0 else f"{detail}; {why}"


def dummy_note(dummy_reasons: Sequence[str]) -> str:
    return (f"{_why(dummy_reasons)}: {JUDGED_RULES} do not examine them; (c) and (d), which judge step time, do "
            "(orchestrator/config/weights_scope.py).")
