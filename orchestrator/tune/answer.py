"""The answer of a tune: per workload point the winner, its margins, and what SGLang takes.

    answer_markdown(rows) -> str         the table: winner, tok/s (robust), over no speculation, runner-up
    answer_csv(rows) -> str
    adaptive_config(rows) -> (dict | None, why)   SGLang's --speculative-adaptive-config JSON, where it applies
    launch_commands(rows, model_path) -> str       one SGLang launch command per batch-size range
    load_curves(series) -> matplotlib Figure       tok/s vs batch size, a line per configuration

SGLang 0.5.23's adaptive config (sglang/srt/speculative/adaptive_spec_params.py): a JSON object whose integer-string
keys are batch sizes, each `{"candidate_steps": [non-negative ints, ...]}` (`_load_adaptive_config`, :103-139;
steps 0 = no drafting, :217-229); a running batch uses the entry of the largest key <= its size, the smallest key
below that (`_find_closest_bs`, :356-358). It applies only to EAGLE / EAGLE3 with topk 1
(`adaptive_unsupported_reason`, :56-79), where num_draft_tokens is num_steps + 1
(sglang/srt/arg_groups/speculative_hook.py:1425-1429), and --speculative-num-steps must be one of the candidate
steps (:1418-1422). One candidate per key pins the measured winner: the adaptive controller then never moves off it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from orchestrator.tune.robust import Pick
from orchestrator.tune.space import DRAFTER, NUM_DRAFT_TOKENS, NUM_STEPS, TOPK

ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")


@dataclass(frozen=True)
class AnswerRow:
    context_len: int
    batch: int
    pick: Pick
    algorithm: Mapping[str, str]  # candidate key -> its drafter's algorithm (SGLang's name)
    values: Mapping[str, Mapping[str, str]]  # candidate key -> its override values


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _margin_cell(rel: float | None, separable: bool | None) -> str:
    if rel is None:
        return "n/a"
    return _pct(rel) + ("" if separable else " (not separable)")


def answer_markdown(rows: Sequence[AnswerRow]) -> str:
    lines = ["| context | batch | winner | tok/s (median - 1.4826 MAD) | over no speculation | runner-up | "
             "over runner-up | repeats |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.pick
        base = (_margin_cell(p.over_baseline.rel, p.over_baseline.separable) if p.over_baseline else
                "is no speculation" if p.baseline is p.winner else "n/a (no baseline measured)")
        runner = (p.ranked[1].label or "no speculation") if len(p.ranked) > 1 else "-"
        over = _margin_cell(p.runner_up.rel, p.runner_up.separable) if p.runner_up else "n/a"
        if len(p.tied) > 1:
            over += f"; {len(p.tied)} within the tie band: fewest draft tokens chosen"
        lines.append(f"| {r.context_len} | {r.batch} | {p.winner.label or 'no speculation'} | {p.winner.score:.4g} | "
                     f"{base} | {runner} | {over} | {len(p.winner.values)} |")
    return "\n".join(lines) + "\n"


def answer_csv(rows: Sequence[AnswerRow]) -> str:
    out = ["context_len,batch,winner,score_tok_s,median_tok_s,over_baseline,baseline_separable,runner_up,"
           "over_runner_up,runner_up_separable"]
    for r in rows:
        p = r.pick
        ob, ru = p.over_baseline, p.runner_up
        out.append(",".join(str(x) for x in (
            r.context_len, r.batch, shlex.quote(p.winner.key), f"{p.winner.score:.6g}", f"{p.winner.median:.6g}",
            f"{ob.rel:.6g}" if ob else "", ob.separable if ob else "",
            shlex.quote(p.ranked[1].key) if len(p.ranked) > 1 else "", f"{ru.rel:.6g}" if ru else "",
            ru.separable if ru else "")))
    return "\n".join(out) + "\n"


def _steps(row: AnswerRow) -> int:
    w = row.pick.winner
    return int(row.values[w.key].get(NUM_STEPS, 0)) if w.draft_tokens else 0


def adaptive_config(rows: Sequence[AnswerRow]) -> tuple[dict[str, dict] | None, str]:
    """The per-batch-size schedule as SGLang's --speculative-adaptive-config JSON, or None and why not. One context
    (the first) decides: SGLang's schedule has no context axis."""
    first_ctx = rows[0].context_len if rows else None
    mine = [r for r in rows if r.context_len == first_ctx]
    spec = [r for r in mine if r.pick.winner.draft_tokens]
    algos = {r.algorithm[r.pick.winner.key] for r in spec}
    if not spec:
        return None, "no speculative configuration wins at any batch size: run without speculation"
    if not algos <= set(ADAPTIVE_ALGORITHMS) or len(algos) > 1:
        return None, (f"the winners' algorithm {sorted(algos)} is not one of {ADAPTIVE_ALGORITHMS} (SGLang 0.5.23 "
                      "adapts EAGLE/EAGLE3 only): use the launch flags per batch-size range")
    topks = {int(r.values[r.pick.winner.key].get(TOPK, 1)) for r in spec}
    if topks != {1}:
        return None, f"winners with topk {sorted(topks)}: SGLang's adaptive schedule takes topk 1 only"
    drafters = {r.values[r.pick.winner.key].get(DRAFTER) for r in spec}
    if len(drafters) > 1:
        return None, f"winners with different drafters {sorted(map(str, drafters))}: one server has one draft model"
    return {str(r.batch): {"candidate_steps": [_steps(r)]} for r in mine}, "EAGLE-family winners with topk 1"


def launch_commands(rows: Sequence[AnswerRow], model_path: str) -> str:
    """One `python -m sglang.launch_server` per batch-size range of the first context, with the winner's flags."""
    first_ctx = rows[0].context_len if rows else None
    mine = sorted((r for r in rows if r.context_len == first_ctx), key=lambda r: r.batch)
    lines = ["# the measured winner per batch-size range (the tune's answer table); serve the range you expect"]
    for i, r in enumerate(mine):
        hi = mine[i + 1].batch - 1 if i + 1 < len(mine) else None
        rng = f"batch {r.batch}" + (f"-{hi}" if hi and hi > r.batch else "+" if hi is None else "")
        v = r.values[r.pick.winner.key]
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model_path]
        algo = r.algorithm[r.pick.winner.key]
        if r.pick.winner.draft_tokens:
            argv += ["--speculative-algorithm", algo]
            for key, flag in ((NUM_STEPS, "--speculative-num-steps"), (TOPK, "--speculative-eagle-topk"),
                              (NUM_DRAFT_TOKENS, "--speculative-num-draft-tokens")):
                if key in v:
                    argv += [flag, v[key]]
        if "page_size" in v:
            argv += ["--page-size", v["page_size"]]
        lines.append(f"# {rng}: {r.pick.winner.label or 'no speculation'}")
        lines.append(shlex.join(argv))
    return "\n".join(lines) + "\n"


def load_curves(series: Mapping[str, Mapping[int, float]], context_len: int):
    """tok/s against batch size, a line per configuration (its search measurement at each batch size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label or "no speculation")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (probe.concurrency)")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"load curves at context {context_len}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
