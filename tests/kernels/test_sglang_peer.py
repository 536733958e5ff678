"""specsweep_kernels.sglang_peer: SGLang's Triton kernels for the bench's peer column, unpacked from a wheel file.

The wheel here is built from the SGLang 0.5.10 that `make setup` unpacks into .venv/sglang-0.5.10 (its triton_ops
import the same two helpers as 0.5.10.post1's); the import runs in a fresh interpreter, where no sglang is loaded."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specsweep_kernels.sglang_peer import TRITON_OPS, VERIFY_FILES, copy_verify_ops, unpack_triton_ops

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


def _installed_verify_ops() -> Path | None:
    """SGLang 0.5.23's kernels/ops/attention folder in this environment, found without importing sglang."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "kernels" / "ops" / "attention"
    return folder if all((folder / name).is_file() for name in VERIFY_FILES) else None


@pytest.mark.skipif(_installed_verify_ops() is None, reason="needs SGLang 0.5.23's source (make setup installs it)")
def test_verify_peers_load_from_the_two_files_and_match_the_reference():
    """The 0.5.23 split-KV verify kernels import from a copy of their two files alone, and called the way the bench
    calls them (extend_attention_fwd's arguments, a chain) they give the reference's output (GQA, interpreter)."""
    code = (
        "import sys, torch\n"
        "from specsweep_kernels.sglang_peer import load_verify_peers\n"
        "from specsweep_kernels.bench_workload import _peer_call\n"
        "from specsweep_kernels.bench import _rel_err, bench_layout\n"
        "from specsweep_kernels.problems import make_problem\n"
        "from specsweep_kernels.reference import verify_attention_reference\n"
        f"peers = load_verify_peers({str(_installed_verify_ops())!r})\n"
        "lay = bench_layout('gqa-small')\n"
        "p = make_problem(layout=lay, prefix_lens=[70, 130], num_tokens=3, page_size=1, dtype=torch.float32,"
        " device='cpu')\n"
        "ref = verify_attention_reference(**p.attention_args(), **p.table_args(), v_head_dim=lay.v_head_dim)\n"
        "out = p.new_out()\n"
        "ran = _peer_call(peers, p, out)()\n"
        "print(ran, _rel_err(out, ref), sys.modules[peers[1].__module__].__file__)\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{root}:{root / 'kernels'}",
                               "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran, err, where = proc.stdout.split()[-3:]
    assert ran == "True" and float(err) < 1e-4
    assert "specsweep-sglang-verify-" in where and where.endswith("kernels/ops/attention/verify_splitkv.py")


def test_a_folder_without_the_verify_files_is_refused(tmp_path):
    with pytest.raises(ValueError, match="verify_mla.py, verify_splitkv.py missing"):
        copy_verify_ops(tmp_path, tmp_path / "out")
