#!/bin/bash
# One device call: the calibration microbenchmarks on 2 GPUs (gpu/microbench.py).
#   bash benchmarks/calibrate_device_run.sh COMMIT      (repo root on the GPU machine; $OUT collects results)
# COMMIT: `git rev-parse HEAD` taken where the call is made (the copy there may have no .git).
# Carry .whl (nvshmem4py-cu13 0.4.1, simpy) and .cache (prebuilt cubins) with the call.
set -o pipefail
. benchmarks/device_env.sh
OUT=${OUT:-artifacts/calibration}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/log.txt"
# build both cubins first, so a compile error shows before any GPU work
python3 -c "from gpu import build; t = {'TILE_M': 128, 'TILE_N': 64, 'TILE_K': 8}; \
print(build.build(t)); print(build.build(t, unit='microbench.cu'))" 2>&1 | tee -a "$OUT/log.txt" || exit 1
timeout 390 python3 benchmarks/calibrate_gpu.py --gpus 2 --out "$OUT" --commit "${1:-unknown}" --timeout 370 \
  2>&1 | tee -a "$OUT/log.txt"
