set -o pipefail
R=$PWD; D=$R/.device/h31
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
M="python3 -m specsweep_kernels.bench_workload --sglang-verify $D/sglang-0.5.23"
t0=$(date +%s)
(timeout 330 python3 -m pytest -q --noconftest -p no:cacheprovider -o addopts="" tests/gpu/test_verify_attention_gpu.py tests/gpu/test_mla_sm90.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc $? after $(( $(date +%s)-t0 )) s" >> $OUT/gpu-tests.log) &
for i in $(seq 0 11); do $M --warm-only --shard $i/12 > /tmp/warm$i.log 2>&1 & done
wait
echo "tests + warm $(( $(date +%s)-t0 )) s" | tee $OUT/env.txt
cat /tmp/warm*.log > $OUT/warm.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a $OUT/env.txt
timeout $((585-($(date +%s)-t0))) $M --out $OUT/workload.md 2>&1 | tee $OUT/run.log
tail -3 $OUT/gpu-tests.log
