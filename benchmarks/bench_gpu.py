"""The GPU matrix: build, check and time the megakernel against the golden and the torch layer.

    python benchmarks/bench_gpu.py --gpus 1 2 4 --suite checks bench --out OUT_DIR
    python benchmarks/bench_gpu.py --gpus 1 2 --suite bench --dtypes bfloat16 float32 --untraced float32
    python benchmarks/bench_gpu.py --gpus 1 2 --suite checks bench --dtypes tf32
    python benchmarks/bench_gpu.py --gpus 1 --suite bench --dtypes bfloat16 --tile 128x256x64
    python benchmarks/bench_gpu.py --gpus 1 2 4 --suite validate --prefix h100x4-

`checks`: small configs against the float64 golden (fresh seeds, skewed routing, all tokens to one
expert, capacity dropping, T not a multiple of tile_m, E = P and E = 8P, every gate and
activation the kernel supports), telemetry on/off, and a rank that sits out (the others must
time out and raise). `bench`: the FlashMoE default and its token/expert sweeps, kernel vs the
torch layer of the same dtype (float32 points also beside torch bf16), random inputs drawn on the GPU,
checked against the torch layer. `validate`: the validation set's layers (reference/validation_set.py)
at the bf16 bench tile, each traced and checked against the torch layer (the layers the kernel
refuses are listed). `--dtypes` picks the kernels (float32, bfloat16, tf32: float32 data
on TF32 tensor cores, timed beside torch with TF32 allowed; tf32x3: float32 data on TF32 tensor
cores at float32's accuracy, timed beside torch float32), `--untraced` those whose points keep
no trace, and `checks` then includes the bf16 (tf32, tf32x3) kernel's checks against the
reference's bf16-emulated (tf32, float64) golden. The matmul ceiling of each precision is measured
first (torch, 8192^3) and each point's rate is given as a share of its own precision's ceiling;
tf32x3's is float32's, the ceiling of its dtype at its accuracy. The memory's rate is measured
too (torch copy and sum), and each point gets the GEMM phase's best share of the ceiling where
every expert weight has to come from memory once (weights_bound): the roofline the GEMM phase's
bar meets on layers of few rows per expert; `GEMM phase % roofline` is the phase's share of the
lesser of that bound and the ceiling (roofline_share).
Every result (and every bench trace's meta) carries the run's provenance: the commit
($MOELAB_COMMIT where the tree has no .git, else `git rev-parse HEAD`), the command line, the
GPUs, driver, CUDA and library versions. Writes OUT_DIR/gpus-N/results.json and traces (named
with --prefix), OUT_DIR/summary.json, and prints one table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu import UnsupportedConfig, check_supported, spawn  # noqa: E402
from gpu.cases import (  # noqa: E402
    PRECISIONS,
    baseline_precision,
    bench_cases,
    bf16_check_cases,
    check_cases,
    in_dtype,
    sit_out_case,
    tf32_check_cases,
    tf32x3_check_cases,
    validation_cases,
)
from reference import Config, ConfigError, presets  # noqa: E402
from reference.cli import format_table  # noqa: E402
from sim import metrics  # noqa: E402
from sim.trace import DISPATCH_PATHS  # noqa: E402


def tile_shape(text: str) -> tuple[int, int, int]:
    """--tile's MxNxK, e.g. 128x256x64."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(x.isdigit() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(f"tile {text!r}: three positive integers MxNxK, e.g. 128x256x64")
    return int(parts[0]), int(parts[1]), int(parts[2])


