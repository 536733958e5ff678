# session 15, 2026-12-03, four device calls on the REMAINDER_BESIDE code:
#  a: the GPU tests stopped at their first failure (a launch argument named like a flag; fixed), nothing timed
#  b: GPU tests 104 passed, 8 failed (every failure: the 64-row grid rounded *down* when no remainder is taken, fixed
#     to whole m-blocks); exp_remainder's "padded" arm timed that broken grid (its rows were filled from the other
#     arm's partials in a shared workspace), so its timings are void and not kept
#  c: the fixed code: GPU tests (-k "dependent_launch or remainder or mla or MLA", 27 passed, then cut by the
#     110 s limit), then exp_remainder.py with a NaN-poisoned workspace per arm: run18-remainder.txt
set -o pipefail; export PYTHONPATH=$PWD/kernels:$PWD PYTHONUNBUFFERED=1
timeout 110 python3 -m pytest -q --noconftest -p no:cacheprovider -o addopts="" tests/gpu/test_verify_attention_gpu.py -k "dependent_launch or remainder or mla or MLA" --tb=line 2>&1 | tail -6 | tee $OUT/gpu-tests.txt
cd docs/measurements/2026-12-03-h200 && timeout 140 python3 exp_remainder.py 2>&1 | tee $OUT/remainder.txt
