"""Sweep report: summary table (CSV, Markdown, HTML), plots (PNG) and `diagnosis.md` on the parent run.

    python -m orchestrator.report <sweep name | parent run id> [--tracking-uri URI]

Runs at the end of every sweep (the launcher calls `write_report`) and on demand. With a sweep name
it reports the latest parent run of that experiment.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import logging
import math
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.diagnosis import Finding, RunRow, Thresholds, diagnose, render_markdown

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
TABLE_METRICS = ("prompt_tokens", "completion_tokens", "commit_len_mean", "accept_rate", "verify_steps",
                 "ttft_s", "decode_tok_s", "verify_step_ms", "kv_bw_gbs", "roofline_frac", "gpu_util_mean")
TABLE_COLUMNS = ("run", "status", "context_len", "probe", "drafter", "attention", "page_size") + TABLE_METRICS
# Kernel jobs (job=kernel, workers/kernel_job.py): no engine metrics, their own table and no engine diagnosis.
KERNEL_METRICS = ("time_us", "gbs", "floor_frac", "rel_err")
KERNEL_COLUMNS = ("run", "status") + KERNEL_METRICS


class ReportError(RuntimeError):
    pass


@dataclass(frozen=True)
class ChildRun:
    row: RunRow
    status: str
    reason: str
    job: str = "engine"  # engine | kernel (the child's `job` tag)


@dataclass(frozen=True)
class Report:
    parent_run_id: str
    sweep: str
    children: tuple[ChildRun, ...]
    findings: tuple[Finding, ...]
    diagnosis_md: str
    artifact_files: tuple[str, ...]


def _param(params: dict[str, str], *keys: str, default: str = "") -> str:
    for k in keys:
        if k in params and params[k] not in ("", "None", "null"):
            return params[k]
    return default


def row_from_run(run) -> RunRow:
    p, m = run.data.params, run.data.metrics
    drafter = _param(p, "drafter.name", default="?")
    return RunRow(
        run_id=run.info.run_id,
        name=run.info.run_name or run.info.run_id,
        context_len=int(float(_param(p, "context_len", default="0"))),
        probe=_param(p, "probe.kind", "probe.name", default="?"),
        drafter=drafter,
        attention=_param(p, "attention.name", "attention.backend", default="?"),
        page_size=int(float(_param(p, "page_size", default="0"))),
        is_oracle=_param(p, "drafter.is_oracle", default="False").lower() == "true",
        num_steps=int(float(_param(p, "drafter.num_steps", default="0"))),
        metrics=dict(m),
    )


def resolve_parent(client, target: str) -> tuple[str, str]:
    """(parent run id, experiment name) for a parent run id or a sweep (experiment) name."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(target)
        exp = client.get_experiment(run.info.experiment_id)
        return run.info.run_id, exp.name
    except MlflowException:
        pass
    exp = client.get_experiment_by_name(target)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ReportError(f"{target!r} is neither a run id nor a sweep name; sweeps here: {', '.join(names) or 'none'}")
    parents = [r for r in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"],
                                             max_results=200) if PARENT_TAG not in r.data.tags]
    if not parents:
        raise ReportError(f"sweep {target!r} has no parent run yet")
    return parents[0].info.run_id, exp.name


def load_children(client, parent_run_id: str) -> list[ChildRun]:
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                              max_results=50000)
    children = [ChildRun(row_from_run(r), r.info.status, r.data.tags.get("failure_reason", ""),
                         r.data.tags.get("job", "engine")) for r in runs]
    children.sort(key=lambda c: (c.row.context_len, c.row.probe, c.row.drafter, c.row.attention, c.row.page_size))
    return children


# --- tables --------------------------------------------------------------------------------------


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table_rows(children: Sequence[ChildRun]) -> list[list[str]]:
    out = []
    for c in children:
        r = c.row
        status = c.status if not c.reason else f"{c.status} ({c.reason})"
        out.append([r.name, status, str(r.context_len), r.probe, r.drafter, r.attention, str(r.page_size)]
                   + [_fmt(r.metric(k)) for k in TABLE_METRICS])
    return out


def render_csv(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(TABLE_COLUMNS)
    w.writerows(rows)
    return buf.getvalue()


def render_md_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_html(rows: list[list[str]], sweep: str, diagnosis_md: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in TABLE_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(sweep)}</title>"
            "<style>table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #ccc;"
            "padding:2px 6px}</style></head><body>"
            f"<h1>{html.escape(sweep)}</h1><table><tr>{head}</tr>{body}</table>"
            f"<pre>{html.escape(diagnosis_md)}</pre></body></html>")


def kernel_rows(children: Sequence[ChildRun]) -> list[list[str]]:
    out = []
    for c in sorted((c for c in children if c.job == "kernel"), key=lambda c: c.row.name):
        status = c.status if not c.reason else f"{c.status} ({c.reason})"
        out.append([c.row.name, status] + [_fmt(c.row.metric(k)) for k in KERNEL_METRICS])
    return out


