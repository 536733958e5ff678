"""`make screenshots`: the README's pictures of the MLflow UI, from a real small sweep.

    python -m tools.screenshots [--out docs/img] [--workdir DIR] [OVERRIDE ...]

Runs `python -m orchestrator +sweep=probe context_len=512,1024` (SmolLM2-135M on the reference engine, 12 points,
about 2 min on a 2-core VM) in a fresh directory, serves its store with `mlflow server`, and takes, in headless
Chromium (tools/browser.py), what a researcher sees:

    mlflow-runs-table.png    the sweep's saved view: a row per point, commit_len_mean, decode_tok_s, verify ms, axes
    mlflow-runs-nested.png   the experiment's runs page: the parent expanded with its points under it
    mlflow-report.png        the parent's report (report/summary.html) in MLflow's artifact view

Each picture is taken only once the page's DOM shows what it is for (the same reads as the browser test in
tests/orchestrator/test_e2e_smoke.py). Other overrides replace the default sweep's (e.g. `+sweep=smoke`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.results.store_layout import PARENT_TAG, ROLE_PARENT, ROLE_TAG
from tools.browser import Browser
from tools.ui_pages import mlflow_server, quiet_assistant, report_text, runs_table

log = logging.getLogger("screenshots")
DEFAULT_SWEEP = ("+sweep=probe", "context_len=512,1024")
PICTURES = ("mlflow-runs-table.png", "mlflow-runs-nested.png", "mlflow-report.png")  # what the README shows


def run_sweep(workdir: Path, overrides: list[str]) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    log.info("sweep: python -m orchestrator %s (in %s)", " ".join(overrides), workdir)
    out = subprocess.run([sys.executable, "-m", "orchestrator", *overrides], cwd=workdir, env=env)
    if out.returncode != 0:
        raise SystemExit(f"the sweep exited {out.returncode}; see its output above")


def take(workdir: Path, out: Path, chromium: str) -> list[Path]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    parents = [r for e in client.search_experiments() for r in client.search_runs(
        [e.experiment_id], f"tags.`{ROLE_TAG}` = '{ROLE_PARENT}'", order_by=["attributes.start_time DESC"])]
    if not parents:
        raise SystemExit(f"no sweep recorded in {workdir}/mlflow.db")
    parent = parents[0]
    exp_id = parent.info.experiment_id
    points = client.search_runs([exp_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    with mlflow_server(f"sqlite:///{workdir}/mlflow.db", workdir / "mlartifacts") as url, \
            Browser(chromium, workdir / "chromium-profile", width=1600, height=900) as b:
        quiet_assistant(b, url)
        shots = []
        runs_table(b, url, exp_id, saved_view=False, rows=len(points) + 1)
        shots.append(b.screenshot(out / PICTURES[1]))
        table = runs_table(b, url, exp_id, rows=len(points))
        if not any(r.value("commit_len_mean").replace(".", "").isdigit() for r in table.rows):
            raise SystemExit("the saved view shows no commit_len_mean value")
        shots.append(b.screenshot(out / PICTURES[0]))
        report_text(b, url, exp_id, parent.info.run_id)
        shots.append(b.screenshot(out / PICTURES[2]))
    return shots


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="make screenshots", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--workdir", type=Path, help="keep the sweep here (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help=f"the sweep (default: {' '.join(DEFAULT_SWEEP)})")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("Chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="specsweep-shots-") as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        run_sweep(workdir, args.overrides or list(DEFAULT_SWEEP))
        for path in take(workdir, args.out.resolve(), chromium):
            log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
