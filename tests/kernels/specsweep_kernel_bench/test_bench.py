"""specsweep_kernel_bench.bench on the CPU: what it checks before any work (the grid itself needs a GPU)."""
from __future__ import annotations

import pytest


def test_bench_flush_is_checked():
    """bench --flush: clean (a read of 256 MB before each timed run) or dirty (triton's do_bench zeroing); anything
    else is refused by name, before any work."""
    from specsweep_kernel_bench import bench

    with pytest.raises(ValueError, match="flush: 'cold' is not one of clean, dirty"):
        bench.set_flush("cold")
    assert bench._flush["mode"] == "clean"
    with pytest.raises(SystemExit) as exc:
        bench.main(["--flush", "cold"])
    assert exc.value.code == 2
