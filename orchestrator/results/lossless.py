"""Rule (f) of the diagnosis, the lossless check (orchestrator/results/diagnosis.py has the list of rules; docs/
orchestrator.md, "The lossless check (f)"): at temperature 0 a speculative run's output tokens must equal those of
the drafter=none run of the same point (`RunRow.lossless_key`); at the first divergence k the none-run's two best
tokens must be the two tokens, at most `lossless_tie_gap` (float32) or `lossless_tie_gap_16bit` (bfloat16 / float16)
apart in logprob (a numerical tie: either is a correct greedy choice, and the rest is not compared); anything else is
a pipeline bug, whatever the acceptance counters say."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config.settings import Thresholds
from orchestrator.results.findings import Cause, Check, Finding, Rule, RunRow


HALF_DTYPES = ("bfloat16", "float16", "half", "bf16", "fp16")


def tie_gap(row: RunRow, th: Thresholds) -> float:
    """The logprob gap under which the none-run's two best tokens count as a tie, at the run's dtype."""
    return th.lossless_tie_gap_16bit if row.dtype.lower() in HALF_DTYPES else th.lossless_tie_gap


@dataclass(frozen=True)
class _Breach:
    spec: RunRow
    base: RunRow
    k: int
    why: str


def _judge(spec: RunRow, base: RunRow, th: Thresholds) -> tuple[str, _Breach | None]:
    """("equal" | "tie at k (gap g)" | "breach", the breach) for two rows that carry an output."""
    a, b = spec.output, base.output
    if a is None or b is None:
        raise ValueError(f"runs {spec.run_id} / {base.run_id}: judged without their outputs")
    k = a.first_divergence(b)
    if k is None:
        return "equal", None
    n, m = len(a.output_ids), len(b.output_ids)
    if k >= min(n, m):
        return "breach", _Breach(spec, base, k, f"the outputs agree on their first {k} tokens, then one ends: "
                                                f"{n} output tokens with speculation, {m} without")
    got, want = a.output_ids[k], b.output_ids[k]
    tokens = f"token {got} with speculation, {want} without"
    if k >= len(b.top2):
        return "breach", _Breach(spec, base, k, f"{tokens}; the none-run recorded no top-2 logprobs at {k}, so no "
                                                "tie can be shown")
    (lp1, t1), (lp2, t2) = b.top2[k]
    gap, tol = lp1 - lp2, tie_gap(spec, th)
    if {got, want} != {t1, t2}:
        return "breach", _Breach(spec, base, k, f"{tokens}; its top two are {t1} and {t2} (logprobs {lp1:.6g} vs "
                                                f"{lp2:.6g}), so {got} is not a greedy choice there")
    if gap > tol:
        return "breach", _Breach(spec, base, k, f"{tokens}; the none-run's top-2 logprobs at {k}: {lp1:.6g} ({t1}) "
                                                f"vs {lp2:.6g} ({t2}), gap {gap:.3g} > tie tolerance {tol:g}")
    return f"tie at {k} (gap {gap:.3g})", None


def find_lossless_breach(rows: Sequence[RunRow], th: Thresholds) -> tuple[list[Finding], list[Check]]:
    """(f): each speculative run at temperature 0 against the drafter=none run of its point (module docstring). A
    sweep without speculation has nothing to check (no Check, as (e) without plugin runs)."""
    spec = [r for r in rows if r.speculative]
    if not spec:
        return [], []
    hot = [r for r in spec if r.temperature > 0]
    greedy = [r for r in spec if r.temperature <= 0]
    base: dict[str, RunRow] = {}  # the none-run of each point, one with its output first
    for r in sorted((r for r in rows if not r.speculative and r.temperature <= 0 and r.lossless_key),
                    key=lambda r: r.output is None):
        base.setdefault(r.lossless_key, r)
    unpaired = [r for r in greedy if r.lossless_key and r.lossless_key not in base]
    unread = [r for r in greedy if r not in unpaired
              and (not r.lossless_key or r.output is None or base[r.lossless_key].output is None)]
    paired = [r for r in greedy if r not in unpaired and r not in unread]
    ties: list[str] = []
    breaches: list[_Breach] = []
    for r in paired:
        verdict, breach = _judge(r, base[r.lossless_key], th)
        if breach:
            breaches.append(breach)
        elif verdict != "equal":
            ties.append(f"`{r.name}` {verdict}")
    why = []
    if hot:
        why.append(f"{len(hot)} run(s) sample at temperature > 0, where texts legitimately differ: "
                   + ", ".join(f"`{r.name}`" for r in hot))
    if unpaired:
        why.append(f"{len(unpaired)} speculative run(s) have no drafter=none run of the same point (add drafter=none "
                   "to the grid): " + ", ".join(f"`{r.name}`" for r in unpaired))
    if unread:
        why.append(f"{len(unread)} speculative run(s) or their drafter=none run recorded no output_ids.json or "
                   "lossless_key (recorded before the check): " + ", ".join(f"`{r.name}`" for r in unread))
    checks = []
    if paired:
        checks.append(Check(Rule.LOSSLESS, True, f"{len(paired) - len(breaches)} of {len(paired)} speculative run(s) "
                            "at temperature 0 produce the drafter=none run's tokens"
                            + (f" ({len(ties)} part at a tie: {'; '.join(ties)})" if ties else "")))
    if why:
        checks.append(Check(Rule.LOSSLESS, False, "; ".join(why)))
    if not breaches:
        return [], checks
    return [Finding(
        Cause.PIPELINE_BUG,
        f"{len(breaches)} speculative run(s) at temperature 0 changed the text: their output tokens differ from the "
        "same point's run without speculation at a position that is no numerical tie. Greedy speculative decoding "
        "must be lossless, so the pipeline commits wrong tokens (draft/verify positions, KV or seq_lens "
        "bookkeeping, the acceptance walk), whatever its acceptance counters say.",
        tuple(f"`{b.spec.name}` (run {b.spec.run_id[:8]}) vs `{b.base.name}` (run {b.base.run_id[:8]}): first "
              f"divergence at output position {b.k}: {b.why}" for b in breaches),
        tuple(dict.fromkeys(r.run_id for b in breaches for r in (b.spec, b.base))),
    )], checks
