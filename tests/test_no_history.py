"""No session, issue or tracker number in the code, the docs or the tests' prose: a reader of a clone cannot open
them. Dated history belongs in the measurement journal (docs/measurements/); elsewhere a reason is written as the
measurement itself (what was measured, where, when). The tests' data files (tier_costs.json, fixtures, recorded
manifests) are not prose and are not read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"[Ss]ession [0-9]+|[Ii]ssue #?[0-9]+|\(#[0-9]{2}\b|(?<![\w&/#-])#[0-9]{2,}\b")
JOURNAL = "docs/measurements/"
TEST_DATA = ("tests/tier_costs.json", "tests/workers/reference/fixtures/", "tests/deploy/kuberay_crds/")


def history_lines(path: Path, rel: str) -> list[str]:
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return []  # binary: images, archives, weights
    return [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def _files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return [f for f in out if not f.startswith((JOURNAL, *TEST_DATA)) and (ROOT / f).is_file()]


def test_the_checker_finds_tracker_numbers_and_not_other_numbers(tmp_path):
    f = tmp_path / "note.md"
    hash_ = "#"  # the sample is built, so this file does not spell what it looks for
    f.write_text(f"fixed in session {13}\nsee issue {31}\nas asked ({hash_}32)\nper {hash_}29 section 2\n"
                 "colour #ccc, page #1\n"
                 "the second session of a sweep, 16 issues a second, run 3 times, [section](#report-and-diagnosis)\n")
    assert [line.split(":")[1] for line in history_lines(f, "note.md")] == ["1", "2", "3", "4"]


def test_no_tracker_history_outside_the_journal():
    files = _files()
    assert "README.md" in files and "docs/reliability.md" in files
    found = [hit for rel in files for hit in history_lines(ROOT / rel, rel)]
    assert not found, ("write the reason (what was measured, where, when) instead of a session, issue or "
                       "tracker number:\n" + "\n".join(found))
