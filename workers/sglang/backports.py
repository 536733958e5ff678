"""Fixes SGLang made after 0.5.18, applied to an installed SGLang 0.5.18 (`make setup-sglang`), never vendored.

SGLang's source is never changed here except to backport a fix SGLang itself released later. Each backport names
the file it edits (relative to the installed `sglang` package), the exact lines of the 0.5.18 wheel it expects,
what it puts there, and where the fix lives upstream (the 0.5.23 wheel's file:line). `apply_backports` refuses a
file that is neither 0.5.18's nor 0.5.18's with the backport (another version, or a local edit) instead of editing
it; tests/workers/sglang/test_backports.py checks that an installed file equals the wheel's plus exactly the change.
Drop this module when the CPU pin moves to a release that has both fixes.

Without them SGLang 0.5.18 serves plain requests on CPU but not speculation:

- `ngram_corpus/result.h` uses `size_t` without `#include <cstddef>`: GCC 12 stops the JIT build of the n-gram
  corpus module ("'size_t' has not been declared", then "Failed to build JIT module sgl_kernel_jit_ngram_corpus"),
  so `--speculative-algorithm NGRAM` cannot start.
- `intel_amx_backend.py` re-reads `seq_lens = forward_batch.seq_lens` in `forward_extend` and `forward_decode`,
  after `init_forward_metadata` has set it with the draft tokens added: target-verify then attends without the
  drafts ("RuntimeError: prefix len < 0!" at warm-up; with warm-up skipped, garbage text under healthy-looking
  spec counters). 0.5.23 deleted both lines.
"""
from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

SGLANG_CPU_VERSION = "0.5.18"


@dataclass(frozen=True)
class Backport:
    path: str  # relative to the installed `sglang` package directory
    before: str  # the exact 0.5.18 text the fix replaces (unique in the file)
    after: str  # what SGLang's later release has there
    upstream: str  # the released file:line where SGLang's own fix lives
    why: str

    def patched(self, original: str) -> str:
        if original.count(self.before) != 1:
            raise ValueError(f"{self.path}: the 0.5.18 text to replace occurs {original.count(self.before)} times")
        return original.replace(self.before, self.after)


BACKPORTS: tuple[Backport, ...] = (
    Backport(
        path="kernels/jit/csrc/ngram_corpus/result.h",
        before="#pragma once\n\n#include <cstdint>\n",
        after="#pragma once\n\n#include <cstddef>\n#include <cstdint>\n",
        upstream="sglang 0.5.23 kernels/jit/csrc/ngram_corpus/result.h:3",
        why="size_t without <cstddef>: the n-gram corpus JIT module fails to build with GCC 12",
    ),
    Backport(
        path="srt/layers/attention/intel_amx_backend.py",
        before=("        _, max_extend_len = self.forward_metadata\n"
                "        seq_lens = forward_batch.seq_lens\n"
                "        if seq_lens.dtype != torch.int64:\n"),
        after=("        _, max_extend_len = self.forward_metadata\n"
               "        if seq_lens.dtype != torch.int64:\n"),
        upstream="sglang 0.5.23 srt/layers/attention/intel_amx_backend.py:272-273",
        why="forward_extend drops the draft tokens from seq_lens (target verify)",
    ),
    Backport(
        path="srt/layers/attention/intel_amx_backend.py",
        before=("        q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)\n"
                "        seq_lens = forward_batch.seq_lens\n"
                "        if seq_lens.dtype != torch.int64:\n"),
        after=("        q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)\n"
               "        if seq_lens.dtype != torch.int64:\n"),
        upstream="sglang 0.5.23 srt/layers/attention/intel_amx_backend.py:333-334",
        why="forward_decode drops the draft-decode seq_lens set just above it",
    ),
)


def files() -> dict[str, list[Backport]]:
    out: dict[str, list[Backport]] = {}
    for b in BACKPORTS:
        out.setdefault(b.path, []).append(b)
    return out


def expected_text(original: str, path: str) -> str:
    """A 0.5.18 file's text with every backport to it applied."""
    for b in files()[path]:
        original = b.patched(original)
    return original


def wheel_text(wheel: Path, path: str) -> str:
    """The file as the SGLang wheel ships it."""
    with zipfile.ZipFile(wheel) as z:
        return z.read(f"sglang/{path}").decode()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class BackportError(RuntimeError):
    pass


def apply_backports(package_dir: Path, wheel: Path) -> list[str]:
    """Edit the installed files in place (idempotent). Returns one line per file: applied / already applied.
    Raises BackportError, touching nothing, when a file is neither the wheel's nor the wheel's with the fixes."""
    plan: list[tuple[Path, str, str]] = []
    for path in files():
        original = wheel_text(wheel, path)
        want = expected_text(original, path)
        target = package_dir / path
        have = target.read_text()
        if have == want:
            plan.append((target, "", f"{path}: already backported"))
        elif have == original:
            plan.append((target, want, f"{path}: backported ({', '.join(b.upstream for b in files()[path])})"))
        else:
            raise BackportError(f"{target} is neither SGLang {SGLANG_CPU_VERSION}'s file (sha256 {digest(original)}) "
                                f"nor it with the backport (sha256 {digest(want)}), but sha256 {digest(have)}: "
                                "not edited. Reinstall SGLang (make setup-sglang) or drop the backport.")
    for target, text, _ in plan:
        if text:
            target.write_text(text)
    return [line for _, _, line in plan]
