"""The wheel must not install a top-level `kernels` package: Hugging Face's `kernels` (an SGLang 0.5.23
dependency) owns that import name, and a wheel shipping kernels/__init__.py overwrote it (issue 15)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
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
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "specsweep_kernels.sglang_plugin:register" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_kernels_folder_is_not_a_package():
    # without __init__.py the folder is at most a namespace portion: a regular `kernels` package wins the import
    assert not (ROOT / "kernels" / "__init__.py").exists()
