"""The README as a newcomer's guide: its sections, its pictures of the MLflow UI (from `make screenshots`),
the measurement history kept out of it, and the store's lock file kept out of git."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GUIDE_SECTIONS = ("## The two commands", "## Reading the result", "### In the MLflow UI", "## A tour",
                  "## Troubleshooting", "## Layout", "## Running on a cluster")


def test_readme_keeps_the_guide_and_links_the_measurement_history():
    for heading in GUIDE_SECTIONS:
        assert f"\n{heading}" in README, heading
    assert "docs/measurements/benchmarks.md" in README
    history = (ROOT / "docs/measurements/benchmarks.md").read_text()
    assert len(re.findall(r"20\d\d-\d\d-\d\d", history)) >= 5  # dated entries
    assert len(README.splitlines()) < 300  # a guide, not a journal (235 lines on 2026-12-03)


def test_kernels_doc_is_the_reference_and_its_journal_lives_in_dated_measurement_folders():
    kernels = (ROOT / "docs/kernels.md").read_text()
    assert len(kernels.splitlines()) < 800  # 1,427 lines with the journal; 604 on 2026-12-03
    assert (ROOT / "docs/measurements/2026-12-01-h200/journal.md").is_file() and "docs/measurements/" in kernels


def test_readme_pictures_are_committed_and_are_what_make_screenshots_writes():
    from tools.screenshots import PICTURES

    shown = re.findall(r"!\[[^\]]+\]\((docs/img/[^)]+\.png)\)", README)
    assert sorted(Path(p).name for p in shown) == sorted(PICTURES)
    for path in shown:
        data = (ROOT / path).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path
    assert "make screenshots" in README and "\nscreenshots:" in (ROOT / "Makefile").read_text()


def test_the_store_lock_file_is_ignored_by_git():
    assert "mlflow.db.lock" in (ROOT / ".gitignore").read_text().split()
