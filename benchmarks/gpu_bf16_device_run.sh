#!/bin/bash
# One device call for the bf16 tensor-core kernel: its ptxas report, the GPU tests (float32 and
# bf16 checks on every GPU count), then the bench: the bf16 sweep (a telemetry trace per point)
# and the float32 sweep (no traces: the committed float32 traces stay those of their own run),
# each beside the torch layer of its dtype, on the GPU counts given. Prints the table last.
#   MOELAB_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_bf16_device_run.sh h200x2-bf16- 1 2
# Carry .whl (nvshmem4py-cu13 0.4.1, simpy) and .cache (prebuilt cubins). $OUT/results.tar.gz
# holds every result file.
set -o pipefail
. benchmarks/device_env.sh
begin_run "$@"
PREFIX=$1
shift
# the report compiles beside the tests (the tests load prebuilt cubins), at the bench's bf16 tile
DEFS=$(python3 -c "from gpu import cases, layout; from reference import presets; m, n, k = cases.BF16_TILE
print(' '.join(f'-D{o}={v}' for o, v in layout.compile_options(presets.get('flashmoe').replace(
    dtype='bfloat16', tile_m=m, tile_n=n, tile_k=k)).items()))")
( nvcc -arch=sm_90 -rdc=true -O3 -std=c++17 -c gpu/kernels/moe.cu -I"$NVH/include" $DEFS -DMIN_BLOCKS_PER_SM=2 \
    -Xptxas -v -o /tmp/ptxas.o 2>&1 | grep -A2 "for moelab_moe_bf16" > "$R/ptxas.txt"
  # which instructions the tile GEMM became (tensor-core HMMA, cp.async LDGSTS, ldmatrix LDSM, local memory)
  cuobjdump -sass /tmp/ptxas.o 2>/dev/null | awk '/Function : moelab_moe_bf16/{f=1} f' \
    | grep -oE "HMMA[.A-Z0-9]*|LDGSTS[.A-Z0-9]*|LDSM[.A-Z0-9]*|LDL[.A-Z0-9]*|STL[.A-Z0-9]*" | sort | uniq -c \
    >> "$R/ptxas.txt" ) &
timeout 150 python3 -m pytest -m gpu tests/test_gpu_kernel.py -v -rs -p no:cacheprovider 2>&1 | tee "$R/pytest.txt"
wait
tee -a "$R/log.txt" < "$R/ptxas.txt"
timeout 240 python3 benchmarks/bench_gpu.py --gpus "$@" --suite bench --points sweep --dtypes bfloat16 float32 \
  --untraced float32 --prefix "$PREFIX" --out "$R" --timeout 225 2>&1 | tee "$R/bench.txt"
tar -czf "$OUT/results.tar.gz" -C "$R" .
tail -n 3 "$R/pytest.txt"
tail -n 45 "$R/bench.txt"
