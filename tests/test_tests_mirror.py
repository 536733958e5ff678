"""tests/ mirrors the packages: each test folder under tests/orchestrator/, tests/workers/ and tests/kernels/ is a
folder of the package (an engine's tests in tests/workers/<engine>/; the benchmarks' in
tests/kernels/specsweep_kernel_bench/, while tests/kernels/ itself holds those of specsweep_kernels, the folder's
product package), but for the few listed with their reason; and no test module of tests/workers/ names an engine in
its file name (it belongs in that engine's folder)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRRORED = ("orchestrator", "workers", "kernels")
NOT_A_PACKAGE_FOLDER = {
    "tests/workers/sglang_live": "the live-SGLang tier (make test-sglang), kept apart from the CPU-only tests",
}
TEST_DATA = "fixtures"  # a test folder's data (captured responses, records), beside the tests that read it
ENGINES = sorted(p.name for p in (ROOT / "workers").iterdir() if p.is_dir() and (p / "adapter.py").is_file())


def test_every_test_folder_mirrors_a_package_folder():
    folders = [d for top in MIRRORED for d in (ROOT / "tests" / top).rglob("*")
               if d.is_dir() and d.name != "__pycache__"]
    stray = [d.relative_to(ROOT).as_posix() for d in folders
             if d.relative_to(ROOT).as_posix() not in NOT_A_PACKAGE_FOLDER and TEST_DATA not in d.parts
             and not (ROOT / d.relative_to(ROOT / "tests")).is_dir()]
    assert not stray, f"test folders with no package folder of that name: {stray}"


def test_engine_tests_sit_in_their_engines_folder():
    assert ENGINES == ["reference", "sglang", "stub"]
    flat = [p.name for p in (ROOT / "tests" / "workers").glob("test_*.py")
            if any(p.name.startswith((f"test_{e}_", "test_ref_")) for e in ENGINES)]
    assert not flat, f"move these into tests/workers/<engine>/: {flat}"
    named = [p.relative_to(ROOT).as_posix() for e in ENGINES for p in (ROOT / "tests" / "workers" / e).glob("test_*.py")
             if p.name.startswith((f"test_{e}_", "test_ref_"))]
    assert not named, f"name these after the module they test, without the engine prefix: {named}"
