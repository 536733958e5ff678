"""Sweep report: summary table (CSV, Markdown, HTML), plots (PNG) and `diagnosis.md` on the parent run.

    specsweep-report <sweep name | parent run id> [--tracking-uri URI]     # or python -m orchestrator.report

Runs at the end of every sweep (the launcher calls `write_report`) and on demand. With a sweep name
it reports the latest parent run of that experiment (a stub-engine sweep's experiment is `<sweep name>-stub`).

It covers every point of the sweep: the parent's own child runs, and for each point skipped on resume (the
parent's `run_hashes.txt`) the latest FINISHED child run of the experiment with that run_hash, from an earlier
invocation (column `invocation`, and the count in `diagnosis.md`).
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
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.settings import Thresholds
from orchestrator.results.diagnosis import Diagnosis, Finding, RunRow, diagnose
from orchestrator.results.diagnosis_md import render_markdown
from orchestrator.results.regress.section import changes_section
from orchestrator.config.weights_scope import dummy_weights_reason
from specsweep_vocab.sglang_facts import SGLANG_PLUGIN_BACKENDS

if TYPE_CHECKING:
    from mlflow.entities import Run

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
TABLE_METRICS = ("prompt_tokens", "completion_tokens", "commit_len_mean", "accept_rate", "verify_steps",
                 "ttft_s", "decode_tok_s", "throughput_tok_s", "verify_step_ms", "kv_bw_gbs", "roofline_frac",
                 "gpu_util_mean")
TABLE_COLUMNS = ("run", "status", "invocation", "context_len", "probe", "drafter", "attention",
                 "page_size", "concurrency") + TABLE_METRICS
RUN_HASHES_ARTIFACT = "run_hashes.txt"  # orchestrator.results.tracking's: every point of the sweep
# Kernel jobs (job=kernel, workers/kernel_job.py): no engine metrics, their own table and no engine diagnosis.
KERNEL_METRICS = ("time_us", "gbs", "floor_frac", "rel_err")
KERNEL_COLUMNS = ("run", "status", "invocation") + KERNEL_METRICS


class ReportError(RuntimeError):
    pass


@dataclass(frozen=True)
class ChildRun:
    row: RunRow
    status: str
    reason: str
    job: str = "engine"  # engine | kernel (the child's `job` tag)
    earlier_parent: str = ""  # the parent run of an earlier invocation that recorded it ("" = this one)

    @property
    def invocation(self) -> str:
        return f"earlier ({self.earlier_parent[:8]})" if self.earlier_parent else "this"


@dataclass(frozen=True)
class Report:
    parent_run_id: str
    sweep: str
    children: tuple[ChildRun, ...]
    findings: tuple[Finding, ...]
    diagnosis: Diagnosis
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
        engine=run.data.tags.get("engine", ""),
        concurrency=int(float(_param(p, "probe.concurrency", default="1"))),
        dummy_weights=dummy_weights_reason(p),
        plugin=run.data.tags.get("engine", "") == "sglang" and any(
            _param(p, f"attention.{k}") in SGLANG_PLUGIN_BACKENDS for k in ("backend", "decode_backend", "prefill_backend")),
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


def _child(run, earlier_parent: str = "") -> ChildRun:
    return ChildRun(row_from_run(run), run.info.status, run.data.tags.get("failure_reason", ""),
                    run.data.tags.get("job", "engine"), earlier_parent)


def sweep_run_hashes(client, parent_run_id: str) -> list[str] | None:
    """Every point of the parent's sweep (its `run_hashes.txt`); None for a parent recorded without one."""
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="specsweep-hashes-") as tmp:
        try:
            path = client.download_artifacts(parent_run_id, RUN_HASHES_ARTIFACT, tmp)
        except (MlflowException, OSError):
            return None
        return Path(path).read_text().split()


def _finished_children(client, experiment_id: str):
    from mlflow.entities import ViewType

    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string="attributes.status = 'FINISHED'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        yield from (r for r in page if PARENT_TAG in r.data.tags and "run_hash" in r.data.tags)
        token = page.token
        if not token:
            return


