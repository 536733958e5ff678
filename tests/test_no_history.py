"""No session, issue or tracker number in the code, the docs or the tests' prose: a reader of a clone cannot open
them. Dated history belongs in the measurement journal (docs/measurements/); elsewhere a reason is written as the
measurement itself (what was measured, where, when). The tests' data files (tier_costs.json, fixtures, recorded
manifests) are not prose and are not read.

A run or an item of the journal is named the same way: a link into docs/measurements/ may point at `runN-workload.md`
(the record's own name), but its text and the prose around it say what was measured and when, not "runN" or
"item N". Link targets and paths are left out before the run / item patterns are tried; a bare run token ("runN",
"RunsN") is only taken for history in Markdown, so in code only the history forms are looked for ("runN of ...",
"grid of runN", "(runN)", "item N's"), and a count ("run three prompts", "--runs", "runs four servers") is none."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a session, an issue, a tracker number, or a helper's name in the workplace that built it (helper, then h and a number)
HISTORY = re.compile(r"[Ss]essions? [0-9]+|[Ii]ssue #?[0-9]+|\(#[0-9]{2}\b|(?<![\w&/#-])#[0-9]{2,}\b|[Hh]elpers? h[0-9]+[a-z]*\b")
_RUN = r"(?:[Rr]uns?|[Ii]tems?)"
# in every file: a run / item number as a link's text, in bold or backticks, possessive, parenthesised, "runN of"
RUN_ITEM = re.compile(
    r"\[[^\]]*(?<![\w-])%(r)s ?[0-9]+[^\]]*\]\("              # [runN](...), [item N](...)
    r"|\*\*%(r)s ?[0-9]+\*\*|`%(r)s ?[0-9]+`"                  # **runN**, `runN`
    r"|\b%(r)s ?[0-9]+'s\b"                                      # runN's, Item N's
    r"|\(%(r)s ?[0-9]+(?:[–-][0-9]+)?[),;:]"                      # (runN), (item N), (runs N–M:
    r"|\b[Rr]uns?[0-9]+ of\b|\bof [Rr]uns?[0-9]+\b" % {"r": _RUN})  # runN of ..., grid of runN
# in Markdown only: a bare run token glued to its number (runN, RunsN, runsN–M), not a file name (runN-workload.md)
RUN_TOKEN = re.compile(r"(?<![\w/.-])[Rr]uns?[0-9]+\b(?![-./\w])")
TARGET = re.compile(r"\]\([^)\s]*\)|(?<![\w])(?:[\w.-]+/)+[\w.-]*")  # a link's target, a path
JOURNAL = "docs/measurements/"
TEST_DATA = ("tests/tier_costs.json", "tests/workers/reference/fixtures/", "tests/deploy/kuberay_crds/")


def _is_history(line: str, markdown: bool) -> bool:
    if HISTORY.search(line):
        return True
    prose = TARGET.sub("](", line)  # "[text](x/runN-tail.txt)" -> "[text](": the text stays, the target goes
    return bool(RUN_ITEM.search(prose) or (markdown and RUN_TOKEN.search(prose)))


def history_lines(path: Path, rel: str) -> list[str]:
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return []  # binary: images, archives, weights
    markdown = rel.endswith(".md")
    return [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if _is_history(line, markdown)]


def _files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return [f for f in out if not f.startswith((JOURNAL, *TEST_DATA)) and (ROOT / f).is_file()]


def test_the_checker_finds_tracker_numbers_and_not_other_numbers(tmp_path):
    f = tmp_path / "note.md"
    hash_ = "#"  # the sample is built, so this file does not spell what it looks for
    f.write_text(f"fixed in session {13}\nsee issue {31}\nas asked ({hash_}32)\nper {hash_}29 section 2\n"
                 "colour #ccc, page #1\n"
                 "the second session of a sweep, 16 issues a second, run 3 times, [section](#report-and-diagnosis)\n"
                 f"measured by {'helper'} h{17}p on the H200\n"  # 7: a helper's name
                 "the h200 helper tool, H100 80GB HBM3\n")
    assert [line.split(":")[1] for line in history_lines(f, "note.md")] == ["1", "2", "3", "4", "7"]


def test_the_checker_finds_run_and_item_numbers_in_prose_not_in_link_targets(tmp_path):
    r, i = "run", "item"  # built, as above
    hits = (f"see [{r}33](measurements/2026-12-01-h200/)\n"                    # 1: a link's text
            f"per [{i} 11](measurements/2026-12-01-h200/notes.md)\n"            # 2
            f"The table is **{r}14** (2026-12-03 13:19 UTC)\n"                  # 3: bold
            f"{r.title()}s1 and 2 are kept\n"                                   # 4: bare token, Markdown
            f"{r}14's rows were not affected\n"                                 # 5: possessive
            f"{i.title()} 19's rule was removed\n"                              # 6
            f"faster (the remainder A/B, {r}18)\n"                             # 7: bare token, Markdown
            f"the journal of {r}s6–18\n"                                        # 8
            f"1.4% faster ({r}18) on page 1\n")                                 # 9: parenthesised
    clean = ("see [the tail measurement, H200, 2026-12-01](measurements/2026-12-01-h200/run33-tail-pdl.txt)\n"
             "kept as [the first](measurements/2026-12-03-h200/run1-workload.md), `run1-workload.md`\n"
             "raw lines in docs/measurements/2026-12-01-h200/run15-23-tests.txt\n"
             "run 3 prompts, item 0 of the list, `--runs 8 64`, the sweep runs 4 servers, 12 runs, parent run\n"
             "symmetric-run 113 s, a dry run 2 times\n")
    f = tmp_path / "note.md"
    f.write_text(hits + clean)
    assert [line.split(":")[1] for line in history_lines(f, "note.md")] == [str(n) for n in range(1, 10)]
    code = tmp_path / "probe.py"
    code.write_text(f"x = 1  # {r}11: the engine's second request\n"                 # a name in the test, not history
                    f"# A/B (H200, 2026-12-03, {r}9 of docs/measurements/2026-12-03-h200/)\n"
                    f"# the batch-1 grid of {r}44 within -3.7% .. +0.9% ({r}10)\n"
                    f"for {r}2 in runs: pass\n")
    assert [line.split(":")[1] for line in history_lines(code, "probe.py")] == ["2", "3"]


def test_no_tracker_history_outside_the_journal():
    files = _files()
    assert "README.md" in files and "docs/reliability.md" in files
    found = [hit for rel in files for hit in history_lines(ROOT / rel, rel)]
    assert not found, ("write the reason (what was measured, where, when) instead of a session, issue, tracker, run "
                       "or item number (a link may point at the record's file, its text names the measurement):\n"
                       + "\n".join(found))
