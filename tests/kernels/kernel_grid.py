"""Kernel test grids: every point on a GPU, a covering sample under Triton's CPU interpreter.

    grid(cases, ids, sample) -> [pytest.param, ...]
        cases: tuples of parameter values, ids: their test ids (unchanged, so measured costs still apply);
        sample(index) -> bool says which points run on CPU. The others stay collected and are skipped on CPU with
        the reason, and run when torch.cuda.is_available().

The interpreter runs a kernel's every program in Python: a point costs 0.5-3 s on CPU, against milliseconds
compiled. Each test's sample is chosen so that every value of every axis, and every pair of values of two axes
where the kernel branches on both, still runs on CPU (each test names its sample and why).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pytest
import torch

FULL_GRID = torch.cuda.is_available()
GPU_ONLY = pytest.mark.skipif(not FULL_GRID, reason="full kernel grid on a GPU only; the CPU interpreter runs the "
                              "covering sample (tests/kernels/kernel_grid.py)")


def grid(cases: Sequence[tuple], ids: Sequence[str], sample: Callable[[int], bool]) -> list:
    if len(cases) != len(ids):
        raise ValueError(f"grid: {len(cases)} cases but {len(ids)} ids")
    return [pytest.param(*case, id=i, marks=() if sample(n) else GPU_ONLY) for n, (case, i) in enumerate(zip(cases, ids))]


def latin_square(sizes: tuple[int, int, int]) -> Callable[[tuple[int, int, int]], bool]:
    """For three axes of n values each: the n*n points (a, b, (a + b) mod n), which hold every pair of values of
    any two axes exactly once."""
    n = sizes[0]
    if set(sizes) != {n}:
        raise ValueError(f"latin_square needs three axes of equal size, got {sizes}")
    return lambda idx: idx[2] == (idx[0] + idx[1]) % n
