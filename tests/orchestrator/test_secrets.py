"""Secrets (engine.env values, --api-key style flags, URI passwords) never reach MLflow or the logs, while the
engine still gets them: a real `python -m orchestrator` sweep on the stub engine against a real MLflow tracking
server on loopback whose URI carries a password; then the whole store (SQLite dump and artifact files), the
driver's output and every log file are searched for the secret strings."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.config.plan import Plan
from specsweep_common.redact import MASK, redact_argv, redact_config, redact_override, redact_params, redact_text
from specsweep_common.spec import FailureReason, RunResult, RunState
from tools.testing import engines_under, proc_argv, proc_env, stub_server, stub_starts, tiny_group, tiny_run
from orchestrator.results.tracking import Tracker

mlflow = pytest.importorskip("mlflow")

ROOT = Path(__file__).resolve().parents[2]
ENV_SECRET = "envsecret-7Q2fJ9xk"
KEY_SECRET = "sk-apikey-4Hn8Wc3e"
URI_SECRET = "uripass-Zp5Lt6Rv"


def test_redaction_rules():
    assert redact_argv(["--api-key", "K123", "--max-total-tokens", "4096", "--hf-token=T123", "--page-size", "1"]) == \
        ["--api-key", MASK, "--max-total-tokens", "4096", f"--hf-token={MASK}", "--page-size", "1"]
    assert redact_text("http://bob:pw1234@h:5000/x?token=abc&page=2&api_key=zz") == \
        f"http://bob:{MASK}@h:5000/x?token={MASK}&page=2&api_key={MASK}"
    assert redact_override("engine.env.HF_TOKEN=abc") == f"engine.env.HF_TOKEN={MASK}"
    assert redact_override("engine.extra_args=[--api-key,K123,--tp-size,2]") == \
        f"engine.extra_args=[--api-key,{MASK},--tp-size,2]"
    assert redact_override("engine.stub.token_s=0.1") == "engine.stub.token_s=0.1"  # token_s is not a token
    assert redact_config({"engine": {"env": {"A": "1"}, "extra_args": ["--db-password", "pw"]}, "n": 3}) == \
        {"engine": {"env": {"A": MASK}, "extra_args": ["--db-password", MASK]}, "n": 3}
    assert dict(redact_params([("engine.env.A", "v"), ("engine.extra_args", '["--api-key", "K123"]'),
                               ("context_len", "1024")])) == \
        {"engine.env.A": MASK, "engine.extra_args": f'["--api-key", "{MASK}"]', "context_len": "1024"}


def test_config_errors_show_no_secret():
    from orchestrator.config.config_error import ConfigError
    from specsweep_common.problem import Problem

    overrides = (f"engine.env.HF_TOKEN={ENV_SECRET}", f"engine.extra_args=[--api-key,{KEY_SECRET}]", "page_size=0")
    message = str(ConfigError([Problem("page_size", 0, "an integer >= 1", overrides),
                               Problem("engine.env.HF_TOKEN", ENV_SECRET, "a string", overrides)]))
    assert ENV_SECRET not in message and KEY_SECRET not in message
    assert "page_size=0: allowed an integer >= 1" in message and f"engine.env.HF_TOKEN={MASK}" in message


def test_tracker_scrubs_the_plans_secrets_from_every_text(tmp_path):
    """A failed run's engine log tail and message quoting the key (SGLang logs its server_args) are scrubbed."""
    server = stub_server(extra_args=("--api-key", KEY_SECRET))
    spec = tiny_run(server, 0)
    plan = Plan(sweep_name="s", groups=(tiny_group(server, [spec]),), base_config={"a": 1})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "s", secrets={KEY_SECRET})
    with tracker.start_parent(plan, work_dir=tmp_path):
        tracker.log_result(RunResult(run=spec, state=RunState.FAILED, reason=FailureReason.ENGINE_DIED,
                                     message=f"engine exited: server_args=ServerArgs(api_key='{KEY_SECRET}')",
                                     artifacts={"engine_log_tail.txt": f"api_key='{KEY_SECRET}'\nboom\n"}))
    assert_absent(tmp_path, [KEY_SECRET])
    run = mlflow.MlflowClient(uri).search_runs([tracker.experiment_id], "tags.`specsweep.role` = 'child'")[0]
    assert MASK in run.data.tags["message"]


SHORT = "Qz9s"  # shorter than MIN_SCRUB_LEN: only the key or the flag around it marks it as a secret
SHORT2 = "Wy8t"


