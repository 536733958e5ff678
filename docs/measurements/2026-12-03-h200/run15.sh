set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
cd $D; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
N=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); N=${N:-ncu}
timeout 300 $N --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__ops_path_tensor_src_bf16_dst_fp32.sum python3 exp_ncu_ragged.py > $OUT/ncu-ragged.txt 2>&1
echo "rc $? all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
grep -E "^ROW|_kernel \(|duration|dram__bytes_read" $OUT/ncu-ragged.txt
