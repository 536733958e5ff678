"""specsweep_kernels.sglang_peer: SGLang's Triton kernels for the bench's peer column, unpacked from a wheel file.

The wheel here is built from the SGLang 0.5.10 that `make setup` unpacks into .venv/sglang-0.5.10 (its triton_ops
import the same two helpers as 0.5.10.post1's); the import runs in a fresh interpreter, where no sglang is loaded."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specsweep_kernels.sglang_peer import TRITON_OPS, unpack_triton_ops

SGLANG_0_5_10 = Path(sys.prefix) / "sglang-0.5.10"


def _wheel(tmp_path: Path, with_ops: bool = True) -> Path:
    wheel = tmp_path / "sglang-0.5.10-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/version.py", "__version__ = '0.5.10'\n")
        if with_ops:
            for path in sorted((SGLANG_0_5_10 / TRITON_OPS).glob("*.py")):
                z.write(path, f"{TRITON_OPS}/{path.name}")
    return wheel


@pytest.mark.skipif(not (SGLANG_0_5_10 / TRITON_OPS).is_dir(), reason="make setup unpacks SGLang 0.5.10 there")
def test_peer_kernels_import_from_the_wheel_alone(tmp_path):
    wheel = _wheel(tmp_path)
    code = ("import sys; from specsweep_kernels.sglang_peer import load_peer_kernels; "
            f"e, d = load_peer_kernels({str(wheel)!r}); "
            "print(e.__name__, d.__name__, sys.modules[d.__module__].__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "kernels"),
                               "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    extend, decode, where = proc.stdout.split()
    assert (extend, decode) == ("extend_attention_fwd", "decode_attention_fwd")
    assert "specsweep-sglang-peer-" in where and where.endswith("triton_ops/decode_attention.py")
    assert not Path(where).exists()  # the unpacked copy is removed when the process exits


def test_a_wheel_without_the_triton_ops_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no sglang/srt/layers/attention/triton_ops"):
        unpack_triton_ops(_wheel(tmp_path, with_ops=False), tmp_path / "out")
