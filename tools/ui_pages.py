"""The two MLflow UI pages a researcher opens after a sweep, read in Chromium (tools/browser.py): the runs table of the
sweep's saved view and the parent run's report in MLflow's artifact view. Shared by the browser test
(tests/orchestrator/test_e2e_smoke.py) and `make screenshots` (tools/screenshots.py).

    with mlflow_server(backend_store_uri, artifacts_dir) as url: ...   `mlflow server` on a free loopback port
    quiet_assistant(browser, url)                      MLflow's assistant panel closed (it opens on a first visit)
    runs_table(browser, url, experiment_id, rows=9) -> Table   the saved view (or the plain runs page) once it
                                                       shows `rows` runs: columns and, per row, the cells shown
    report_text(browser, url, experiment_id, parent_run_id) -> str   the report's text as the artifact view shows it
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from orchestrator.results.ui_view import view_url
from tools.browser import Browser
from workers.engine_process import free_port

REPORT_ARTIFACT = "report/summary.html"
# MLflow 3.17's runs table is an ag-grid: a row's cells carry their column id (`metrics.`commit_len_mean``); a run name
# cell holds the run's link and an indent block 24 px wide per nesting level (24: a top-level run, 48: its child).
_ROWS_JS = """(() => {
  const rows = {};
  for (const cell of document.querySelectorAll('.ag-row[row-index] .ag-cell[col-id]')) {
    const i = cell.closest('.ag-row').getAttribute('row-index');
    const row = rows[i] = rows[i] || {cells: {}};
    const col = cell.getAttribute('col-id');
    row.cells[col] = cell.innerText.trim();
    const link = cell.querySelector('a[href*="/runs/"]');
    if (link) {
      row.run_id = link.getAttribute('href').split('/runs/')[1];
      const indent = cell.querySelector('div[style*="width"]');
      row.indent = indent ? parseInt(indent.style.width) : 0;
      row.expanded = !!cell.querySelector('button');
    }
  }
  return Object.keys(rows).sort((a, b) => a - b).map(i => rows[i]);
})()"""
_HEADERS_JS = "[...document.querySelectorAll('.ag-header-cell[col-id]')].map(h => h.getAttribute('col-id'))"


@contextlib.contextmanager
def mlflow_server(backend_store_uri: str, artifacts: Path) -> Iterator[str]:
    """`mlflow server` on loopback, one worker, no job runners; stopped (TERM, then KILL) on exit."""
    port = free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
           "--default-artifact-root", str(artifacts), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log = open(artifacts.parent / "mlflow-server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {proc.returncode}: "
                                   + (artifacts.parent / "mlflow-server.log").read_text()[-2000:])
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("mlflow server not healthy within 90 s")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


@dataclass(frozen=True)
class Row:
    run_id: str
    indent: int  # px: 24 a top-level run, 48 a child shown under its parent
    has_toggle: bool  # the expand / collapse button of a parent row
    cells: dict[str, str]  # column id -> the text shown

    def value(self, metric: str) -> str:
        return self.cells.get(f"metrics.`{metric}`", "")


@dataclass(frozen=True)
class Table:
    columns: list[str]  # column ids, in the order shown
    rows: list[Row]  # in the order shown


def quiet_assistant(browser: Browser, url: str) -> None:
    """Mark MLflow's assistant panel as already shown and closed (browser storage of `url`'s origin)."""
    browser.goto(url)
    browser.wait_for("document.readyState === 'complete'", what="the MLflow UI")
    browser.eval("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
                 "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false')")


def runs_table(browser: Browser, url: str, experiment_id: str, *, saved_view: bool = True, rows: int = 2,
               timeout_s: float = 120) -> Table:
    """The sweep's runs table, read once it shows `rows` runs: its saved view (orchestrator/results/ui_view.py)
    (the points as rows) or the experiment's plain runs page (`saved_view=False`: each parent, expanded on a first
    visit, with its points under it)."""
    page = view_url(url, experiment_id) if saved_view else f"{url.rstrip('/')}/#/experiments/{experiment_id}/runs"
    browser.goto(page)
    browser.wait_for(f"document.querySelectorAll('.ag-center-cols-container .ag-row').length >= {rows}",
                     what=f"{rows} runs in the runs table", timeout_s=timeout_s)
    shown = [Row(r.get("run_id", ""), r.get("indent", 0), r.get("expanded", False), r["cells"])
             for r in browser.eval(_ROWS_JS)]
    return Table(browser.eval(_HEADERS_JS), shown)


def report_text(browser: Browser, url: str, experiment_id: str, parent_run_id: str, *, timeout_s: float = 120) -> str:
    """The parent's report as MLflow's artifact view renders it (a sandboxed iframe, read through its own
    DevTools session): MLflow's /get-artifact serves it as a download, which a browser never renders."""
    browser.goto(f"{url.rstrip('/')}/#/experiments/{experiment_id}/runs/{parent_run_id}/artifacts/{REPORT_ARTIFACT}")
    browser.wait_for("!!document.querySelector('iframe.mlflow-html-iframe')", what="the report's frame",
                     timeout_s=timeout_s)

    def frame_text() -> str:
        for session in browser.frame_sessions():
            text = browser.eval("document.body ? document.body.innerText : ''", session=session) or ""
            if "At a glance" in text:
                return text
        return ""
    return browser.wait_for_value(frame_text, what="the report inside MLflow's artifact view", timeout_s=timeout_s)
