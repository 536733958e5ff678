# session 15, 2026-12-03: exp_hetero.py (64-row part and the rest side by side, two streams in one graph)
set -o pipefail; export PYTHONPATH=$PWD/kernels:$PWD PYTHONUNBUFFERED=1
cd docs/measurements/2026-12-03-h200 && timeout 500 python3 exp_hetero.py 2>&1 | tee $OUT/hetero.txt
