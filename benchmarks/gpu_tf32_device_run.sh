#!/bin/bash
# One device call for the TF32 tensor-core kernel (float32 configs with tf32 = true): its ptxas
# report and SASS instruction counts, the GPU tests (float32, bf16 and tf32 checks on every GPU
# count), `moelab gpu --set tf32=true` as a user runs it, then the tf32 sweep (a telemetry trace
# per point, each beside torch with TF32 allowed and torch float32) on the GPU counts given.
#   MOELAB_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_tf32_device_run.sh h200x2-tf32- 1 2
# Carry .whl (nvshmem4py-cu13 0.4.1, simpy) and .cache (prebuilt cubins: benchmarks/prebuild_cubins.py).
# $OUT/results.tar.gz holds every result file.
set -o pipefail
. benchmarks/device_env.sh
begin_run "$@"
PREFIX=$1
shift
# the report compiles beside the tests (the tests load prebuilt cubins)
( nvcc -arch=sm_90 -rdc=true -O3 -std=c++17 -c gpu/kernels/moe.cu -I"$NVH/include" -DTILE_M=128 -DTILE_N=64 \
    -DTILE_K=16 -DMOE_TF32=1 -DMIN_BLOCKS_PER_SM=2 -Xptxas -v -o /tmp/ptxas.o 2>&1 \
    | grep -A2 "for moelab_moe_tf32" > "$R/ptxas.txt"
  # which instructions the tile GEMM became (TF32 HMMA, cp.async LDGSTS, shared loads, local memory)
  cuobjdump -sass /tmp/ptxas.o 2>/dev/null | awk '/Function : moelab_moe_tf32/{f=1} f' \
    | grep -oE "HMMA[.A-Z0-9]*|LDGSTS[.A-Z0-9]*|LDS[.A-Z0-9]*|LDL[.A-Z0-9]*|STL[.A-Z0-9]*" | sort | uniq -c \
    >> "$R/ptxas.txt" ) &
timeout 200 python3 -m pytest -m gpu tests/test_gpu_kernel.py -v -rs -p no:cacheprovider 2>&1 | tee "$R/pytest.txt"
wait
tee -a "$R/log.txt" < "$R/ptxas.txt"
timeout 90 python3 -m moelab gpu --config tiny --set tf32=true --set tile_m=64 --gpus 2 --check --bench \
  --out /tmp/moelab-cli 2>&1 | tee "$R/cli.txt"
timeout 240 python3 benchmarks/bench_gpu.py --gpus "$@" --suite bench --points sweep --dtypes tf32 \
  --prefix "$PREFIX" --out "$R" --timeout 225 2>&1 | tee "$R/bench.txt"
tar -czf "$OUT/results.tar.gz" -C "$R" .
tail -n 3 "$R/pytest.txt"
tail -n 30 "$R/bench.txt"
