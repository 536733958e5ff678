"""workers/sglang/backports.py's mechanism on a wheel built here from each backport's own 0.5.18 text: applied once,
idempotent, and a file that is neither the wheel's nor the backported one is refused untouched."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from workers.sglang.backports import BACKPORTS, BackportError, apply_backports, expected_text, files


def _wheel_and_install(tmp_path: Path) -> tuple[Path, Path]:
    wheel, package = tmp_path / "sglang-0.5.18-py3-none-any.whl", tmp_path / "site" / "sglang"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, backports in files().items():
            text = "# head\n" + "".join(f"{b.before}# between\n" for b in backports) + "# tail\n"
            z.writestr(f"sglang/{path}", text)
            (package / path).parent.mkdir(parents=True, exist_ok=True)
            (package / path).write_text(text)
    return wheel, package


def test_each_backport_names_its_upstream_fix_and_changes_its_text():
    for b in BACKPORTS:
        assert b.upstream.startswith("sglang 0.5.23 ") and ":" in b.upstream
        assert b.before != b.after and b.patched(b.before) == b.after


def test_apply_is_exact_and_idempotent(tmp_path):
    wheel, package = _wheel_and_install(tmp_path)
    first = apply_backports(package, wheel)
    assert all("backported (" in line for line in first)
    for path in files():
        with zipfile.ZipFile(wheel) as z:
            original = z.read(f"sglang/{path}").decode()
        assert (package / path).read_text() == expected_text(original, path)
    assert all(line.endswith("already backported") for line in apply_backports(package, wheel))


def test_a_file_of_another_version_is_refused_untouched(tmp_path):
    wheel, package = _wheel_and_install(tmp_path)
    path = next(iter(files()))
    (package / path).write_text("a local edit\n")
    others = {p: (package / p).read_text() for p in files()}
    with pytest.raises(BackportError, match="neither SGLang 0.5.18's file"):
        apply_backports(package, wheel)
    assert {p: (package / p).read_text() for p in files()} == others
