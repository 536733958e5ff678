"""The installed SGLang 0.5.18 equals its wheel plus exactly the backports of workers/sglang/backports.py."""
from __future__ import annotations

import subprocess
from pathlib import Path

from workers.sglang.backports import expected_text, files, wheel_text


def test_installed_files_are_the_wheel_plus_exactly_the_backports(manifest):
    wheel = Path(manifest["sglang_wheel"])
    site = subprocess.run([manifest["python"], "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))"],
                          text=True, capture_output=True, timeout=300).stdout.strip()
    for path in files():
        installed = (Path(site) / path).read_text()
        original = wheel_text(wheel, path)
        assert installed != original, f"{path}: not backported"
        assert installed == expected_text(original, path), f"{path}: differs from the wheel's plus the backport"
