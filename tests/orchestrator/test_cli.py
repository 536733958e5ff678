"""`python -m orchestrator` as a real subprocess in a temp working directory.

An invalid sweep must exit non-zero within seconds, naming the key, before any Ray or MLflow work:
the child records at exit whether `ray` or `mlflow` was ever imported, and Ray's temp dir (RAY_TMPDIR)
must stay absent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.execution.preflight import local_gpus

ROOT = Path(__file__).resolve().parents[2]
# this checkout first, whichever one the venv has installed in editable mode
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *filter(None, [os.environ.get("PYTHONPATH")])])

# Runs the app as `python -m orchestrator` would, then reports which heavy modules were imported.
PROBE = """
import atexit, json, runpy, sys
atexit.register(lambda: open("imported.json", "w").write(json.dumps(
    {m: m in sys.modules for m in ("ray", "mlflow", "orchestrator.execution.execute", "orchestrator.results.tracking")})))
sys.argv = ["orchestrator"] + sys.argv[1:]
runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
"""


def run_app(tmp_path, *args, timeout=60):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin",
                                                "RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path),
                                                "RAY_TMPDIR": str(tmp_path / "ray-tmp"), "PYTHONPATH": PYTHONPATH})
    return proc, time.monotonic() - t0


def assert_nothing_started(tmp_path):
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert not (tmp_path / "mlartifacts").exists() and not (tmp_path / "ray-tmp").exists()
    imported = json.loads((tmp_path / "imported.json").read_text())
    assert not any(imported.values()), imported


@pytest.mark.parametrize("args,key,allowed", [
    (("+sweep=smoke", "page_size=0,16"), "page_size=0", "an integer in [1, 4096]"),
    (("+sweep=smoke", "drafter=draft_model"), "drafter.draft_model_path=None", "tiny-draft"),
    (("page_size=0",), "page_size=0", "an integer in [1, 4096]"),  # a single run: the same checks
    (("context_len=65536",), "context_len=65536", "max_context_len 8192"),  # a single run above the max (smollm2-135m)
    (("+sweep=smoke", r"metrics.log_patterns=['commit=(?P<c>\d+)','commit=\d+']"),
     r"metrics.log_patterns[1]='commit=\\d+'", "at least one named group"),
    (("engine=stub", "engine.stub.token_s=-1"), "engine.stub.token_s=-1.0", "a finite number in [0, 3600]"),
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
])
def test_unknown_option_is_hydras_error(tmp_path, args, needle):
    proc, elapsed = run_app(tmp_path, *args)
    assert proc.returncode != 0 and needle in proc.stderr and elapsed < 30
    assert not (tmp_path / "mlflow.db").exists()


def test_schedule_is_not_a_config_group(tmp_path):
    # schedules live in orchestrator/schedules/, outside Hydra's root: never composed as a run config
    proc, elapsed = run_app(tmp_path, "+schedule=nightly", "hydra.launcher.dry_run=true")
    groups = ", ".join(sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name[0] not in "_."
                              and p.name != "hydra"))
    assert_one_clear_error(proc, f"schedule='nightly': allowed a config group ({groups}); schedule is none",
                           "specsweep-schedule fire|run")
    assert elapsed < 30
    assert_nothing_started(tmp_path)


def test_dry_run_plans_longctx(tmp_path):
    proc, _ = run_app(tmp_path, "+sweep=longctx", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert out.count("dropped 24 of 48 grid points") == 1
    assert "plan: 24 run(s) on 4 server(s), 24 dropped" in out
    assert_nothing_started(tmp_path)


SGLANG = ("engine=sglang", "model=qwen3-8b", "attention=triton")


def assert_one_clear_error(proc, *needles):
    """Exit 1, the message, and no trace nor a hint of one (Hydra's "Set the environment variable
    HYDRA_FULL_ERROR=1 ..." and "Error executing job ..." lines)."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert all(n in proc.stderr for n in needles), proc.stderr
    for noise in ("Traceback", "HYDRA_FULL_ERROR", "Error executing job"):
        assert noise not in proc.stderr + proc.stdout, proc.stderr


@pytest.mark.parametrize("args,key,closest", [
    (("engine=stub", "engine.stub.tokn_s=0.01"), "engine.stub.tokn_s='0.01'", "engine.stub.token_s"),
    # `+` once turned this into a raw TypeError; with another engine it was silently ignored
    (("engine=stub", "+engine.stub.tokn_s=0.01"), "engine.stub.tokn_s='0.01'", "engine.stub.token_s"),
    (("+engine.sglang.mem_frac=0.5",), "engine.sglang.mem_frac='0.5'", "engine.sglang.mem_fraction_static"),
    (("+sweep=smoke", "contxt_len=2048"), "contxt_len='2048'", "context_len"),
    (("+sweep=smoke", "model.n_layers=3"), "model.n_layers='3'", "model.num_layers"),
    (("token_s=0.01",), "token_s='0.01'", "engine.stub.token_s"),
])
def test_typo_key_names_the_closest_valid_keys(tmp_path, args, key, closest):
    proc, elapsed = run_app(tmp_path, *args)
    assert_one_clear_error(proc, key, f"did you mean {closest}")
    assert "To append to your config use" not in proc.stderr and elapsed < 30
    assert_nothing_started(tmp_path)


def test_new_keys_under_a_dict_keep_hydras_behaviour(tmp_path):
    proc, _ = run_app(tmp_path, "engine.env.HF_HOME=/data/hf", "hydra.launcher.dry_run=true")
    assert proc.returncode == 1 and "To append to your config use +engine.env.HF_HOME=***" in proc.stderr  # an env value: a secret
    proc, _ = run_app(tmp_path, "+engine.env.HF_HOME=/data/hf", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    assert_nothing_started(tmp_path)


def test_single_run_dry_run_only_plans(tmp_path):
    proc, elapsed = run_app(tmp_path, "context_len=2048", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "ctx=2k probe=predictable drafter=ngram page=16 attn=torch" in out and "run_hash=" in out
    assert "dry run: nothing started" in out and elapsed < 30
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize("body,name,why", [
    ("", "empty.txt", "it is empty"),
    ("\n  \n", "blank.txt", "only whitespace"),
    ('{"prompt": "x"}\n', "p.jsonl", 'line 1 has no string "text" field'),
    ('{"text": ""}\n\n{"text": " "}\n', "p.jsonl", 'no line has a non-blank "text"'),
    ('{"text": "ok"}\nnot json\n', "p.jsonl", "line 2 is not JSON"),
])
def test_probe_file_without_text_fails_validation(tmp_path, body, name, why):
    (tmp_path / name).write_text(body)
    proc, _ = run_app(tmp_path, "probe=file", f"probe.path={name}")
    assert_one_clear_error(proc, f"probe.path='{name}'", why)
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize("dry", [False, True])
def test_sweep_with_every_point_over_the_context_exits_nonzero(tmp_path, dry):
    args = ("+sweep=smoke", "context_len=32768,40000") + (("hydra.launcher.dry_run=true",) if dry else ())
    proc, _ = run_app(tmp_path, *args)
    assert_one_clear_error(proc, "context_len=[32768, 40000]", "max_context_len 32768", "all 8 point(s) exceed it",
                           "nothing would run")
    assert_nothing_started(tmp_path)


def test_sweep_with_some_points_over_the_context_still_runs_the_rest(tmp_path):
    proc, _ = run_app(tmp_path, "+sweep=smoke", "context_len=256,40000", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    assert "plan: 4 run(s) on 2 server(s), 4 dropped" in proc.stdout + proc.stderr


@pytest.mark.skipif(local_gpus()[0] >= 16, reason="this machine has 16 GPUs")
@pytest.mark.parametrize("dry", [False, True])
def test_local_gpu_server_needs_the_gpus_really_present(tmp_path, dry):
    found, _ = local_gpus()
    args = (*SGLANG, "tp_size=16") + (("hydra.launcher.dry_run=true",) if dry else ())
    proc, elapsed = run_app(tmp_path, *args)
    assert_one_clear_error(proc, "tp_size=16 needs 16 GPU(s)", f"this machine has {found}", "allowed with cluster=local")
    assert elapsed < 30
    assert_nothing_started(tmp_path)


@pytest.mark.skipif(local_gpus()[0] > 0, reason="this machine has a GPU")
def test_reference_engine_on_cuda_needs_a_gpu_here(tmp_path):
    proc, _ = run_app(tmp_path, "engine.device=cuda")
    assert_one_clear_error(proc, "tp_size=1 needs 1 GPU(s), this machine has 0", "engine.device=cpu or engine=stub")
    assert_nothing_started(tmp_path)


def test_stub_engine_simulates_gpus_with_rays_logical_ones(tmp_path):
    proc, _ = run_app(tmp_path, "engine=stub", "engine.device=cuda", "tp_size=16", "drafter=ngram",
                      "attention=triton", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr


def test_dry_run_on_a_declared_ray_cluster(tmp_path):
    """cluster=ray in a dry run: checked against what cluster=ray declares (gpus_per_node: 8), no Ray contacted."""
    proc, _ = run_app(tmp_path, "+sweep=smoke", *SGLANG, "cluster=ray", "tp_size=16", "hydra.launcher.dry_run=true")
    assert_one_clear_error(proc, "tp_size=16", "cluster.gpus_per_node=8", "allowed: tp_size / nnodes <= 8")
    assert_nothing_started(tmp_path)
    proc, _ = run_app(tmp_path, "+sweep=smoke", *SGLANG, "cluster=ray", "tp_size=16", "nnodes=2",
                      "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize("dry", [False, True])
def test_local_multi_node_server_cannot_fit_one_machine(tmp_path, dry):
    args = ("engine=stub", "tp_size=2", "nnodes=2") + (("hydra.launcher.dry_run=true",) if dry else ())
    proc, _ = run_app(tmp_path, *args)
    assert_one_clear_error(proc, "cluster=local is this one machine", "allowed: nnodes=1")
    assert_nothing_started(tmp_path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_tracking_server_fails_in_one_line_before_ray(tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    proc, elapsed = run_app(tmp_path, "tracking=server", f"tracking.uri={uri}")
    assert_one_clear_error(proc, f"tracking.uri='{uri}' cannot be reached", "Connection refused")
    assert elapsed < 30
    assert_nothing_started(tmp_path)


def test_silent_tracking_server_fails_within_the_budget(tmp_path):
    """A server that accepts connections and never answers (the case that once took 256 s)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        proc, elapsed = run_app(tmp_path, "+sweep=smoke", "tracking=server", f"tracking.uri={uri}")
    assert_one_clear_error(proc, f"tracking.uri='{uri}' cannot be reached")
    assert "10 s" in proc.stderr or "timed out" in proc.stderr
    assert 10 <= elapsed < 30
    assert_nothing_started(tmp_path)


def test_missing_sqlite_folder_fails_before_ray(tmp_path):
    proc, _ = run_app(tmp_path, "tracking.uri=sqlite:///no/such/dir/mlflow.db")
    assert_one_clear_error(proc, "tracking.uri=", "does not exist")
    assert_nothing_started(tmp_path)


def test_refused_sweep_leaves_no_hydra_record(tmp_path):
    """Hydra's sweeper writes multirun/<date>/<time>/multirun.yaml before the launcher runs: a refused sweep
    removes it (and the folders it made); another sweep's record stays."""
    proc, _ = run_app(tmp_path, "+sweep=smoke", "page_size=0")
    assert proc.returncode == 1 and not (tmp_path / "multirun").exists()
    other = tmp_path / "multirun" / "2026-01-01" / "00-00-00" / "multirun.yaml"
    other.parent.mkdir(parents=True)
    other.write_text("kept")
    proc, _ = run_app(tmp_path, "+sweep=smoke", "tracking=server", f"tracking.uri=http://127.0.0.1:{_closed_port()}")
    assert proc.returncode == 1 and "cannot be reached" in proc.stderr
    assert [p.relative_to(tmp_path).as_posix() for p in sorted((tmp_path / "multirun").rglob("*"))] == [
        "multirun/2026-01-01", "multirun/2026-01-01/00-00-00", "multirun/2026-01-01/00-00-00/multirun.yaml"]


@pytest.mark.parametrize("sweep", [(), ("+sweep=smoke",)], ids=["single", "sweep"])
def test_an_override_hydra_cannot_apply_is_a_problem_naming_it(tmp_path, sweep):
    """OmegaConf's AssertionError under a null parent, raised while Hydra composes: one problem, exit 1."""
    proc, _ = run_app(tmp_path, *sweep, "+cluster.runtime_env.bogus_field=1", "hydra.launcher.dry_run=true")
    assert_one_clear_error(proc, "cluster.runtime_env.bogus_field='1': allowed an override Hydra can apply",
                           "Unexpected type for root: NoneType", "cluster.runtime_env is null here")
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize("args,needle", [
    (("probe=file", "probe.path=/no/such/file"), "probe.path='/no/such/file': allowed an existing regular file"),
    (("+sweep=smoke", "page_size=0"), "page_size=0: allowed"),
    (("+sweep=smoke", "attention=bogus"), "Could not find 'attention/bogus'"),  # Hydra's own refusal
], ids=["single-run", "sweep", "hydra"])
def test_a_refusal_is_one_message_without_a_hint_of_a_trace(tmp_path, args, needle):
    proc, _ = run_app(tmp_path, *args)
    assert_one_clear_error(proc, needle)


# Runs the app as the console script does, with a KeyboardInterrupt raised where SIGINT would land in a phase:
# while the command line imports (the first `import hydra`), or while the sweep is planned.
INTERRUPT = """
import builtins, sys
phase = sys.argv.pop(1)
if phase == "importing":
    real = builtins.__import__
    def interrupted_import(name, *args, **kwargs):
        if name == "hydra":
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)
    builtins.__import__ = interrupted_import
from orchestrator.__main__ import main
if phase == "planning":
    import orchestrator.config.plan as plan
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    plan.plan_sweep = interrupted
    import orchestrator.session.launcher as launcher
    launcher.plan_sweep = interrupted
sys.argv = ["specsweep"] + sys.argv[1:]
main()
"""


@pytest.mark.parametrize("phase", ["importing", "planning"])
def test_ctrl_c_in_every_phase_is_one_line_and_sigint(tmp_path, phase):
    proc = subprocess.run([sys.executable, "-c", INTERRUPT, phase, "+sweep=smoke", "engine=stub",
                           "hydra.launcher.dry_run=true"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == -2, proc.stderr  # by SIGINT, as a shell expects of Ctrl-C (130 there)
    assert proc.stderr.strip().splitlines()[-1].startswith("specsweep: interrupted (Ctrl-C)"), proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
