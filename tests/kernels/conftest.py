"""Kernel tests read no memory by luck: `torch.empty` (and the other uninitialised allocations) is filled with NaN in
every test here, so a kernel that reads a slot nobody wrote (ours, or SGLang's as a peer) fails the same way on every
machine instead of when the allocator happens to hand back NaN bits. That is what torch's deterministic mode does to
uninitialised memory (`torch.utils.deterministic.fill_uninitialized_memory`, on by default with it); the mode is
restored after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def uninitialised_memory_is_nan() -> Iterator[None]:
    was_on, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)  # fill, but an op with no deterministic kernel only warns
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)
