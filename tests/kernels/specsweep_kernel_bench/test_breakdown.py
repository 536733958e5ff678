"""specsweep_kernel_bench.breakdown on the CPU: its fit, and what it refuses before any work (timing needs a GPU)."""
from __future__ import annotations

import pytest
import torch


def test_breakdown_fit_recovers_slope_and_intercept():
    """specsweep_kernel_bench.breakdown's least-squares split of a kernel's time into µs per tile and a fixed part."""
    from specsweep_kernel_bench.breakdown import fit

    rows = [{"tiles": n, "attn": 2.9 * n + 7.5} for n in (4, 16, 64)]
    slope, intercept = fit(rows)
    assert slope == pytest.approx(2.9) and intercept == pytest.approx(7.5)
    noisy = [{"tiles": n, "attn": 3.0 * n + 10.0 + d} for n, d in ((1, 0.5), (2, -0.5), (3, -0.5), (4, 0.5))]
    slope, intercept = fit(noisy)
    assert slope == pytest.approx(3.0) and intercept == pytest.approx(10.0)


@pytest.mark.parametrize("argv,message", [
    (["--layouts", "mla,gqq"], "--layouts 'gqq': allowed: gqa, mla, gqa-small, or PRESET:H"),
    (["--layouts", "gqa:3"], "--layouts 'gqa:3': allowed: gqa, mla, gqa-small, or PRESET:H"),
    (["--tokens", "1,65"], "--tokens '1,65': [65] out of range; allowed: integers in 1..64"),
    (["--prefixes", "32k"], "--prefixes '32k': allowed: comma-separated integers"),
    (["--splits-scale", "0"], "--splits-scale 0.0: allowed: a number > 0"),
    (["--flush", "cold"], "argument --flush: invalid choice: 'cold'"),  # argparse lists clean, dirty after it
])
def test_breakdown_refuses_bad_options_before_any_work(argv, message, capsys):
    from specsweep_kernel_bench.breakdown import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU message")
def test_breakdown_needs_a_gpu():
    from specsweep_kernel_bench.breakdown import main

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["--layouts", "mla:64", "--tokens", "1"])
