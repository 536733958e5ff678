"""The report's tables: the full summary (CSV, Markdown, HTML), the pivot (drafter x probe x context) and the kernel
runs' table."""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from orchestrator.results.diagnosis import RunRow
from orchestrator.results.metric_catalogue import KERNEL_METRICS, SUMMARY_METRICS
from orchestrator.results.report.read_back import ChildRun

TABLE_METRICS = SUMMARY_METRICS
TABLE_COLUMNS = ("run", "status", "invocation", "context_len", "probe", "drafter", "attention",
                 "page_size", "concurrency") + TABLE_METRICS
# Kernel jobs (job=kernel, workers/kernel_job.py): no engine metrics, their own table and no engine diagnosis.
KERNEL_COLUMNS = ("run", "status", "invocation") + KERNEL_METRICS
# The axes besides drafter, probe and context that can tell two points apart (the pivot's rows name them when swept).
OTHER_AXES = ("attention", "page_size", "concurrency")


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def metric_cell(r: RunRow, key: str, ci: bool = True) -> str:
    """A metric's cell: its value; with `ci` and probe.repeats > 1 (workers/repeats.py), `mean ± half-width` of its
    95 % interval over the repeats (the value alone when every repeat measured the same)."""
    v, lo, hi = r.metric(key), r.metric(f"{key}.ci95_lo"), r.metric(f"{key}.ci95_hi")
    if not ci or v is None or lo is None or hi is None or hi == lo or (r.metric(f"{key}.n") or 0) < 2:
        return fmt(v)
    return f"{v:.4g} ± {(hi - lo) / 2:.2g}"


def table_rows(children: Sequence[ChildRun], ci: bool = True) -> list[list[str]]:
    """One row per run; `ci`: metrics measured over probe.repeats show their 95 % interval (False: numbers only,
    for the CSV, whose `<metric>.ci95_lo/hi` stay in MLflow)."""
    out = []
    for c in children:
        r = c.row
        status = c.status if not c.reason else f"{c.status} ({c.reason})"
        out.append([r.name, status, c.invocation, str(r.context_len), r.probe, r.drafter, r.attention,
                    str(r.page_size), str(r.concurrency)]
                   + [metric_cell(r, k, ci) for k in TABLE_METRICS])
    return out


def render_csv(rows: list[list[str]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns)
    w.writerows(rows)
    return buf.getvalue()


def md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_md_table(rows: list[list[str]]) -> str:
    return md_table(TABLE_COLUMNS, rows)


def swept(rows: Sequence[RunRow], axis: str) -> bool:
    return len({getattr(r, axis) for r in rows}) > 1


def pivot(rows: Sequence[RunRow]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of the pivot: a row per drafter (and per value of any other swept axis), a column per
    probe x context; each cell `commit / tok/s` (commit_len_mean, decode_tok_s). Two runs in one cell (an earlier
    invocation's and this one's) show both, never a silent aggregate."""
    others = [a for a in OTHER_AXES if swept(rows, a)]
    cols = sorted({(r.probe, r.context_len) for r in rows})
    cells: dict[tuple, dict[tuple[str, int], list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (r.drafter, *(getattr(r, a) for a in others))
        commit, tok_s = r.metric("commit_len_mean"), r.metric("decode_tok_s")
        cells[key][(r.probe, r.context_len)].append(
            f"{'-' if commit is None else f'{commit:.2f}'} / {'-' if tok_s is None else f'{tok_s:.3g}'}")
    header = ["drafter", *others] + [f"{probe} @ {ctx}" for probe, ctx in cols]
    body = [[str(k) for k in key] + [", ".join(cells[key].get(c, [])) for c in cols] for key in sorted(cells)]
    return header, body


def render_pivot_md(rows: Sequence[RunRow]) -> str:
    if not rows:
        return ""
    header, body = pivot(rows)
    return ("## At a glance\n\nEach cell: commit length (tokens per verify step) / decode tokens per second, "
            "per drafter x probe @ context.\n\n" + md_table(header, body))


def render_html(sections_md: str, rows: list[list[str]], sweep: str, diagnosis_md: str,
                images: Sequence[Path] = ()) -> str:
    """One self-contained page (MLflow's artifact view shows it as it is): the sections, the plots inlined as
    data URIs, every run, the diagnosis."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in TABLE_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    plots = "".join(f"<img alt='{html.escape(p.stem)}' style='max-width:100%' src='data:image/png;base64,"
                    f"{base64.b64encode(p.read_bytes()).decode()}'>" for p in images)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(sweep)}</title>"
            "<style>body{font:14px sans-serif}table{border-collapse:collapse;font:13px sans-serif}"
            "td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>"
            f"{_md_tables_html(sections_md)}{'<h2>Plots</h2>' + plots if plots else ''}<h2>Every run</h2>"
            f"<table><tr>{head}</tr>{body}</table>"
            f"<pre>{html.escape(diagnosis_md)}</pre></body></html>")


def _md_tables_html(md: str) -> str:
    """The sections' Markdown as HTML: `# ` / `## ` headings, tables and paragraphs (all the report's sections use)."""
    out, table = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-"):
                table.append("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split(
                    " | ")) + "</tr>")
            continue
        if table:
            out.append("<table>" + "".join(table) + "</table>")
            table = []
        if line.startswith("# "):
            out.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            out.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    return "".join(out)


def kernel_rows(children: Sequence[ChildRun]) -> list[list[str]]:
    out = []
    for c in sorted((c for c in children if c.job == "kernel"), key=lambda c: c.row.name):
        status = c.status if not c.reason else f"{c.status} ({c.reason})"
        out.append([c.row.name, status, c.invocation] + [fmt(c.row.metric(k)) for k in KERNEL_METRICS])
    return out


def render_kernel_md(rows: list[list[str]]) -> str:
    return ("## Kernel runs\n\n" f"{len(rows)} shape(s): time_us (median), gbs (unique prefix KV bytes / time), "
            "floor_frac (floor / time, GPU only), rel_err (vs the fp32 reference).\n\n" + md_table(KERNEL_COLUMNS, rows))