def render_kernel_md(rows: list[list[str]]) -> str:
    lines = ["## Kernel runs", "", f"{len(rows)} shape(s): time_us (median), gbs (unique prefix KV bytes / time), "
             "floor_frac (floor / time, GPU only), rel_err (vs the fp32 reference).", "",
             "| " + " | ".join(KERNEL_COLUMNS) + " |", "|" + "---|" * len(KERNEL_COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# --- plots ---------------------------------------------------------------------------------------


def _line_plot(path: Path, rows: Sequence[RunRow], metric: str, series_of, title: str, ylabel: str,
               hline: float | None = None, hline_label: str = "") -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = r.metric(metric)
        if v is not None:
            series[series_of(r)][r.context_len].append(v)
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts in sorted(series.items()):
        xs = sorted(pts)
        ax.plot(xs, [sorted(pts[x])[len(pts[x]) // 2] for x in xs], marker="o", label=label)
    if hline:
        ax.axhline(hline, color="k", linestyle="--", linewidth=1, label=hline_label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _histogram_plot(path: Path, client, children: Sequence[ChildRun]) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_drafter: dict[str, list[float]] = defaultdict(list)
    for c in children:
        if c.status == "FINISHED":
            per_drafter[f"{c.row.drafter} / {c.row.probe}"] += [m.value for m in
                                                               client.get_metric_history(c.row.run_id, "commit_len")]
    if not any(per_drafter.values()):
        return False
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


def build_plots(out: Path, client, children: Sequence[ChildRun]) -> list[Path]:
    rows = [c.row for c in children if c.status == "FINISHED"]
    peak = max((r.metric("peak_bw_gbs") or 0.0 for r in rows), default=0.0) or None
    made = []
    specs = [
        ("commit_len_vs_context.png", "commit_len_mean", lambda r: f"{r.probe} x {r.drafter}",
         "commit length vs context", "commit_len_mean (tokens / verify step)", None, ""),
        ("decode_tok_s_vs_context.png", "decode_tok_s", lambda r: f"attn={r.attention} page={r.page_size}",
         "decode throughput vs context", "decode tokens / s", None, ""),
        ("verify_step_ms_vs_context.png", "verify_step_ms", lambda r: f"attn={r.attention} page={r.page_size}",
         "verify-step time vs context", "verify_step_ms (median)", None, ""),
        ("kv_bw_gbs_vs_context.png", "kv_bw_gbs", lambda r: f"attn={r.attention} page={r.page_size}",
         "effective KV bandwidth vs context", "GB/s", peak, "device roofline"),
    ]
    for name, metric, series_of, title, ylabel, hline, hlabel in specs:
        if _line_plot(out / name, rows, metric, series_of, title, ylabel, hline, hlabel):
            made.append(out / name)
    if _histogram_plot(out / "accept_length_histogram.png", client, children):
        made.append(out / "accept_length_histogram.png")
    return made


# --- the report ----------------------------------------------------------------------------------


def write_report(client, parent_run_id: str, thresholds: Thresholds = Thresholds(), sweep: str | None = None,
                 print_summary: bool = True) -> Report:
    """Build the table, plots and diagnosis of a sweep and log them as artifacts of its parent run."""
    if sweep is None:
        parent = client.get_run(parent_run_id)
        sweep = client.get_experiment(parent.info.experiment_id).name
    children = load_children(client, parent_run_id)
    engine_children = [c for c in children if c.job != "kernel"]
    finished = [c.row for c in engine_children if c.status == "FINISHED"]
    peak = max((r.metric("peak_bw_gbs") or 0.0 for r in finished), default=0.0) or None
    findings = diagnose(finished, thresholds, peak_gbs=peak)
    krows = kernel_rows(children)
    if engine_children or not krows:
        diagnosis_md = render_markdown(findings, sweep, len(finished))
    else:  # a kernel sweep: the engine rules have nothing to examine
        diagnosis_md = f"# Diagnosis: {sweep}\n"
    if krows:
        diagnosis_md += "\n" + render_kernel_md(krows)
    rows = table_rows(engine_children)
    with tempfile.TemporaryDirectory(prefix="specsweep-report-") as tmp:
        out = Path(tmp)
        (out / "summary.csv").write_text(render_csv(rows))
        (out / "summary.md").write_text(render_md_table(rows))
        (out / "summary.html").write_text(render_html(rows, sweep, diagnosis_md))
        plots = build_plots(out, client, engine_children)
        if krows:
            buf = io.StringIO()
            csv.writer(buf).writerows([list(KERNEL_COLUMNS), *krows])
            (out / "kernels.csv").write_text(buf.getvalue())
            plots.append(out / "kernels.csv")
        (out / "diagnosis.md").write_text(diagnosis_md)
        client.log_artifact(parent_run_id, str(out / "diagnosis.md"))
        files = ["diagnosis.md"]
        for f in [out / "summary.csv", out / "summary.md", out / "summary.html", *plots]:
            client.log_artifact(parent_run_id, str(f), artifact_path="report")
            files.append(f"report/{f.name}")
    report = Report(parent_run_id, sweep, tuple(children), tuple(findings), diagnosis_md, tuple(files))
    if print_summary:
        print_report(report)
    return report


def print_report(report: Report) -> None:
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.table import Table

    console = Console()
    cols = ("run", "status", "commit_len_mean", "decode_tok_s", "verify_step_ms")
    idx = [TABLE_COLUMNS.index(c) for c in cols]
    table = Table(*cols, title=f"sweep {report.sweep} ({len(report.children)} runs)")
    for r in table_rows(report.children):
        table.add_row(*(r[i] for i in idx))
    console.print(table)
    console.print(Markdown(report.diagnosis_md))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.report", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="sweep name (its latest parent run) or a parent run id")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.tracking_uri)
    try:
        parent_id, sweep = resolve_parent(client, args.target)
    except ReportError as e:
        log.error("%s", e)
        return 2
    report = write_report(client, parent_id, sweep=sweep)
    log.info("report logged to parent run %s: %s", parent_id, ", ".join(report.artifact_files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
