"""The report's plots (PNG): a facet per probe text, a series per value of every other swept axis, every point
drawn (markers, and a small offset along x per series so none hides another), reference lines where they exist.

    commit_len_vs_context.png     commit length; the oracle's maximum (num_steps + 1) and no speculation (1) as lines
    decode_tok_s_vs_context.png   decode tokens / s; the no-speculation drafter (`none`), where present, dashed black
    verify_step_ms_vs_context.png, kv_bw_gbs_vs_context.png (device roofline as a line), throughput_vs_concurrency.png
    accept_length_histogram.png
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.results.diagnosis import RunRow
from orchestrator.results.report.read_back import ChildRun
from orchestrator.results.report.tables import swept

MARKERS = "osD^vP*Xph<>"
NO_SPEC = "none"  # the drafter that does not speculate (conf/drafter/none.yaml)


@dataclass(frozen=True)
class HLine:
    y: float
    label: str
    style: str = "--"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series_label(r: RunRow, axes: Sequence[str]) -> str:
    return " ".join(f"{a}={getattr(r, a)}" for a in axes) or r.drafter


def facet_plot(path: Path, rows: Sequence[RunRow], metric: str, title: str, ylabel: str,
               hlines: Sequence[HLine] = (), *, x_axis: str = "context_len", facet_axis: str = "probe",
               xlabel: str = "context length (tokens)") -> bool:
    """One subplot per `facet_axis` value, one series per combination of the other swept axes; every run is a
    marker (no median), the line joins a series' mean per x. False (no file) without values."""
    have = [r for r in rows if r.metric(metric) is not None]
    if not have:
        return False
    axes = [a for a in ("drafter", "attention", "page_size", "concurrency", "context_len", "probe")
            if a not in (x_axis, facet_axis) and (a == "drafter" or swept(have, a))]
    facets = sorted({getattr(r, facet_axis) for r in have})
    labels = sorted({series_label(r, axes) for r in have})
    plt = _pyplot()
    fig, subplots = plt.subplots(1, len(facets), figsize=(5.2 * len(facets) + 1.8, 4.4), sharey=True, squeeze=False)
    for ax, facet in zip(subplots[0], facets):
        for i, label in enumerate(labels):
            pts: dict[float, list[float]] = defaultdict(list)
            for r in have:
                if getattr(r, facet_axis) == facet and series_label(r, axes) == label:
                    pts[getattr(r, x_axis)].append(r.need(metric))
            if not pts:
                continue
            # a multiplicative offset on the log2 axis: series side by side at each x, never on top of each other
            shift = 2 ** (0.06 * (i - (len(labels) - 1) / 2))
            xs = sorted(pts)
            base = NO_SPEC in label.split() or label == NO_SPEC or f"drafter={NO_SPEC}" in label
            kw = dict(color="k", linestyle="--") if base else {}
            line, = ax.plot([x * shift for x in xs], [sum(pts[x]) / len(pts[x]) for x in xs],
                            marker=MARKERS[i % len(MARKERS)], label=label + (" (no speculation)" if base else ""),
                            **kw)
            for x in xs:
                ax.scatter([x * shift] * len(pts[x]), pts[x], color=line.get_color(), s=14, zorder=3)
        for h in hlines:
            ax.axhline(h.y, color="0.3", linestyle=h.style, linewidth=1, label=h.label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_title(f"{facet_axis}={facet}")
        ax.grid(True, alpha=0.3)
    subplots[0][0].set_ylabel(ylabel)
    handles, names = subplots[0][0].get_legend_handles_labels()
    for ax in subplots[0][1:]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="center right", fontsize=8, title=" x ".join(axes) or None)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1 - 1.8 / (5.2 * len(facets) + 1.8), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _histogram_plot(path: Path, client, children: Sequence[ChildRun]) -> bool:
    per_drafter: dict[str, list[float]] = defaultdict(list)
    for c in children:
        if c.status == "FINISHED":
            per_drafter[f"{c.row.drafter} / {c.row.probe}"] += [m.value for m in
                                                               client.get_metric_history(c.row.run_id, "commit_len")]
    if not any(per_drafter.values()):
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    top = int(max(max(v) for v in per_drafter.values() if v))
    bins = [x + 0.5 for x in range(0, top + 1)]
    for label, values in sorted(per_drafter.items()):
        if values:
            ax.hist(values, bins=bins, alpha=0.5, label=label)
    ax.set_xlabel("tokens committed per verify step (accept length)")
    ax.set_ylabel("verify steps")
    ax.set_title("accept-length histogram")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def commit_lines(rows: Sequence[RunRow]) -> list[HLine]:
    steps = max((r.num_steps for r in rows), default=0)
    out = [HLine(steps + 1, f"oracle maximum (num_steps + 1 = {steps + 1})")] if steps else []
    return out + [HLine(1.0, "no speculation (1 token / step)", ":")]


def build_plots(out: Path, client, children: Sequence[ChildRun]) -> list[Path]:
    rows = [c.row for c in children if c.status == "FINISHED"]
    peak = max((r.metric("peak_bw_gbs") or 0.0 for r in rows), default=0.0)
    specs: list[tuple[str, str, str, str, Sequence[HLine]]] = [
        ("commit_len_vs_context.png", "commit_len_mean", "commit length vs context",
         "commit_len_mean (tokens / verify step)", commit_lines(rows)),
        ("decode_tok_s_vs_context.png", "decode_tok_s", "decode throughput vs context", "decode tokens / s", ()),
        ("verify_step_ms_vs_context.png", "verify_step_ms", "verify-step time vs context",
         "verify_step_ms (per request step; N>1: batched forward / N)", ()),
        ("kv_bw_gbs_vs_context.png", "kv_bw_gbs", "effective KV bandwidth vs context", "GB/s",
         [HLine(peak, "device roofline")] if peak else ()),
    ]
    made = []
    for name, metric, title, ylabel, hlines in specs:
        if facet_plot(out / name, rows, metric, title, ylabel, hlines):
            made.append(out / name)
    if swept(rows, "concurrency") and facet_plot(out / "throughput_vs_concurrency.png", rows, "throughput_tok_s",
                                                 "throughput vs concurrency", "tokens / s, all requests",
                                                 x_axis="concurrency",
                                                 xlabel="requests in flight (probe.concurrency)"):
        made.append(out / "throughput_vs_concurrency.png")
    if _histogram_plot(out / "accept_length_histogram.png", client, children):
        made.append(out / "accept_length_histogram.png")
    return made