def median_seconds(op) -> float:
    """Median time of op() on GPU 0 over 10 runs after 3 warm-ups (CUDA events)."""
    import torch

    times = []
    for i in range(13):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        op()
        e.record()
        e.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def ceiling_tflops(dtype: str = "float32") -> float:
    """Measured matmul rate of `dtype` (torch, TF32 only for "tf32", 8192^3 random operands) on GPU 0."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a = torch.randn(8192, 8192, device="cuda", dtype=dt)
    b = torch.randn(8192, 8192, device="cuda", dtype=dt)
    seconds = median_seconds(partial(torch.matmul, a, b))
    torch.backends.cuda.matmul.allow_tf32 = False
    del a, b
    torch.cuda.empty_cache()  # the workers' layers get the memory back
    return 2 * 8192 ** 3 / seconds / 1e12


def memory_gbps() -> float:
    """Measured rate of GPU 0's memory, GB/s: the faster of a 1 GiB copy (read and write counted)
    and a 1 GiB sum (read): the pace at which a GEMM phase can at best stream its weights."""
    import torch

    n = 2**28
    src, dst = torch.rand(n, device="cuda"), torch.empty(n, device="cuda")
    gbps = max(8 * n / median_seconds(partial(dst.copy_, src)), 4 * n / median_seconds(src.sum)) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return gbps


def flops(r: dict) -> float:
    """Expert FLOPs of one layer call over all ranks: 2 GEMMs of 2 H I per kept row."""
    c = r["config"]
    return 4.0 * r["kept_rows"] * c["hidden"] * c["ffn"]


# where a summary's meta keeps each measured matmul ceiling (TFLOP/s a GPU)
CEILING_KEYS = {"float32": "fp32_ceiling_tflops", "bfloat16": "bf16_ceiling_tflops", "tf32": "tf32_ceiling_tflops"}


def ceilings_of(meta: dict) -> dict[str, float]:
    """The ceilings a run's meta recorded, by GEMM precision: tf32x3's is float32's, the ceiling of
    its dtype at its accuracy (summaries from before the tf32 ceiling lack it)."""
    out = {dt: meta[key] for dt, key in CEILING_KEYS.items() if key in meta}
    out["tf32x3"] = out["float32"]
    return out


def weights_bound(r: dict, ceiling: float, gbps: float) -> float:
    """The GEMM phase's best share (%) of `ceiling` (TFLOP/s a GPU) at the memory rate `gbps`
    (sim.metrics.weights_roofline): under 60 the bar on the GEMM phase cannot hold at that point."""
    return metrics.weights_roofline(Config.from_dict(r["config"]), r["kept_rows"], ceiling, gbps)


def run_meta(args_line: str) -> dict:
    """Where and from what the numbers come: commit, command, GPUs, driver, versions."""
    import torch

    def out(cmd):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:  # a tool missing on this machine: its field stays empty
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    smi = out(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]).splitlines()
    commit = os.environ.get("MOELAB_COMMIT") or out(["git", "rev-parse", "HEAD"]) or "unknown"
    try:
        from importlib.metadata import version

        nvshmem = version("nvidia-nvshmem-cu13")
    except Exception:  # recorded as unknown rather than failing the run
        nvshmem = "unknown"
    return {"commit": commit, "command": args_line, "invoked_by": os.environ.get("MOELAB_COMMAND", ""),
            "gpus_seen": [line.split(",")[0].strip() for line in smi],
            "driver": smi[0].split(",")[1].strip() if smi else "unknown",
            "torch": torch.__version__, "cuda": torch.version.cuda, "nvshmem": nvshmem,
            "nvcc": (out(["nvcc", "--version"]).splitlines() or ["unknown"])[-1]}


def roofline_share(gemm_pct: float, bound_pct: float) -> float:
    """The GEMM phase (% of the ceiling) as a share (%) of the most that point allows: the ceiling,
    or the weights' bound where that is lower (weights_bound)."""
    return 100 * gemm_pct / min(100.0, bound_pct)


TABLE_HEAD = ("point", "dtype", "GPUs", "T/rank", "E", "kernel ms", "torch ms (same dtype)", "speedup", "TFLOP/s",
              "% ceil", "GEMM phase % ceil", "weights' bound % ceil", "GEMM phase % roofline", "SM util %",
              "overlap eff T(2)/T(N)", "telemetry +%", "rel err vs torch")


