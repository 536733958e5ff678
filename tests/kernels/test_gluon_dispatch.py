"""Which Gluon MLA kernel runs which rows (sm_90; the rule itself is host code and runs here): a batch-1 page-1 call
whose last 64-row m-block would hold at most 32 real rows runs those rows on the narrow kernel beside the 64-row
one (the page sizes where that was measured faster)."""
from __future__ import annotations

import pytest

from specsweep_kernels import verify_mla_sm90 as gluon


@pytest.mark.parametrize("num_tokens,num_q_heads,batch,rest", [
    (9, 8, 1, 8),     # the original investigation's shape: 8 heads x a 9-node tree = 64 + 8 rows
    (12, 8, 1, 32),   # 64 + 32
    (17, 8, 1, 8),    # 2 x 64 + 8
    (5, 16, 1, 16),   # 64 + 16
    (9, 16, 1, 16),   # 2 x 64 + 16
    (1, 72, 1, 8),    # decode with 72 heads
    (13, 8, 1, 0),    # 64 + 40: past the narrow kernel's 32 rows, a padded m-block
    (8, 8, 1, 0),     # 64: no remainder
    (16, 8, 1, 0),    # 2 x 64
    (4, 8, 1, 0),     # 32: the narrow kernel alone runs the call
    (9, 8, 2, 0),     # batches run from a plan: every row on the 64-row kernel
])
def test_remainder_rows(num_tokens, num_q_heads, batch, rest, monkeypatch):
    monkeypatch.setattr(gluon, "REMAINDER_BESIDE", True)
    assert gluon.remainder_beside(num_tokens, num_q_heads, batch, 1) == rest


@pytest.mark.parametrize("page_size", [16, 64])
def test_no_remainder_where_it_was_not_measured_faster(page_size, monkeypatch):
    monkeypatch.setattr(gluon, "REMAINDER_BESIDE", True)
    assert gluon.remainder_beside(9, 8, 1, page_size) == 0


def test_remainder_off_pads_the_last_m_block(monkeypatch):
    monkeypatch.setattr(gluon, "REMAINDER_BESIDE", False)
    assert gluon.remainder_beside(9, 8, 1, 1) == 0


def test_the_remainder_fits_the_narrow_kernel(monkeypatch):
    """Whatever remainder_beside hands the narrow kernel fits its one m-block (BLOCK_R 16 or 32)."""
    monkeypatch.setattr(gluon, "REMAINDER_BESIDE", True)
    for heads in (1, 2, 4, 8, 16, 32, 64, 128):
        for tokens in range(1, 65):
            rest = gluon.remainder_beside(tokens, heads, 1, 1)
            assert 0 <= rest <= gluon.NARROW_MAX_ROWS
            assert rest == 0 or (tokens * heads > gluon.BLOCK_M and (tokens * heads - rest) % gluon.BLOCK_M == 0)
