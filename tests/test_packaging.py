"""The wheel must not install a top-level `kernels` package: Hugging Face's `kernels` (an SGLang 0.5.23
dependency) owns that import name, and a wheel shipping kernels/__init__.py overwrote it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_specsweep_kernels_not_kernels(tmp_path):
    # build from a copy: setuptools writes build/ and *.egg-info into the source tree
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                             "mlflow.db*", "multirun", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(src)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("specsweep-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert "kernels" not in tops
    assert "specsweep_kernels/verify_attention.py" in names
    assert "specsweep_kernels/sglang_plugin.py" in names
    assert "specsweep_kernel_bench/bench.py" in names  # a kernel sweep's jobs time with it (workers/kernel_job.py)
    assert "orchestrator/schedules/nightly.yaml" in names and "conf/sweep/longctx.yaml" in names
    assert not any(n.startswith("conf/schedule") for n in names)  # out of Hydra's search path
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "specsweep_kernels.sglang_plugin:register" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_kernels_folder_is_not_a_package():
    # without __init__.py the folder is at most a namespace portion: a regular `kernels` package wins the import
    assert not (ROOT / "kernels" / "__init__.py").exists()


# --- console scripts ([project.scripts]) -----------------------------------------------------------

PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *filter(None, [os.environ.get("PYTHONPATH")])])


def console_scripts() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def run_entry_point(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Call `module:function` as pip's generated script does (`sys.exit(function())`), from another directory."""
    module, function = console_scripts()[name].split(":")
    code = f"import sys; from {module} import {function}; sys.argv[0] = {name!r}; sys.exit({function}())"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "COLUMNS": "200", "RAY_AUTH_MODE": "disabled",
                               "RAY_TMPDIR": str(cwd / "ray-tmp"), "PYTHONPATH": PYTHONPATH})


def test_console_scripts_declared():
    assert console_scripts() == {"specsweep": "orchestrator.__main__:main",
                                 "specsweep-schedule": "orchestrator.schedule:main",
                                 "specsweep-report": "orchestrator.report:main"}


def test_specsweep_help_and_dry_run(tmp_path):
    proc = run_entry_point("specsweep", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("specsweep is powered by Hydra")
    sweeps = sorted(f.stem for f in (ROOT / "conf" / "sweep").glob("*.yaml"))
    assert f"sweep: {', '.join(sweeps)}\n" in proc.stdout and "\nschedule:" not in proc.stdout
    proc = run_entry_point("specsweep", "context_len=2048", "hydra.launcher.dry_run=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr  # Rich logs to the console (stdout)
    assert "ctx=2k probe=predictable" in out and "dry run: nothing started" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no mlflow.db, no Ray temp dir, no Hydra outputs


def test_specsweep_typo_exits_1_naming_the_key(tmp_path):
    proc = run_entry_point("specsweep", "contxt_len=2048", cwd=tmp_path)
    assert proc.returncode == 1 and "did you mean context_len" in proc.stderr, proc.stderr


def test_specsweep_schedule_lists_the_shipped_schedules(tmp_path):
    proc = run_entry_point("specsweep-schedule", "list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "nightly-longctx" in proc.stdout and "+sweep=longctx" in proc.stdout
    proc = run_entry_point("specsweep-schedule", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: specsweep-schedule"), proc.stderr


def test_specsweep_report_help(tmp_path):
    # its work against a real MLflow store: tests/orchestrator/results/test_report.py
    proc = run_entry_point("specsweep-report", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: specsweep-report"), proc.stderr
    assert "sweep name (its latest parent run) or a parent run id" in proc.stdout


def test_installed_specsweep_script_runs_from_another_directory(tmp_path):
    script = Path(sys.executable).parent / "specsweep"
    if not script.exists():
        pytest.skip(f"{script} not installed (pip install -e . makes it)")
    proc = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == 0 and proc.stdout.startswith("specsweep is powered by Hydra"), proc.stderr


# --- test helpers stay out of runtime code ---------------------------------------------------------


def test_runtime_code_never_imports_the_dev_tools():
    # tools/ (tools.testing, the benchmarks) is for tests/ and developers only: never imported by product code,
    # and not in the wheel
    import ast

    offenders = []
    for path in sorted([*ROOT.glob("orchestrator/**/*.py"), *ROOT.glob("workers/**/*.py"),
                        *ROOT.glob("specsweep_common/*.py"), *ROOT.glob("kernels/specsweep_kernels/*.py"),
                        *ROOT.glob("kernels/specsweep_kernel_bench/*.py"),
                        *ROOT.glob("hydra_plugins/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{rel}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "tools"]
    assert offenders == []


def test_stub_engine_imports_nothing_of_the_orchestrator():
    code = "import sys, workers.stub.server; print(sorted(m for m in sys.modules if m.split('.')[0] == 'orchestrator'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
