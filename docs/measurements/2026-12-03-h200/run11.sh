set -o pipefail
R=$PWD; D=$R/.device/kernel
export PYTHONPATH=$D/kernels:$R PYTHONUNBUFFERED=1
cd $D; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/env.txt
for i in $(seq 0 11); do python3 exp_ceiling.py warm $i/12 > /tmp/warm$i.log 2>&1 & done
python3 -c "
from specsweep_kernels.roofline import measure_ceilings, matmul_peak_tflops
c = measure_ceilings(); p, r = matmul_peak_tflops()
print(f'copy {c.copy_gbps:.0f} GB/s (2 GiB, read+write); matmul median {p:.0f} TFLOP/s of {[round(x) for x in r]}')" 2>&1 | tee -a $OUT/env.txt
wait; cat /tmp/warm*.log > $OUT/warm.log
echo "warm $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout 200 python3 exp_ceiling.py time 2>&1 | tee $OUT/ceiling.log
echo "ceiling $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
N=/opt/nvidia/nsight-compute/*/ncu; N=$(ls $N 2>/dev/null | head -1); N=${N:-ncu}
timeout 120 $N --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed python3 exp_ncu.py > $OUT/ncu1.log 2>&1
echo "ncu1 rc $? $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
timeout 100 $N --clock-control none --profile-from-start off --metrics sm__ops_path_tensor_src_bf16_dst_fp32.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active python3 exp_ncu.py > $OUT/ncu2.log 2>&1 || timeout 90 $N --clock-control none --profile-from-start off --metrics sm__ops_path_tensor_src_bf16_dst_fp32.sum python3 exp_ncu.py > $OUT/ncu3.log 2>&1
echo "all done $(( $(date +%s)-t0 )) s" | tee -a $OUT/env.txt
grep -E "SHAPE|verify|merge|duration|dram__|lts__|sm__" $OUT/ncu1.log | head -80
