set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
M="python3 -m specsweep_kernels.bench_workload --sglang-verify $D/sglang-0.5.23"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
for i in $(seq 0 14); do $M --warm-only --shard $i/15 > /tmp/warm$i.log 2>&1 & done
wait; cat /tmp/warm*.log > $OUT/warm.log
echo "warm $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout $((548-($(date +%s)-t0))) $M --out $OUT/workload.md 2>&1 | tee $OUT/workload.log
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
