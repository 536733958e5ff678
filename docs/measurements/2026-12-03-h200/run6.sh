set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/env.txt
# goal 4: run 44's batch-1 MLA grid command, unchanged
timeout 330 python3 -m specsweep_kernels.bench --layouts mla,mla:64,mla:128 --prefixes 32768,131072 --tokens 1,2,4,16 --pages 1,64 --ragged '' --model-layers 0 --no-reference --out $OUT/grid.md 2>&1 | tee $OUT/grid.log
echo "grid done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout $((580-($(date +%s)-t0))) python3 $D/exp_splits.py 2>&1 | tee $OUT/splits.log
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
