"""specsweep_kernel_bench.bench_workload: its options are refused before any work, and its grid holds the original
investigation's shapes (the timing itself needs a GPU)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv,message", [
    (["--grid", "mla,gqq"], "--grid: gqq; allowed: mla, ragged, gqa"),
    (["--shard", "3/2"], "--shard '3/2'; allowed: I/N with 0 <= I < N"),
    (["--shard", "x"], "--shard 'x'; allowed: I/N with 0 <= I < N"),
    (["--impls", "auto,gluon"], "--impls 'auto,gluon'; allowed: a comma list of auto, triton"),
    (["--impls", ","], "--impls ','; allowed: a comma list of auto, triton"),
])
def test_workload_bench_refuses_bad_options_before_any_work(argv, message):
    from specsweep_kernel_bench.bench_workload import main

    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        main(argv)


def test_workload_grid_holds_the_original_shapes():
    """The bench's grid: MLA 8 and 16 heads, T 1..17 with trees of 9, 12, 17, pages 1 and 64, 64k..256k (185k,
    the investigation's own, included), ragged MLA at T 4 and 16, GQA."""
    from specsweep_kernel_bench.bench_workload import workload_rows

    rows = workload_rows(["mla", "ragged", "gqa"])
    mla = [r for r in rows if r.layout.startswith("mla") and not r.mix]
    assert {r.layout for r in mla} == {"mla:8", "mla:16"}
    assert {r.tokens for r in mla if r.mask == "tree"} == {9, 12, 17}
    assert {r.page for r in mla} == {1, 64} and {r.lens[0] for r in mla} == {65536, 185000, 262144}
    assert any(r.layout == "mla:8" and r.tokens == 9 and r.lens == [185000] and r.page == 1 for r in mla)
    assert {r.tokens for r in rows if r.mix} == {4, 16} and any(r.layout == "gqa" for r in rows)


def test_workload_bench_refuses_a_page_size_it_has_no_rows_for():
    from specsweep_kernel_bench.bench_workload import main

    with pytest.raises(SystemExit, match="--mla-pages '16'; allowed: 1, 64"):
        main(["--mla-pages", "16"])
