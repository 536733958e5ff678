set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
M="python3 -m specsweep_kernels.bench_workload --grid mla,ragged --impls auto --mla-pages 1 --mla-prefixes 185000"
for i in $(seq 0 13); do $M --warm-only --shard $i/14 > /tmp/warm$i.log 2>&1 & done
wait
echo "warm $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
# goal 4: run 44's batch-1 MLA grid command, unchanged, on the MASK_IN_BRANCH code
timeout 130 python3 -m specsweep_kernels.bench --layouts mla,mla:64,mla:128 --prefixes 32768,131072 --tokens 1,2,4,16 --pages 1,64 --ragged '' --model-layers 0 --no-reference --out $OUT/grid.md 2>&1 | tee $OUT/grid.log
echo "grid done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout $((320-($(date +%s)-t0))) $M --out $OUT/workload.md 2>&1 | tee $OUT/workload.log
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
