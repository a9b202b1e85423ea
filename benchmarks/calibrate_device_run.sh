#!/bin/bash
# One device call: the calibration microbenchmarks of the float32 and the bf16 build on 2 GPUs
# (gpu/microbench.py), written to one $OUT/calibration-<gpu>.json with a "bfloat16" section.
#   bash benchmarks/calibrate_device_run.sh COMMIT      (repo root on the GPU machine; $OUT collects results)
# COMMIT: `git rev-parse HEAD` taken where the call is made (the copy there may have no .git).
# Carry .whl (nvshmem4py-cu13 0.4.1, simpy) and .cache (prebuilt cubins) with the call.
set -o pipefail
. benchmarks/device_env.sh
OUT=${OUT:-artifacts/calibration}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/log.txt"
# build all four cubins (megakernel and microbenchmarks of each dtype) first, so a compile error
# shows before any GPU work; the tile shapes come from gpu/microbench.py (bf16: gpu/cases.py)
python3 -c "from gpu import build, microbench
for d in microbench.DTYPES:
    t = microbench.tile_options(d, 2); print(d, build.build(t)); print(d, build.build(t, unit='microbench.cu'))" \
  2>&1 | tee -a "$OUT/log.txt" || exit 1
timeout 560 python3 benchmarks/calibrate_gpu.py --gpus 2 --out "$OUT" --commit "${1:-unknown}" --timeout 540 \
  2>&1 | tee -a "$OUT/log.txt"
