"""Two sweeps (or two parent runs) side by side: per matching point the deltas, and one plot.

    specsweep-report --compare A B [--out DIR]      A, B: sweep names (their latest parent run) or parent run ids

A point is (context_len, probe, drafter, attention, page_size, concurrency); points only one side has are listed
as such. Written to DIR (default `specsweep-compare/`): compare.md, compare.csv, compare.png (commit length and
decode tok/s of B against A, a panel each, the diagonal = no change); the table is printed too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.results.console import print_table
from orchestrator.results.diagnosis import RunRow
from orchestrator.results.metric_catalogue import HEADLINE_METRICS
from orchestrator.results.report.read_back import load_children, resolve_parent, sweep_run_hashes
from orchestrator.results.report.tables import md_table, render_csv

COMPARED = HEADLINE_METRICS  # commit_len_mean, decode_tok_s, verify_step_ms
COLUMNS = ("context_len", "probe", "drafter", "attention", "page_size", "concurrency") + tuple(
    f"{m} {side}" for m in COMPARED for side in ("A", "B", "delta %"))
PointKey = tuple[int, str, str, str, int, int]


def point_key(r: RunRow) -> PointKey:
    return (r.context_len, r.probe, r.drafter, r.attention, r.page_size, r.concurrency)


@dataclass(frozen=True)
class Comparison:
    a: str  # "sweep (parent run id[:8])"
    b: str
    matched: tuple[tuple[PointKey, RunRow, RunRow], ...]
    only_a: tuple[PointKey, ...]
    only_b: tuple[PointKey, ...]

    def rows(self) -> list[list[str]]:
        out = []
        for key, ra, rb in self.matched:
            cells = [str(k) for k in key]
            for m in COMPARED:
                va, vb = ra.metric(m), rb.metric(m)
                delta = f"{(vb - va) / va:+.1%}" if va and vb is not None else ""
                cells += ["" if va is None else f"{va:.4g}", "" if vb is None else f"{vb:.4g}", delta]
            out.append(cells)
        return out


def _finished(client, target: str) -> tuple[str, dict[PointKey, RunRow]]:
    parent_id, sweep = resolve_parent(client, target)
    children = load_children(client, parent_id, sweep_run_hashes(client, parent_id))
    return f"{sweep} ({parent_id[:8]})", {point_key(c.row): c.row for c in children
                                         if c.status == "FINISHED" and c.job != "kernel"}


def compare(client, a: str, b: str) -> Comparison:
    name_a, pa = _finished(client, a)
    name_b, pb = _finished(client, b)
    return Comparison(name_a, name_b, tuple((k, pa[k], pb[k]) for k in sorted(pa.keys() & pb.keys())),
                      tuple(sorted(pa.keys() - pb.keys())), tuple(sorted(pb.keys() - pa.keys())))


def render_md(c: Comparison) -> str:
    text = (f"# Compare: A = {c.a}, B = {c.b}\n\n{len(c.matched)} matching point(s); delta % = (B - A) / A.\n\n"
            + md_table(COLUMNS, c.rows()))
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            text += f"\nOnly in {side}: " + "; ".join(" ".join(map(str, k)) for k in keys) + "\n"
    return text


def plot(path: Path, c: Comparison) -> bool:
    """B against A, a panel per compared metric with values; a marker per point, the diagonal = no change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in COMPARED[:2] if any(ra.metric(m) is not None and rb.metric(m) is not None
                                              for _, ra, rb in c.matched)]
    if not metrics:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        pts = [(k, ra.need(m), rb.need(m)) for k, ra, rb in c.matched
               if ra.metric(m) is not None and rb.metric(m) is not None]
        for k, va, vb in pts:
            ax.scatter(va, vb, label=f"{k[2]} {k[1]} @ {k[0]}", s=30)
        lo, hi = min(min(va, vb) for _, va, vb in pts), max(max(va, vb) for _, va, vb in pts)
        ax.plot([lo, hi], [lo, hi], color="0.4", linestyle="--", linewidth=1, label="no change")
        ax.set_xlabel(f"A: {c.a}")
        ax.set_ylabel(f"B: {c.b}")
        ax.set_title(m)
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_compare(client, a: str, b: str, out: Path) -> tuple[Comparison, list[Path]]:
    c = compare(client, a, b)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "compare.md", out / "compare.csv"]
    files[0].write_text(render_md(c))
    files[1].write_text(render_csv(c.rows(), COLUMNS))
    if plot(out / "compare.png", c):
        files.append(out / "compare.png")
    return c, files


def print_compare(c: Comparison) -> None:
    from rich.console import Console

    console = Console()
    print_table(COLUMNS, c.rows(), title=f"A = {c.a}, B = {c.b}: {len(c.matched)} matching point(s)", console=console)
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            console.print(f"only in {side}: " + "; ".join(" ".join(map(str, k)) for k in keys))


