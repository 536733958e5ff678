set -o pipefail
R=$PWD; D=$R/.device/h31
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
M="python3 -m specsweep_kernels.bench_workload --sglang-verify $D/sglang-0.5.23 --grid mla,gqa --mla-pages 1 --mla-prefixes 185000"
t0=$(date +%s)
for i in $(seq 0 13); do $M --warm-only --shard $i/14 > /tmp/warm$i.log 2>&1 & done
wait
echo "warm $(( $(date +%s)-t0 )) s" | tee $OUT/env.txt
cat /tmp/warm*.log > $OUT/warm.log
timeout $((270-($(date +%s)-t0))) $M --out $OUT/workload.md 2>&1 | tee $OUT/run.log
