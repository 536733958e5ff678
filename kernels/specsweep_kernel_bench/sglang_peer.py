"""SGLang's own Triton attention kernels as the benchmark's peer columns, taken from an SGLang wheel file without
installing SGLang (its dependency pins clash with ours) and without keeping any of its code in this repository.

    extend_fwd, decode_fwd = load_peer_kernels(".whl/sglang-0.5.10.post1-py3-none-any.whl")

Why 0.5.10.post1: it is a pure-Python wheel whose `sglang/srt/layers/attention/triton_ops/*.py` import, from the
rest of SGLang, only `sglang.srt.utils.is_hip` and `is_cuda`; later wheels moved the kernels and import much more of
SGLang. So the loader unpacks only that folder into a temporary directory (removed at exit), gives it empty package
`__init__`s and a two-function `sglang.srt.utils` answering those calls, and imports
`decode_attention.decode_attention_fwd` and `extend_attention.extend_attention_fwd` from there. The wheel is fetched
where pip has a network (docs/kernels.md, "Benchmark"):

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux2014_x86_64 -d .whl sglang==0.5.10.post1

SGLang 0.5.23's split-KV verify kernels (chains only, topk 1; dispatched on AMD gfx95 only in production) come from
two files of its source, `sglang/kernels/ops/attention/verify_mla.py` (`verify_shared_kv_fwd`: grouped heads over
one shared KV head, MLA) and `verify_splitkv.py` (`verify_splitkv_fwd`: GQA); they import from SGLang only
`sglang.srt.utils.is_hip` and each other. `load_verify_peers(folder)` takes a folder holding those two files (the
installed package's `sglang/kernels/ops/attention`, or a copy carried to a GPU machine) and imports them the same
way, under a temporary `sglang` of their own:

    verify_shared_kv_fwd, verify_splitkv_fwd = load_verify_peers(".../sglang/kernels/ops/attention")

Both take `extend_attention_fwd`'s arguments and return False (writing nothing) for a shape they do not serve.

Their scratch (split partials and LSEs) is `torch.empty`, made on the first call of a shape and kept in a module
cache (verify_splitkv.py:461-470, :626-648; verify_mla.py:419-428, :602-631). The GQA kernel's combine reads every
split's partial and weights a split that did not run (a sequence shorter than the split count asks for) by
exp(-inf) = 0 (verify_splitkv.py:265-277, :330-357), so a NaN or Inf left in that memory by an earlier tensor gives
0 x NaN = NaN rows; the MLA kernel's combine reads only the splits that ran (verify_mla.py:280-314).
`zero_verify_scratch(peers)` fills every cached scratch with zeros, so a bench column measures the kernel's
arithmetic rather than what its memory held (tests/kernels/specsweep_kernel_bench/test_sglang_peer.py shows both).
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

TRITON_OPS = "sglang/srt/layers/attention/triton_ops"
VERIFY_OPS = "sglang/kernels/ops/attention"  # SGLang 0.5.23: verify_mla.py, verify_splitkv.py
VERIFY_FILES = ("verify_mla.py", "verify_splitkv.py")
_UTILS = ("import torch\n\n\ndef is_hip():\n    return False\n\n\n"
          "def is_cuda():\n    return torch.cuda.is_available()\n")


def unpack_triton_ops(wheel: str | Path, into: Path) -> Path:
    """Extract the wheel's triton_ops/*.py under `into`, with the packages around them; returns `into`."""
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.startswith(TRITON_OPS + "/") and n.endswith(".py")]
        if not members:
            raise ValueError(f"{wheel}: no {TRITON_OPS}/*.py inside; the peer column needs sglang 0.5.10.post1's wheel")
        for name in members:
            archive.extract(name, into)
    package = into
    for part in TRITON_OPS.split("/"):
        package = package / part
        package.mkdir(exist_ok=True)
        (package / "__init__.py").touch()
    _write_utils(into)
    return into


def _write_utils(into: Path) -> None:
    """The two-function `sglang.srt.utils` the kernels import (is_hip, is_cuda), with its parent packages."""
    package = into
    for part in ("sglang", "srt"):
        package = package / part
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    (package / "utils").mkdir(exist_ok=True)
    (package / "utils" / "__init__.py").write_text(_UTILS)


def copy_verify_ops(folder: str | Path, into: Path) -> Path:
    """Copy SGLang 0.5.23's verify_mla.py and verify_splitkv.py from `folder` to into/sglang/kernels/ops/attention,
    with the packages around them and the utils stub; returns `into`."""
    folder = Path(folder)
    missing = [name for name in VERIFY_FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder}: {', '.join(missing)} missing; the verify peer columns need SGLang 0.5.23's "
                         f"{VERIFY_OPS}/{{{','.join(VERIFY_FILES)}}}")
    package = into
    for part in VERIFY_OPS.split("/"):
        package = package / part
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    for name in VERIFY_FILES:
        shutil.copyfile(folder / name, package / name)
    _write_utils(into)
    return into


def _put_first_on_path(prefix: str, populate: Callable[[Path], Path]) -> None:
    """A temporary directory `prefix...` (removed at exit) filled by `populate(root) -> the folder to import from`, first on
    sys.path. Refused where an `sglang` is already imported: it would shadow the copy."""
    if "sglang" in sys.modules:
        raise RuntimeError("sglang is already imported in this process; the peer kernels need a clean import")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    sys.path.insert(0, str(populate(root)))


def load_verify_peers(folder: str | Path) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(verify_shared_kv_fwd, verify_splitkv_fwd) of SGLang 0.5.23, from the folder holding its verify_mla.py and
    verify_splitkv.py. Refused where an `sglang` is already imported (it would shadow the copy)."""
    _put_first_on_path("specsweep-sglang-verify-", lambda root: copy_verify_ops(folder, root))
    from sglang.kernels.ops.attention.verify_mla import verify_shared_kv_fwd
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    return verify_shared_kv_fwd, verify_splitkv_fwd


def zero_verify_scratch(peers: tuple[Callable[..., Any], Callable[..., Any]]) -> int:
    """Zero the split scratch of every shape the two verify peers have run (their modules' caches); returns how
    many scratch sets were zeroed."""
    zeroed = 0
    for fn, cache in zip(peers, ("_VMLA_CACHE", "_VK_CACHE")):
        for runner in getattr(sys.modules[fn.__module__], cache).values():
            runner.att_out.zero_()
            runner.att_lse.zero_()
            zeroed += 1
    return zeroed


def load_peer_kernels(wheel: str | Path) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(extend_attention_fwd, decode_attention_fwd) of the wheel. An `sglang` already imported in this process
    would shadow the unpacked one, so that is refused."""
    _put_first_on_path("specsweep-sglang-peer-", lambda root: unpack_triton_ops(wheel, root))
    from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd
    from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd

    return extend_attention_fwd, decode_attention_fwd
