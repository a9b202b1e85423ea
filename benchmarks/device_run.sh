#!/bin/bash
# The GPU machine's work, in parts, each call running the parts it names and printing the bench
# table last (a call is capped at 10 minutes, so the whole set takes two calls):
#   checks     ptxas report (registers, spills, shared memory) of the float32, bf16, tf32 and tf32x3 kernels
#              at the bench's tiles, the GPU tests on every GPU count, `moelab gpu` as a user runs it
#   calibrate  the calibration microbenchmarks of both builds on 2 GPUs where 2 or more are given (NVLink's
#              figures; calibration-<gpu>.json), else on 1 (where they stay the preset's)
#   bench-D    the sweep of precision D (float32, bfloat16, tf32, tf32x3) on the GPU counts given, a
#              telemetry trace per point, each beside the torch layer of its precision
#   apart-D    the points of that sweep whose tiles merging sources changes, with each source's rows
#              in tiles of their own (merge_sources false): the merged tiles measured against them
#   store-D    the same sweep with the flat dispatch (every chunk shared by the processors at once),
#              traced: the kernel's staged dispatch measured against it
#   put-D      the same sweep with every tile put by one block (dispatched by one block, returned by
#              GEMM1's last task: the kernel's path where a peer is not load/store reachable),
#              untraced: the direct stores measured against it
#   validate   the validation set's layers (reference/validation_set.py) at the bf16 bench tile on the GPU
#              counts given, a telemetry trace each (PREFIXtrace-val-NN-pP.npz, for `moelab compare`), no torch
#              timing: under 3 minutes on 1, 2 and 4 GPUs (tests/test_validation_set.py's estimate)
#   matrix     the benchmark matrix: the zoo twins at 1K, 4K and 16K tokens per GPU and FlashMoE's sweeps,
#              bf16 and tf32x3, on the GPU counts given, each point beside the dropless, padded and
#              per-expert-loop torch layers and against its roofline (untraced); its compact JSON and
#              table are matrix.json and matrix.txt. MATRIX_ARGS picks a subset (e.g. "--layers
#              qwen3-30b-a3b --tokens 4096"); `python benchmarks/bench_gpu.py --suite matrix --estimate`
#              here lists the points, the skipped ones and the guess of the time; MATRIX_TIMEOUT (420 s)
#              bounds the run, whose points then past it are missing from the table
#   zoo        every zoo model's layer at full size (its true shape, 256 tokens per GPU) in bf16 and tf32x3 on the
#              GPU counts given: the routing of every token and a sample of tokens against the golden streamed
#              one expert at a time (gpu.worker.run_zoo_check), one line per model, precision and GPU count;
#              `python benchmarks/bench_gpu.py --gpus 1 2 4 --suite zoo --estimate` here guesses its time.
#              ZOO_TIMEOUT (420 s) bounds the run; ZOO_ARGS picks a subset (e.g. "--layers deepseek-v3"), for
#              zootrace too
#   zootrace   every zoo model's preset (4K tokens per GPU) in bf16 on the largest GPU count given, a telemetry
#              trace each (PREFIXtrace-zoo-MODEL-4k-pP.npz, measured runs for `moelab compare`), checked against
#              the torch layer, timed beside none; a layer past a GPU's memory is listed, not run
#   stream     the bf16 GEMM's TMA ring streaming the 128-expert layer's weights with no GEMM
#              (benchmarks/weight_stream.cu: the bound on a task whose slice comes from HBM alone)
#   MOELAB_COMMIT=$(git rev-parse HEAD) bash benchmarks/device_run.sh h200x2- "1 2" checks calibrate bench-bfloat16
# Repo root on the GPU machine (its copy has no .git: the commit comes from here). Carry .whl
# (nvshmem4py-cu13 0.4.1, simpy) and .cache (benchmarks/prebuild_cubins.py). $OUT/results.tar.gz
# holds every result file.
set -o pipefail
. benchmarks/device_env.sh
begin_run "$@"
PREFIX=$1
GPUS=$2
shift 2
for part in "$@"; do
  case $part in
    checks)
      for precision in float32 bfloat16 tf32 tf32x3; do
        python3 - "$precision" "$NVH" <<'EOF' 2>&1 | tee -a "$R/ptxas.txt"
import shutil, subprocess, sys
from pathlib import Path
from gpu import build, cases, layout
from reference import presets
precision, nvh = sys.argv[1], sys.argv[2]
cfg = cases.in_dtype(presets.get("flashmoe"), precision)
options = layout.compile_options(cfg)
flags = [f"-D{k}={v}" for k, v in sorted(options.items())]
# the build's own compile command (gpu/build.py), with ptxas's report
compile_cmd = build.nvcc_commands("nvcc", build.ARCH, options, Path(nvh), Path(f"/tmp/ptxas-{precision}.o"),
                                  Path(f"/tmp/ptxas-{precision}.cubin"))[0]
out = subprocess.run([*compile_cmd, "-Xptxas", "-v"], capture_output=True, text=True).stderr.splitlines()
at = next(i for i, line in enumerate(out) if f"for {layout.kernel_name(cfg)}" in line)
print(precision, " ".join(flags), *out[at + 1: at + 3], sep="\n  ")
# ptxas reports the kernel's own function; the functions it calls (the bf16 task, gemm_task) may
# take more registers and spill: the linked cubin's figures, and the callees' spills
for i, line in enumerate(out):
    if "Function properties for" in line and "gemm_task" in line:
        print("  gemm_task:", out[i + 1].strip())
        break
