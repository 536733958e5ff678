set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
timeout 280 python3 $D/exp_mask.py 2>&1 | tee $OUT/mask.log
echo "exp done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout $((570-($(date +%s)-t0))) python3 -m pytest -q --noconftest -p no:cacheprovider -o addopts="" tests/gpu/test_mla_sm90.py tests/gpu/test_verify_attention_gpu.py -k "mla or MLA or graph or partials or slices" 2>&1 | tail -25 | tee $OUT/gpu-tests.log
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