def table_rows(all_results: list[dict], ceilings: dict[str, float], gbps: float | None = None) -> list[tuple]:
    """One row (TABLE_HEAD) per bench point: the kernel against the torch layer of its own dtype, its rate as a
    share of that dtype's ceiling, the GEMM phase's rate (GEMM FLOPs over the GEMM task time per
    processor block, from telemetry) as a share of it, the most the GPUs' memory allows it
    (weights_bound, at `gbps`; blank without) and the GEMM phase's share of the lesser of that and
    the ceiling (roofline_share), and FlashMoE's overlap efficiency T(2) / T(N)
    (sim.metrics.overlap_efficiency) where this run has the point on 2 GPUs too."""
    def precision(r):
        return Config.from_dict(r["config"]).gemm_precision

    def baseline(r):
        return baseline_precision(Config.from_dict(r["config"]))

    on_two = {(r["config"]["name"], precision(r)): r["kernel_ms"]
              for r in all_results if "kernel_ms" in r and r["config"]["ranks"] == 2}
    rows = []
    for r in all_results:
        if "kernel_ms" not in r:
            continue
        c = r["config"]
        dt = precision(r)
        ceil = ceilings[dt] * c["ranks"]
        tf = flops(r) / (r["kernel_ms"] * 1e-3) / 1e12
        gemm_tf = flops(r) / (r["gemm_ms_per_proc"] * 1e-3) / 1e12 if r.get("gemm_ms_per_proc") else 0.0
        torch_ms = r.get(f"torch_{baseline(r)}_ms", 0.0)
        two = on_two.get((c["name"], dt))
        gemm_pct, bound = 100 * gemm_tf / ceil, None if gbps is None else weights_bound(r, ceilings[dt], gbps)
        rows.append((r["name"], dt, c["ranks"], c["tokens"], c["experts"], r["kernel_ms"], torch_ms,
                     torch_ms / r["kernel_ms"], tf, 100 * tf / ceil, gemm_pct,
                     "" if bound is None else bound, "" if bound is None else roofline_share(gemm_pct, bound),
                     100 * r.get("sm_utilization", 0.0),
                     "" if two is None else metrics.overlap_efficiency(two, r["kernel_ms"]),
                     100 * (r["kernel_telemetry_ms"] / r["kernel_ms"] - 1), r.get("vs_baseline_rel_err", -1.0)))
    return rows


def table(all_results: list[dict], ceilings: dict[str, float], gbps: float | None = None) -> str:
    return format_table(TABLE_HEAD, table_rows(all_results, ceilings, gbps))