tool = shutil.which("cuobjdump")
usage = subprocess.run([tool, "-res-usage", str(build.build(options).cubin)], capture_output=True,
                       text=True).stdout.splitlines() if tool else []
at = next((i for i, line in enumerate(usage) if f"Function {layout.kernel_name(cfg)}:" in line), None)
print("  linked:", usage[at + 1].strip() if at is not None else "no cuobjdump -res-usage here")
EOF
      done
      # addopts cleared: the image has no pytest-xdist (pyproject's -n auto), and one GPU job runs at a time
      timeout 240 python3 -m pytest -o addopts="" -m gpu tests/test_gpu_kernel.py -v -rs -p no:cacheprovider 2>&1 | tee "$R/pytest.txt"
      for extra in "" "--set precision=tf32" "--set precision=tf32x3 --set hidden=128 --set ffn=256 --set tile_n=128 --set tile_k=32"; do
        timeout 90 python3 -m moelab gpu --config tiny $extra --set tile_m=64 --gpus "${GPUS##* }" --check --bench \
          --out /tmp/moelab-cli 2>&1 | tee -a "$R/cli.txt"
      done ;;
    calibrate)
      # the NVLink ping-pong pairs rank r with 1 - r: two GPUs, however many the call has
      cal_gpus=${GPUS##* }
      (( cal_gpus > 2 )) && cal_gpus=2
      timeout 300 python3 benchmarks/calibrate_gpu.py --gpus "$cal_gpus" --out "$R" --commit "$MOELAB_COMMIT" \
        --timeout 280 \
        2>&1 | tee "$R/calibrate.txt" ;;
    bench-*|store-*|put-*|apart-*)
      path=staged
      [[ $part == store-* || $part == put-* ]] && path=${part%%-*}
      apart=()
      [[ $part == apart-* ]] && apart=(--apart)
      # shellcheck disable=SC2086  # GPUS is a list of counts
      timeout 400 python3 benchmarks/bench_gpu.py --gpus $GPUS --suite bench --points sweep --dtypes "${part#*-}" \
        --dispatch $path "${apart[@]}" --prefix "$PREFIX" --out "$R/${part}" --timeout 190 2>&1 | tee "$R/${part}.txt" ;;
    validate)
      # shellcheck disable=SC2086  # GPUS is a list of counts
      timeout 300 python3 benchmarks/bench_gpu.py --gpus $GPUS --suite validate --dtypes bfloat16 --prefix "$PREFIX" \
        --out "$R/validate" --timeout 280 2>&1 | tee "$R/validate.txt" ;;
    matrix)
      # shellcheck disable=SC2086  # GPUS and MATRIX_ARGS are lists
      timeout $(( ${MATRIX_TIMEOUT:-420} + 40 )) python3 benchmarks/bench_gpu.py --gpus $GPUS --suite matrix \
        --dtypes bfloat16 tf32x3 --out "$R/matrix" --compact "$R/matrix.json" --timeout "${MATRIX_TIMEOUT:-420}" \
        $MATRIX_ARGS 2>&1 | tee "$R/matrix-log.txt"
      cp "$R/matrix.json" "$R/matrix.txt" "$OUT/" 2>/dev/null ;;
    zoo)
      # shellcheck disable=SC2086  # GPUS and ZOO_ARGS are lists
      timeout $(( ${ZOO_TIMEOUT:-420} + 20 )) python3 benchmarks/bench_gpu.py --gpus $GPUS --suite zoo --out "$R/zoo" \
        --timeout "${ZOO_TIMEOUT:-420}" $ZOO_ARGS 2>&1 | tee "$R/zoo.txt" ;;
    zootrace)
      # shellcheck disable=SC2086  # ZOO_ARGS is a list
      timeout 240 python3 benchmarks/bench_gpu.py --gpus "${GPUS##* }" --suite zootrace --prefix "$PREFIX" \
        --out "$R/zootrace" --timeout 220 $ZOO_ARGS 2>&1 | tee "$R/zootrace.txt" ;;
    stream)
      timeout 120 python3 benchmarks/weight_stream.py --out "$R" --commit "$MOELAB_COMMIT" --prefix "$PREFIX" \
        2>&1 | tee "$R/stream.txt" ;;
    *) echo "unknown part $part: checks, calibrate, bench-D, apart-D, store-D, put-D (D: float32, bfloat16, tf32, tf32x3),"\
         "matrix, validate, zoo, zootrace or stream"
       exit 2 ;;
  esac
done
tar -czf "$OUT/results.tar.gz" -C "$R" .
tail -n 3 "$R/pytest.txt" 2>/dev/null
for part in "$@"; do [[ $part == bench-* || $part == store-* || $part == put-* || $part == apart-* ]] && tail -n 24 "$R/${part}.txt"; done
[[ " $* " == *" matrix "* ]] && cat "$R/matrix.txt" 2>/dev/null
for part in "$@"; do
  [[ $part == zoo ]] && grep -E "^zoo-|zoo check|FAILED" "$R/zoo.txt"
  [[ $part == zootrace ]] && tail -n 14 "$R/zootrace.txt"
  [[ $part == validate ]] && { grep -E "not run|FAILED" "$R/validate.txt" | head -n 20; tail -n 40 "$R/validate.txt"; }
done
exit 0
