"""specsweep_kernel_bench.sglang_peer: SGLang's Triton kernels for the bench's peer column, unpacked from a wheel file.

The wheel here is built from the SGLang 0.5.10 that `make setup` unpacks into .venv/sglang-0.5.10 (its triton_ops
import the same two helpers as 0.5.10.post1's); the import runs in a fresh interpreter, where no sglang is loaded."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specsweep_kernel_bench.sglang_peer import TRITON_OPS, VERIFY_FILES, copy_verify_ops, unpack_triton_ops
from tests.workers.sglang.source import sglang_root

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
    code = ("import sys; from specsweep_kernel_bench.sglang_peer import load_peer_kernels; "
            f"e, d = load_peer_kernels({str(wheel)!r}); "
            "print(e.__name__, d.__name__, sys.modules[d.__module__].__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "kernels"),
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
    root = sglang_root()
    if root is None:
        return None
    folder = root / "kernels" / "ops" / "attention"
    return folder if all((folder / name).is_file() for name in VERIFY_FILES) else None


_PEER_SCRIPT = """
import sys, torch
torch.use_deterministic_algorithms(True)  # torch.empty fills floats with NaN: the scratch starts as NaN, not as luck
from specsweep_kernel_bench.sglang_peer import load_verify_peers, zero_verify_scratch
from specsweep_kernel_bench.bench_workload import _peer_call
from specsweep_kernel_bench.bench import _rel_err, bench_layout
from specsweep_kernels.problems import make_problem
from specsweep_kernels.reference import verify_attention_reference
peers = load_verify_peers(sys.argv[1])
lay = bench_layout(sys.argv[2])
# 70 tokens over 4 splits of 32 leave split 3 unrun; 256 tokens run all 4 (verify_splitkv.py:95-121, :178-183)
p = make_problem(layout=lay, prefix_lens=[70, 256], num_tokens=3, page_size=1, dtype=torch.float32, device='cpu')
ref = verify_attention_reference(**p.attention_args(), **p.table_args(), v_head_dim=lay.v_head_dim)
out = p.new_out()
call = _peer_call(peers, p, out)
ran = call()
nan_rows = out.isnan().flatten(2).any(2).any(1).tolist()
err_long = _rel_err(out[1:], ref[1:])
zeroed = zero_verify_scratch(peers)
out.fill_(float('nan'))
call()
print(ran, *nan_rows, err_long, zeroed, _rel_err(out, ref), sys.modules[peers[1].__module__].__file__)
"""


def _run_peer(layout: str) -> list[str]:
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", _PEER_SCRIPT, str(_installed_verify_ops()), layout],
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{root}:{root / 'kernels'}",
                               "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[-7:]


@pytest.mark.skipif(_installed_verify_ops() is None, reason="needs SGLang 0.5.23's source (make setup installs it)")
def test_gqa_peer_leaks_an_unrun_splits_stale_scratch_and_matches_once_zeroed():
    """SGLang 0.5.23's GQA verify kernel (verify_splitkv_fwd), imported from a copy of its file and called as the
    bench calls it, over a NaN-filled scratch: the sequence with an unrun split comes out NaN (its combine weights
    that split's partial by 0, and 0 x NaN is NaN), the sequence whose splits all ran matches the reference; after
    zero_verify_scratch the whole batch matches. This is SGLang's behaviour, not ours: on a GPU the scratch holds
    whatever the caching allocator hands it."""
    ran, nan_short, nan_long, err_long, zeroed, err_all, where = _run_peer("gqa-small")
    assert ran == "True"
    assert (nan_short, nan_long) == ("True", "False")
    assert float(err_long) < 1e-4
    assert zeroed == "1" and float(err_all) < 1e-4
    assert "specsweep-sglang-verify-" in where and where.endswith("kernels/ops/attention/verify_splitkv.py")


@pytest.mark.skipif(_installed_verify_ops() is None, reason="needs SGLang 0.5.23's source (make setup installs it)")
def test_mla_peer_reads_only_the_splits_that_ran():
    """SGLang 0.5.23's MLA verify kernel (verify_shared_kv_fwd) over the same NaN-filled scratch matches the
    reference on both sequences before any zeroing: its combine loops over the active splits only
    (verify_mla.py:280-314)."""
    ran, nan_short, nan_long, err_long, zeroed, err_all, _ = _run_peer("mla:8")
    assert ran == "True"
    assert (nan_short, nan_long) == ("False", "False")
    # its split partials are stored in bf16 whatever the inputs (verify_mla.py:418-422): bf16-sized error on fp32
    assert float(err_long) < 1e-2 and float(err_all) < 1e-2
    assert zeroed == "1"


def test_a_folder_without_the_verify_files_is_refused(tmp_path):
    with pytest.raises(ValueError, match="verify_mla.py, verify_splitkv.py missing"):
        copy_verify_ops(tmp_path, tmp_path / "out")
