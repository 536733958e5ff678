"""`python -m orchestrator` as a real subprocess in a temp working directory.

An invalid sweep must exit non-zero within seconds, naming the key, before any Ray or MLflow work:
the child records at exit whether `ray` or `mlflow` was ever imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

# Runs the app as `python -m orchestrator` would, then reports which heavy modules were imported.
PROBE = """
import atexit, json, runpy, sys
atexit.register(lambda: open("imported.json", "w").write(json.dumps(
    {m: m in sys.modules for m in ("ray", "mlflow", "orchestrator.execute", "orchestrator.tracking")})))
sys.argv = ["orchestrator"] + sys.argv[1:]
runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
"""


def run_app(tmp_path, *args, timeout=60):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin",
                                                "RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path)})
    return proc, time.monotonic() - t0


def assert_nothing_started(tmp_path):
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    imported = json.loads((tmp_path / "imported.json").read_text())
    assert not any(imported.values()), imported


@pytest.mark.parametrize("args,key,allowed", [
    (("+sweep=smoke", "page_size=0,16"), "page_size=0", "an integer >= 1"),
    (("+sweep=smoke", "drafter=draft_model"), "drafter.draft_model_path=None", "tiny-draft"),
    (("page_size=0",), "page_size=0", "an integer >= 1"),  # a single run: the same checks
    (("context_len=65536",), "context_len=65536", "max_context_len 32768"),  # a single run above the max
    (("+sweep=smoke", r"metrics.log_patterns=['commit=(?P<c>\d+)','commit=\d+']"),
     r"metrics.log_patterns[1]='commit=\\d+'", "at least one named group"),
    (("engine=stub", "engine.stub.token_s=-1"), "engine.stub.token_s=-1.0", "a number of seconds >= 0"),
])
def test_invalid_config_exits_nonzero_naming_the_key(tmp_path, args, key, allowed):
    proc, elapsed = run_app(tmp_path, *args)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert key in proc.stderr and allowed in proc.stderr
    assert elapsed < 30
    assert_nothing_started(tmp_path)


def test_every_invalid_point_listed(tmp_path):
    proc, _ = run_app(tmp_path, "+sweep=smoke", "page_size=0,16")
    assert "8 problem(s) in 8 grid point(s)" in proc.stderr
    assert proc.stderr.count("page_size=0: allowed") == 8


@pytest.mark.parametrize("args,needle", [
    (("+sweep=smoke", "attention=torch,bogus"), "Could not find 'attention/bogus'"),
    (("+sweep=smoke", "attention=bogus"), "Could not find 'attention/bogus'"),
    (("+sweep=smoke", "model.n_layers=3"), "n_layers"),
])
def test_unknown_option_or_key_is_hydras_error(tmp_path, args, needle):
    proc, elapsed = run_app(tmp_path, *args)
    assert proc.returncode != 0 and needle in proc.stderr and elapsed < 30
    assert not (tmp_path / "mlflow.db").exists()


def test_dry_run_plans_longctx(tmp_path):
    proc, _ = run_app(tmp_path, "+sweep=longctx", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert out.count("dropped 24 of 48 grid points") == 1
    assert "plan: 24 run(s) on 4 server(s), 24 dropped" in out
    assert_nothing_started(tmp_path)