def test_the_tracker_alone_keeps_a_plans_secrets_out_of_the_store(tmp_path):
    """The plan keeps the real values (planning redacts nothing but the run names' labels); the Tracker is the
    store's one boundary: params by their key, overrides, axis tags, the parent's config and every text."""
    import dataclasses

    server = stub_server(extra_args=("--api-key", KEY_SECRET))
    specs = []
    for i, token in enumerate((SHORT, SHORT2)):
        run = tiny_run(server, i)
        overrides = (f"engine.env.HF_TOKEN={token}", f"engine.extra_args=[--api-key,{KEY_SECRET}]")
        specs.append(dataclasses.replace(run, name=f"{run.name} engine.env.HF_TOKEN={token}", overrides=overrides,
                                         params=(*run.params, ("engine.env.HF_TOKEN", token),
                                                 ("engine.extra_args", f'["--api-key", "{KEY_SECRET}"]'))))
    plan = Plan(sweep_name="s", groups=(tiny_group(server, specs),),
                base_config={"engine": {"env": {"HF_TOKEN": SHORT}, "extra_args": ["--api-key", KEY_SECRET]}},
                overrides=(f"engine.env.HF_TOKEN={SHORT},{SHORT2}", f"+engine.env.DB_PASSWORD={SHORT}"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "s")  # no literal secrets given: the structure alone must mask them
    with tracker.start_parent(plan, work_dir=tmp_path):
        for spec in specs:
            tracker.log_result(RunResult(run=spec, state=RunState.FINISHED, metrics={"x": 1.0}))
    assert tracker.axes == ("engine.env.HF_TOKEN",)
    assert_absent(tmp_path, [SHORT, SHORT2, KEY_SECRET])
    runs = mlflow.MlflowClient(uri).search_runs([tracker.experiment_id])
    child = next(r for r in runs if r.data.tags.get("specsweep.role") == "child")
    assert child.data.params["cfg.engine.env.HF_TOKEN"] == MASK and child.data.tags["axis.engine.env.HF_TOKEN"] == MASK
    assert child.data.params["axis.engine.env.HF_TOKEN"] == MASK
    assert child.info.run_name.endswith(f"engine.env.HF_TOKEN={MASK}")


# Every module that writes to MLflow, and what it writes. The Tracker is the boundary for what comes from the plan;
# the others write only what they read back from the store (already redacted) or constants. A new writer must be
# reviewed and listed here, or write through the Tracker.
MLFLOW_WRITERS = {
    "orchestrator/results/tracking.py": "the boundary: names, params, tags and artifacts of the plan, redacted",
    "orchestrator/results/report/build.py": "the report's files, built from the runs read back from the store",
    "orchestrator/results/regress/section.py": "regression verdicts of runs read back from the store",
    "orchestrator/results/ui_view.py": "the experiment's kind and saved view (axis names, constants)",
    "orchestrator/tune/rounds.py": "the tune's own parent run: the study's settings as params, the answer's files",
    "orchestrator/tune/search.py": "the tune's answer (winner table, schedule, load curves) on that run",
    "orchestrator/load/run.py": "a load curve's run: the configuration's params (redacted like the plan's), bench_serving's "
                                "file, the engine's per-request records, figures and metrics",
}
_MLFLOW_WRITE = ("log_batch(", "log_text(", "log_param(", "log_params(", "set_tag(", "set_tags(", "create_run(",
                 "log_artifact(", "log_artifacts(", "log_metric(", "log_dict(", "log_figure(", "log_image(",
                 "set_experiment_tag(", "start_run(")


def test_only_the_listed_modules_write_to_mlflow():
    writers = set()
    for package in ("orchestrator", "workers", "hydra_plugins", "specsweep_common"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if any(f".{call}" in text for call in _MLFLOW_WRITE):
                writers.add(path.relative_to(ROOT).as_posix())
    assert writers == set(MLFLOW_WRITERS), "a module writes to MLflow outside the Tracker: review it, list it here"


def assert_absent(root: Path, secrets: list[str], skip=lambda path: False) -> int:
    """No file under `root` (SQLite databases as their SQL dump) holds any of `secrets`; returns files read."""
    seen = 0
    for path in root.rglob("*"):
        if not path.is_file() or skip(path.relative_to(root)):
            continue
        if path.suffix == ".db":
            with sqlite3.connect(path) as db:
                text = "\n".join(db.iterdump()).encode()
        else:
            text = path.read_bytes()
        seen += 1
        for s in secrets:
            assert s.encode() not in text, f"{s!r} found in {path}"
    return seen


def _watch_engines(root_pid: int, seen: dict[int, tuple[str | None, str | None]], stop: threading.Event) -> None:
    """Until `stop`: for each engine below `root_pid`, while it runs, its --api-key value and SPECSWEEP_TEST_SECRET
    from /proc (what it was started with; kept in memory, never written)."""
    while not stop.is_set():
        for pid in engines_under(root_pid).keys() - seen.keys():
            try:
                argv, env = proc_argv(pid), proc_env(pid)
            except OSError:
                continue  # gone already: its start-up line shows it was missed
            key = argv[argv.index("--api-key") + 1] if "--api-key" in argv[:-1] else None
            seen[pid] = (key, env.get("SPECSWEEP_TEST_SECRET"))
        stop.wait(0.05)


def test_sweep_records_no_secret_and_the_engine_gets_every_one(tmp_path, mlflow_ui):
    store, work = tmp_path / "store", tmp_path / "work"
    for d in (store, work):
        d.mkdir()
    (store / "artifacts").mkdir()
    with mlflow_ui(f"sqlite:///{store}/mlflow.db", store / "artifacts") as url:
        uri = url.replace("http://", f"http://specsweep:{URI_SECRET}@")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled",
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), "COLUMNS": "200"}
        cmd = [sys.executable, "-m", "orchestrator", "+sweep=smoke", "engine=stub", "progress=false",
               "cluster.num_cpus=2", f"+engine.env.SPECSWEEP_TEST_SECRET={ENV_SECRET}",
               f"engine.extra_args=[--api-key,{KEY_SECRET}]", "tracking=server", f"tracking.uri={uri}",
               "hydra.sweep.dir=multirun/secrets"]
        t0 = time.monotonic()
        seen: dict[int, tuple[str | None, str | None]] = {}
        stop = threading.Event()
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watcher = threading.Thread(target=_watch_engines, args=(proc.pid, seen, stop), daemon=True)
        watcher.start()
        try:
            output, _ = proc.communicate(timeout=300)
        finally:
            stop.set()
            watcher.join(10)
            proc.kill()
            proc.wait()
        assert proc.returncode == 0, output[-4000:]
        client = mlflow.MlflowClient(url)
        exp = client.get_experiment_by_name("smoke-stub")
        runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if r.data.tags.get("specsweep.role") == "child"]
    (parent,) = [r for r in runs if r.data.tags.get("specsweep.role") == "parent"]
    assert len(children) == 8 and {r.info.status for r in children} == {"FINISHED"}, time.monotonic() - t0

    for secret in (ENV_SECRET, KEY_SECRET, URI_SECRET):
        assert secret not in output
    (tmp_path / "driver-output.log").write_text(output)
    # the store (SQLite dump + artifacts), the MLflow server's log, the driver's output, the engine logs, Hydra's
    # job log: everything but Hydra's own copy of the command line (its multirun.yaml in the sweep dir, written
    # before any of our code runs: docs/orchestrator.md)
    read = assert_absent(tmp_path, [ENV_SECRET, KEY_SECRET, URI_SECRET],
                         skip=lambda p: p.parts[:2] == ("work", "multirun") and p.suffix == ".yaml")
    assert read > 20 and list(store.rglob("config.yaml")) and list(work.glob("logs/engines/*/*"))

    params = parent.data.params
    assert params["cfg.engine.env.SPECSWEEP_TEST_SECRET"] == MASK
    assert params["cfg.tracking.uri"].startswith(f"http://specsweep:{MASK}@")
    assert MASK in children[0].data.params["cfg.engine.extra_args"]
    assert all(MASK in c.info.run_name for c in children)  # the env override is part of every run name

    pids = {s.pid for s in stub_starts(work / "logs")}
    assert len(pids) == 2  # one engine per server
    assert seen.keys() == pids  # each seen while it ran
    assert set(seen.values()) == {(KEY_SECRET, ENV_SECRET)}