def load_children(client, parent_run_id: str, run_hashes: Collection[str] | None = None) -> list[ChildRun]:
    """The parent's child runs, plus, for each of `run_hashes` without a FINISHED one among them, the latest FINISHED
    child run of the experiment with that run_hash (recorded by an earlier invocation of the sweep)."""
    parent = client.get_run(parent_run_id)
    exp_id = parent.info.experiment_id
    runs = client.search_runs([exp_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'", max_results=50000)
    children = [_child(r) for r in runs]
    missing = set(run_hashes or ()) - {r.data.tags.get("run_hash") for r in runs if r.info.status == "FINISHED"}
    if missing:
        latest: dict[str, Run] = {}
        for r in _finished_children(client, exp_id):
            h = r.data.tags["run_hash"]
            if h in missing and (h not in latest or r.info.start_time > latest[h].info.start_time):
                latest[h] = r
        children += [_child(r, r.data.tags[PARENT_TAG]) for r in latest.values()]
    children.sort(key=lambda c: (c.row.context_len, c.row.probe, c.row.drafter, c.row.attention, c.row.page_size,
                                 c.earlier_parent))
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
        out.append([r.name, status, c.invocation, str(r.context_len), r.probe, r.drafter, r.attention,
                    str(r.page_size), str(r.concurrency)]
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
        out.append([c.row.name, status, c.invocation] + [_fmt(c.row.metric(k)) for k in KERNEL_METRICS])
    return out


def render_kernel_md(rows: list[list[str]]) -> str:
    lines = ["## Kernel runs", "", f"{len(rows)} shape(s): time_us (median), gbs (unique prefix KV bytes / time), "
             "floor_frac (floor / time, GPU only), rel_err (vs the fp32 reference).", "",
             "| " + " | ".join(KERNEL_COLUMNS) + " |", "|" + "---|" * len(KERNEL_COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# --- plots ---------------------------------------------------------------------------------------


def _line_plot(path: Path, rows: Sequence[RunRow], metric: str, series_of, title: str, ylabel: str,
               hline: float | None = None, hline_label: str = "", *, x_of=lambda r: r.context_len,
               xlabel: str = "context length (tokens)") -> bool:
    """The median of `metric` per x (log2 axis), a line per `series_of(row)`; False (no file) without values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = r.metric(metric)
        if v is not None:
            series[series_of(r)][x_of(r)].append(v)
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts in sorted(series.items()):
        xs = sorted(pts)
        ax.plot(xs, [sorted(pts[x])[len(pts[x]) // 2] for x in xs], marker="o", label=label)
    if hline:
        ax.axhline(hline, color="k", linestyle="--", linewidth=1, label=hline_label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
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


def _concurrency_plot(path: Path, rows: Sequence[RunRow]) -> bool:
    """Aggregate throughput (all requests' tokens / wall) vs probe.concurrency, a line per drafter x context x
    probe: speculative speedup vs batch size."""
    return _line_plot(path, rows, "throughput_tok_s", lambda r: f"{r.drafter} ctx={r.context_len} {r.probe}",
                      "throughput vs concurrency", "tokens / s, all requests", x_of=lambda r: r.concurrency,
                      xlabel="requests in flight (probe.concurrency)")


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
         "verify-step time vs context", "verify_step_ms (per request step; N>1: batched forward / N)", None, ""),
        ("kv_bw_gbs_vs_context.png", "kv_bw_gbs", lambda r: f"attn={r.attention} page={r.page_size}",
         "effective KV bandwidth vs context", "GB/s", peak, "device roofline"),
    ]
    for name, metric, series_of, title, ylabel, hline, hlabel in specs:
        if _line_plot(out / name, rows, metric, series_of, title, ylabel, hline, hlabel):
            made.append(out / name)
    if len({r.concurrency for r in rows}) > 1 and _concurrency_plot(out / "throughput_vs_concurrency.png", rows):
        made.append(out / "throughput_vs_concurrency.png")
    if _histogram_plot(out / "accept_length_histogram.png", client, children):
        made.append(out / "accept_length_histogram.png")
    return made


# --- the report ----------------------------------------------------------------------------------


def write_report(client, parent_run_id: str, thresholds: Thresholds = Thresholds(), sweep: str | None = None,
                 print_summary: bool = True, run_hashes: Collection[str] | None = None) -> Report:
    """Build the table, plots and diagnosis of a sweep and log them as artifacts of its parent run.

    `run_hashes`: every point of the sweep (`Plan.run_hashes`); None reads the parent's `run_hashes.txt`."""
    if sweep is None:
        parent = client.get_run(parent_run_id)
        sweep = client.get_experiment(parent.info.experiment_id).name
    if run_hashes is None:
        run_hashes = sweep_run_hashes(client, parent_run_id)
    children = load_children(client, parent_run_id, run_hashes)
    engine_children = [c for c in children if c.job != "kernel"]
    finished = [c for c in engine_children if c.status == "FINISHED"]
    rows_finished = [c.row for c in finished]
    peak = max((r.metric("peak_bw_gbs") or 0.0 for r in rows_finished), default=0.0) or None
    diagnosis = diagnose(rows_finished, thresholds, peak_gbs=peak)
    krows = kernel_rows(children)
    if engine_children or not krows:
        diagnosis_md = render_markdown(diagnosis, sweep, earlier=sum(bool(c.earlier_parent) for c in finished))
    else:  # a kernel sweep: the engine rules have nothing to examine
        earlier = sum(bool(c.earlier_parent) for c in children if c.job == "kernel")
        diagnosis_md = f"# Diagnosis: {sweep}\n" + (
            f"\n{earlier} kernel run(s) from earlier invocations of this sweep (skipped on resume).\n" if earlier else "")
    if krows:
        diagnosis_md += "\n" + render_kernel_md(krows)
    rows = table_rows(engine_children)
    with tempfile.TemporaryDirectory(prefix="specsweep-report-") as tmp:
        out = Path(tmp)
        changes = changes_section(client, parent_run_id, out)  # "Changes since <baseline>": orchestrator/results/regress
        diagnosis_md = changes.markdown + ("\n" if changes.markdown else "") + diagnosis_md
        (out / "summary.csv").write_text(render_csv(rows))
        (out / "summary.md").write_text(render_md_table(rows))
        (out / "summary.html").write_text(render_html(rows, sweep, diagnosis_md))
        plots = [*changes.plots, *build_plots(out, client, engine_children)]
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
    report = Report(parent_run_id, sweep, tuple(children), diagnosis.findings, diagnosis, diagnosis_md, tuple(files))
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
    parser = argparse.ArgumentParser(prog="specsweep-report", description=__doc__.split("\n")[0])
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
