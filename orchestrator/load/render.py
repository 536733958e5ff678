"""The load curves as a report: a table per configuration and three figures (matplotlib, PNG).

    table_markdown(label, levels, limits) -> str     one row per level
    load_curve_figure(label, levels)                 output tok/s, and TTFT / TPOT / ITL / E2E p50 and p99 vs load
    pareto_figure({label: levels})                   output tok/s per GPU against tok/s per user, front marked
    accept_figure({label: levels})                   per-request accept length per level (box plot)
"""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

from orchestrator.load.curve import Level, pareto_front, quantile
from orchestrator.load.settings import Limits


def _f(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _level_name(lv: Level) -> str:
    lvl = lv.level
    if lvl.concurrency is not None and math.isinf(lvl.request_rate):
        return f"concurrency {lvl.concurrency}"
    return f"{lvl.request_rate:g} req/s" + (f", concurrency <= {lvl.concurrency}" if lvl.concurrency else "")


def _accept(lv: Level) -> str:
    a = lv.accept_lens
    if not a:
        return "-"
    return f"{statistics.fmean(a):.3g} ({quantile(a, 0.1):.3g} / {quantile(a, 0.5):.3g} / {quantile(a, 0.9):.3g})"


def table_markdown(label: str, levels: Sequence[Level], lim: Limits) -> str:
    """One row per level: load, throughput, the four latencies' median / p99, goodput, accept length."""
    unit = "GPU" if any(lv.gpus for lv in levels) else "server"
    head = ["level", "completed", "mean concurrency", "output tok/s", f"tok/s per {unit}", "tok/s per user",
            "req/s", "TTFT ms p50 / p99", "TPOT ms p50 / p99", "ITL ms p50 / p99", "E2E ms p50 / p99"]
    if lim.source != "none":
        head += ["goodput req/s", "within p99 limits"]
    head += ["accept length mean (p10 / p50 / p90)", "server accept length"]
    lines = [f"**{label or 'no speculation'}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lv in levels:
        lat = lv.latency_ms
        row = [_level_name(lv), f"{lv.completed}/{lv.requests}", _f(lv.measured_concurrency, ".3g"),
               _f(lv.output_tok_s), _f(lv.tok_s_per_gpu), _f(lv.tok_s_per_user), _f(lv.request_per_s)]
        row += [f"{_f(lat.get(f'median_{n}_ms'))} / {_f(lat.get(f'p99_{n}_ms'))}"
                for n in ("ttft", "tpot", "itl", "e2e_latency")]
        if lim.source != "none":
            row += [_f(lv.goodput_req_s), "-" if lv.within_limits is None else "yes" if lv.within_limits else "no"]
        row += [_accept(lv), _f(lv.server_accept_length, ".3g")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_curve_figure(label: str, levels: Sequence[Level]):
    """Left: output tok/s against the load; right: TTFT, TPOT, ITL and E2E medians (solid) and p99 (dashed)."""
    plt = _plt()
    lv = sorted(levels, key=lambda v: v.x)
    xs = [v.x for v in lv]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.plot(xs, [v.output_tok_s for v in lv], marker="o")
    ax1.set_ylabel("output tok/s")
    for name, color in (("ttft", "C0"), ("tpot", "C1"), ("itl", "C2"), ("e2e_latency", "C3")):
        for stat, style in (("median", "-"), ("p99", "--")):
            ys = [v.latency_ms.get(f"{stat}_{name}_ms", math.nan) for v in lv]
            ax2.plot(xs, ys, style, marker="o", color=color, label=f"{name.replace('_latency', '')} {stat}")
    ax2.set_yscale("log")
    ax2.set_ylabel("ms")
    ax2.legend(fontsize=7, ncol=2)
    kind = "concurrency" if all(v.level.concurrency is not None for v in lv) else "mean concurrency reached"
    for ax in (ax1, ax2):
        ax.set_xlabel(kind)
        ax.grid(True, alpha=0.3)
        if len(xs) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
    fig.suptitle(f"load curve: {label or 'no speculation'} (SGLang bench_serving)")
    fig.tight_layout()
    return fig


def pareto_figure(curves: Mapping[str, Sequence[Level]]):
    """Every level of every configuration as a point (tok/s per user, tok/s per GPU), each configuration's levels
    joined in load order; the front over all configurations drawn as the staircase bounding the region its levels
    dominate."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    every: list[Level] = []
    for i, (label, levels) in enumerate(curves.items()):
        lv = sorted(levels, key=lambda v: v.x)
        every += lv
        ax.plot([v.tok_s_per_user for v in lv], [v.tok_s_per_gpu for v in lv], marker="o", color=f"C{i}",
                label=label or "no speculation")
        for v in lv:
            ax.annotate(v.level.label, (v.tok_s_per_user, v.tok_s_per_gpu), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    front = pareto_front(every)
    if front:
        ax.step([v.tok_s_per_user for v in front], [v.tok_s_per_gpu for v in front], where="pre", color="k",
                alpha=0.5, linestyle=":", label="Pareto front")
    per = "GPU" if any(v.gpus for v in every) else "server (no GPU)"
    ax.set_xlabel("tok/s per user (1000 / median TPOT ms)")
    ax.set_ylabel(f"output tok/s per {per}")
    ax.set_title("throughput against interactivity (SGLang bench_serving)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def accept_figure(curves: Mapping[str, Sequence[Level]]):
    """The per-request accept length at each level of each speculating configuration (box plot); None if no
    configuration has per-request accept lengths."""
    data = [(f"{label or 'none'}\n{v.level.label}", list(v.accept_lens)) for label, levels in curves.items()
            for v in sorted(levels, key=lambda v: v.x) if v.accept_lens]
    if not data:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(data) + 2), 4.5))
    ax.boxplot([d for _, d in data], showmeans=True)
    ax.set_xticks(range(1, len(data) + 1), [n for n, _ in data], fontsize=7)
    ax.set_ylabel("tokens per verify step (per request)")
    ax.set_title("per-request accept length (the engine's spec_verify_ct / completion_tokens)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