def test_a_failing_single_run_prints_no_secret_on_any_path(tmp_path):
    """A run that fails (a per-request timeout on the stub) with --api-key and an engine.env token: the
    progress and log lines and the RunFailed message (one message, exit 1: orchestrator/__main__.py) pass the
    command line's one output boundary (specsweep_common.redact.RedactingStream); the store, the engine logs and
    Ray's own logs (its temp dir) are searched too. Hydra's own copies of the command line (.hydra/*.yaml, written
    before any of our code runs) are left out, as in the sweep test above."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), "COLUMNS": "200",
           "RAY_TMPDIR": tempfile.mkdtemp(prefix="rs", dir="/tmp")}  # short: Ray's unix sockets live under it
    cmd = [sys.executable, "-m", "orchestrator", "engine=stub", "cluster.num_cpus=2", "engine.stub.token_s=0.5",
           "engine.request_timeout_s=1", f"+engine.env.SPECSWEEP_TEST_SECRET={ENV_SECRET}",
           f"engine.extra_args=[--api-key,{KEY_SECRET}]"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-4000:]
    assert "Error executing job with overrides" not in output and "HYDRA_FULL_ERROR" not in output, output[-4000:]
    assert "FAILED" in output
    for secret in (ENV_SECRET, KEY_SECRET):
        assert secret not in output, output[-4000:]
    read = assert_absent(tmp_path, [ENV_SECRET, KEY_SECRET], skip=lambda p: ".hydra" in p.parts)
    assert read > 5 and (tmp_path / "mlflow.db").exists()
    try:
        assert_absent(Path(env["RAY_TMPDIR"]), [ENV_SECRET, KEY_SECRET])  # Ray's own logs
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
