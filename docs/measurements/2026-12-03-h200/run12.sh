set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
cd $D; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
for i in $(seq 0 13); do python3 exp_portable.py warm $i/14 > /tmp/warm$i.log 2>&1 & done
wait; cat /tmp/warm*.log > $OUT/warm.log; grep -h SM120 /tmp/warm*.log | sort | tee $OUT/sm120.log
echo "warm $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout 400 python3 exp_portable.py time 2>&1 | tee $OUT/portable.log
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
