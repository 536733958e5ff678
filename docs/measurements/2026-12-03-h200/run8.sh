set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
timeout 400 python3 $D/exp_tpad.py 2>&1 | tee $OUT/tpad.log
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
