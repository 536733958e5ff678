# session 15, 2026-12-03 (two device calls): GPU tests of PLAN_PDL, then exp_merge.py (the fixed costs of batched calls)
set -o pipefail; export PYTHONPATH=$PWD/kernels:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider -o addopts="" tests/gpu/test_verify_attention_gpu.py tests/gpu/test_mla_sm90.py -k "dependent_launch or mla or MLA or graph" 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
cd docs/measurements/2026-12-03-h200 && timeout 540 python3 exp_merge.py 2>&1 | tee $OUT/merge.txt
