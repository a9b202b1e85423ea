#!/bin/bash
# One device call: build check, the GPU tests, then the benchmark matrix, for the GPU counts given.
#   bash benchmarks/gpu_device_run.sh 1 2        (repo root on the GPU machine; $OUT collects results)
# Carry .whl (nvshmem4py-cu13 0.4.1, simpy) and .cache (prebuilt cubins) with the call.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 MOELAB_CACHE=$PWD/.cache/moelab
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-artifacts/device}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/log.txt"
python3 -c "from gpu import build; print(build.build({'TILE_M': 128, 'TILE_N': 64, 'TILE_K': 8}))" 2>&1 | tee -a "$OUT/log.txt"
timeout 300 python3 -m pytest -m gpu tests/test_gpu_kernel.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.txt"
timeout 400 python3 benchmarks/bench_gpu.py --gpus "$@" --suite bench --out "$OUT/r" --timeout 380 2>&1 | tee -a "$OUT/log.txt"
