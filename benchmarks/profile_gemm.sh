#!/bin/bash
# Nsight Compute's view of a build's tile GEMM (bfloat16: gpu/kernels/tile_gemm_wgmma.cuh, float32:
# gpu/kernels/tile_gemm.cuh) as the calibration microbenchmark runs it (mb_gemm: the megakernel's
# own gemm_task, K = 2048, 128-row tiles): one
# launch with a single block (the task alone on an SM) and one with the megakernel's grid (its
# blocks per SM, tiles of an expert sharing its weight slices). Prints where the warps stall, the
# tensor or FMA pipe's and the memories' share of their peaks, shared-memory bank conflicts. Repo
# root on the GPU machine; carry .whl and .cache as for benchmarks/device_run.sh.
#   bash benchmarks/profile_gemm.sh [bfloat16|float32]
DTYPE=${1:-bfloat16}
[[ $DTYPE == bfloat16 || $DTYPE == float32 ]] || { echo "dtype $DTYPE: bfloat16 or float32"; exit 2; }
. benchmarks/device_env.sh
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -x $NCU ]] || { echo "ncu not found on this machine"; exit 3; }
OUT=${OUT:-artifacts/profile}
mkdir -p "$OUT"
# mb_gemm launches of GEMM0, in sec_gemm's order: 0 warm-up, 1 one block, 2 one 32-row block, 3 the grid
for skip in 1 3; do
  timeout 240 "$NCU" --target-processes all --kernel-name mb_gemm --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,\
sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio \
    python3 -c "from gpu import microbench; microbench.collect(1, '/tmp/mb-$skip', dtype='$DTYPE', sections=('gemm',))" \
    2>&1 | tee "$OUT/ncu-$DTYPE-launch-$skip.txt" | grep -v "^==PROF==" | tail -n 120
done
