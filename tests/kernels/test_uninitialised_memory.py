"""The kernels' conftest makes uninitialised memory NaN (floats) or the type's maximum (integers) in every test here,
and only warns where an op has no deterministic kernel."""

from __future__ import annotations

import torch

from specsweep_kernels.verify_attention import allocate_workspace


def test_uninitialised_allocations_are_poisoned():
    assert torch.empty(5).isnan().all() and torch.empty_like(torch.zeros(2, 3)).isnan().all()
    assert (torch.empty(4, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()


def test_a_fresh_workspace_holds_nan_partials():
    """So a merge that reads a split slot no attention program wrote gives NaN, whichever machine runs the test."""
    ws = allocate_workspace(max_batch=2, max_tokens=3, num_q_heads=4, v_head_dim=8, device="cpu")
    floats = [t for t in vars(ws).values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert floats and all(t.isnan().all() for t in floats if t.numel())
