"""Build here every cubin a device call will load, so the GPU machine spends no time in nvcc.

    python benchmarks/prebuild_cubins.py            # then carry .cache with the call

Collects the compile-time options (tile shape, GEMM precision) of every GPU test case, benchmark point,
benchmark matrix point, validation layer (the `validate` part) and zoo check and trace (the `zoo` and
`zootrace` parts) on 1, 2, 4 and 8 GPUs, plus the
calibration microbenchmarks, and builds them into .cache/moelab/cubins (the folder
benchmarks/device_env.sh points MOELAB_CACHE to), two at a time, and removes the folder's other cubins
(stale keys), since the carried folder is capped at 64 MiB.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu import build, cases, layout, microbench  # noqa: E402
from reference import Config, presets  # noqa: E402


def wanted() -> list[tuple[dict, str]]:
    """(compile options, unit) of everything the device scripts run."""
    todo = []
    for p in (1, 2, 4, 8):
        todo += cases.check_cases(p, 0) + cases.bf16_check_cases(p, 0) + cases.tf32_check_cases(p, 0)
        todo += cases.tf32x3_check_cases(p, 0) + cases.feature_check_cases(p, 0)
        todo += [cases.sit_out_case(p)] if p > 1 else []
        for dtype in cases.PRECISIONS:
            for points in ("sweep", "tiles"):
                todo += cases.bench_cases(p, points, dtype=dtype)
        for dtype in cases.MATRIX_DTYPES:
            todo += cases.matrix_cases(p, dtype, presets.ZOO, cases.MATRIX_TOKENS)
        todo += cases.validation_cases(p)[0]
        todo += [c for c in cases.zoo_check_cases(p, 0) + cases.zoo_trace_cases(p) if not c.get("skip")]
    opts = {tuple(sorted(layout.compile_options(Config.from_dict(c["config"])).items())) for c in todo}
    units = [(dict(o), "moe.cu") for o in sorted(opts)]
    return units + [(microbench.tile_options(dtype, 2), "microbench.cu") for dtype in microbench.DTYPES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "moelab" / "cubins")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    todo = wanted()
    t0 = time.time()

    def one(item):
        opts, unit = item
        return opts, unit, build.build(opts, cache=args.cache, unit=unit)

    keep = set()
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, (opts, unit, built) in enumerate(pool.map(one, todo), 1):
            keep.add(built.cubin.name)
            print(f"[{i}/{len(todo)}] {unit:14s} {opts}: {'cached' if built.cached else 'built'} {built.cubin.name}",
                  flush=True)
    stale = [c for c in args.cache.glob("*.cubin") if c.name not in keep]
    for c in stale:
        c.unlink()
    print(f"{len(keep)} cubins in {args.cache} ({time.time() - t0:.0f} s), {len(stale)} stale removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
