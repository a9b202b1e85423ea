#!/bin/bash
# One device call: build check (ptxas report), the GPU tests on every GPU count, then the benchmark
# matrix with a telemetry trace per point, for the GPU counts given. Prints the table last.
#   MOELAB_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_device_run.sh h200x2- 1 2
# (repo root on the GPU machine, whose copy has no .git: the commit comes from here.) The first
# argument prefixes the trace files' names. Carry .whl (nvshmem4py-cu13 0.4.1, simpy) and .cache
# (prebuilt cubins) with the call. $OUT/results.tar.gz holds every result file.
set -o pipefail
. benchmarks/device_env.sh
begin_run "$@"
PREFIX=$1
shift
nvcc -arch=sm_90 -rdc=true -O3 -std=c++17 -c gpu/kernels/moe.cu -I"$NVH/include" -DTILE_M=128 -DTILE_N=64 -DTILE_K=8 \
  -DMIN_BLOCKS_PER_SM=2 -Xptxas -v -o /tmp/ptxas.o 2>&1 | grep -A2 "for moelab_moe_fp32" | tee -a "$R/log.txt"
# the test's workers have their own 120 s limit per GPU count, inside this one
# (only the GPU test module: the app's tests need plotly and streamlit, which the image lacks)
timeout 270 python3 -m pytest -m gpu tests/test_gpu_kernel.py -v -rs -p no:cacheprovider 2>&1 | tee "$R/pytest.txt"
# `moelab gpu` itself, as a user runs it: check against the golden, bench, trace as Perfetto JSON
timeout 90 python3 -m moelab gpu --config tiny --gpus 2 --check --bench --trace "$R/cli-tiny-p2.json" \
  --out /tmp/moelab-cli 2>&1 | tee "$R/cli.txt"
timeout 280 python3 benchmarks/bench_gpu.py --gpus "$@" --suite bench --points sweep --prefix "$PREFIX" \
  --out "$R" --timeout 260 2>&1 | tee "$R/bench.txt"
tar -czf "$OUT/results.tar.gz" -C "$R" .
tail -n 30 "$R/bench.txt"