def ceiling_text(ceilings: dict[str, float]) -> str:
    return ", ".join(f"{dt} {t:.1f}" for dt, t in ceilings.items()) + " TFLOP/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1])
    ap.add_argument("--suite", nargs="+", default=["checks"], choices=["checks", "bench", "sitout", "validate"])
    ap.add_argument("--points", default="sweep", choices=["default", "sweep", "tiles"])
    ap.add_argument("--out", default="artifacts/gpu")
    ap.add_argument("--timeout", type=float, default=560.0, help="wall-clock limit per GPU count, seconds")
    ap.add_argument("--prefix", default="", help="prefix of the trace files' names (e.g. h200x4-)")
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(PRECISIONS),
                    help="kernels to bench (and, with bfloat16, tf32 or tf32x3, to check)")
    ap.add_argument("--untraced", nargs="*", default=[], choices=list(PRECISIONS),
                    help="dtypes whose bench points keep no telemetry trace")
    ap.add_argument("--dispatch", default="staged", choices=DISPATCH_PATHS,
                    help="how tiles move between GPUs: stores into the peer's memory where it is load/store "
                         "reachable, the peers' chunks sent by a few blocks one local expert after another "
                         "(staged, the kernel's default) or every chunk shared by all blocks at once (store: "
                         "names end in -store), or one put per tile (dispatched by one block, returned by "
                         "GEMM1's last task: names end in -put, untraced)")
    ap.add_argument("--staged-blocks", type=int, metavar="N",
                    help="with the staged dispatch, send the peers' chunks from N processors instead of the "
                         "kernel's 32: names end in -sendersN, untraced")
    ap.add_argument("--tile", type=tile_shape, help="run every bench point at this tile shape, MxNxK (e.g. "
                    "128x256x64), instead of its precision's bench tile: names gain -tileMxNxK")
    ap.add_argument("--apart", action="store_true", help="run only the points whose tiles merging sources changes, "
                    "each source's rows in tiles of their own (merge_sources false): names end in -apart")
    args = ap.parse_args()
    if args.staged_blocks is not None and (args.staged_blocks < 1 or args.dispatch != "staged"):
        ap.error(f"--staged-blocks {args.staged_blocks}: a positive number of processors, with --dispatch staged")
    if args.tile:
        for dt in args.dtypes:
            try:
                check_supported(in_dtype(presets.get("flashmoe"), dt).replace(
                    tile_m=args.tile[0], tile_n=args.tile[1], tile_k=args.tile[2]))
            except (UnsupportedConfig, ConfigError) as e:
                ap.error(f"--tile {'x'.join(map(str, args.tile))} for {dt}: {e}")
    why = spawn.unmet(max(args.gpus))
    if why:
        ap.error(why)
    t0 = time.monotonic()
    meta = run_meta(shlex.join(["python3", *sys.argv]))
    for dt, key in CEILING_KEYS.items():
        meta[key] = ceiling_tflops(dt)
    ceilings = ceilings_of(meta)
    meta["memory_gbps"] = gbps = memory_gbps()
    print(f"measured matmul ceilings per GPU: {ceiling_text(ceilings)}; memory {gbps:.0f} GB/s", flush=True)
    seed = int.from_bytes(os.urandom(4), "little")
    meta["seed"] = seed
    everything = []
    for p in args.gpus:
        cases = []
        if "checks" in args.suite:
            cases += check_cases(p, seed, args.prefix)
            if "bfloat16" in args.dtypes:
                cases += bf16_check_cases(p, seed)
            if "tf32" in args.dtypes:
                cases += tf32_check_cases(p, seed)
            if "tf32x3" in args.dtypes:
                cases += tf32x3_check_cases(p, seed)
        if "bench" in args.suite:
            for dt in args.dtypes:
                cases += bench_cases(p, args.points, args.prefix, dt, trace=dt not in args.untraced,
                                     dispatch=args.dispatch, tile=args.tile, staged_blocks=args.staged_blocks,
                                     apart=args.apart)
        if "validate" in args.suite:
            runs, refused = validation_cases(p, args.prefix)
            cases += runs
            for name, why in refused:
                print(f"gpus={p}: {name} not run: {why}", flush=True)
        if "sitout" in args.suite and p > 1:
            cases.append(sit_out_case(p))
        for c in cases:
            c["meta"] = meta
        out = Path(args.out) / f"gpus-{p}"
        left = args.timeout - (time.monotonic() - t0)
        try:
            results = spawn.run(cases, p, out, timeout_s=max(left, 30))
        except spawn.SpawnError as e:
            print(f"gpus={p}: {e}", flush=True)
            results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else []
        everything += results
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps({"meta": meta, "results": everything}, indent=1,
                                                            default=str))
    for r in everything:
        if "failed" in r:
            print(r["name"], "FAILED:", r["failed"], flush=True)
    checks = [r for r in everything if r["name"].startswith(("check", "sit"))]
    for r in checks:
        keys = ("routing_equal", "counts_equal", "weight_max_abs_err", "rel_err", "golden_path", "rel_err_float64",
                "dropped", "nan",
                "telemetry_same_output", "sm_utilization", "raised", "seconds_to_raise", "error", "failed")
        print(r["name"], {k: r[k] for k in keys if k in r}, flush=True)
    print(f"commit {meta['commit']}, {', '.join(meta['gpus_seen'])}, driver {meta['driver']}, "
          f"ceilings per GPU: {ceiling_text(ceilings)}, memory {gbps:.0f} GB/s")
    print(table(everything, ceilings, gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
