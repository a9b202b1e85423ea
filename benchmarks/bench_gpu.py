"""The GPU matrix: build, check and time the megakernel against the golden and the torch layer.

    python benchmarks/bench_gpu.py --gpus 1 2 4 --suite checks bench --out OUT_DIR

`checks`: small configs against the float64 golden (fresh seeds, skewed routing, all tokens to one
expert, capacity dropping, T not a multiple of tile_m, E = P and E = 8P, every gate and
activation the kernel supports), telemetry on/off, and a rank that sits out (the others must
time out and raise). `bench`: the FlashMoE default and its token/expert sweeps, kernel vs the
torch layer (float32 and bf16), random inputs drawn on the GPU, checked against the torch layer.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu import spawn  # noqa: E402
from gpu.cases import bench_cases, check_cases, sit_out_case  # noqa: E402
from reference.cli import format_table  # noqa: E402


def fp32_ceiling_tflops() -> float:
    """Measured fp32 matmul rate (torch, no TF32, 8192^3, median of 10 after 3 warm-ups) on GPU 0."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    times = []
    for i in range(13):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    times.sort()
    return 2 * 8192 ** 3 / times[len(times) // 2] / 1e12


def flops(r: dict) -> float:
    """Expert FLOPs of one layer call over all ranks: 2 GEMMs of 2 H I per kept row."""
    c = r["config"]
    return 4.0 * r["kept_rows"] * c["hidden"] * c["ffn"]


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


def table(all_results: list[dict], ceiling: float) -> str:
    rows = []
    for r in all_results:
        if "kernel_ms" not in r:
            continue
        c = r["config"]
        tf = flops(r) / (r["kernel_ms"] * 1e-3) / 1e12
        rows.append((r["name"], c["ranks"], c["tokens"], c["experts"], r["kernel_ms"], r.get("torch_float32_ms", 0.0),
                     r.get("torch_float32_ms", 0.0) / r["kernel_ms"], r.get("torch_bfloat16_ms", 0.0), tf,
                     100 * tf / (ceiling * c["ranks"]), 100 * r.get("sm_utilization", 0.0),
                     100 * (r["kernel_telemetry_ms"] / r["kernel_ms"] - 1), r.get("vs_baseline_rel_err", -1.0)))
    head = ("point", "GPUs", "T/rank", "E", "kernel ms", "torch fp32 ms", "speedup", "torch bf16 ms", "TFLOP/s",
            "% fp32 ceil", "SM util %", "telemetry +%", "rel err vs torch")
    return format_table(head, rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1])
    ap.add_argument("--suite", nargs="+", default=["checks"], choices=["checks", "bench", "sitout"])
    ap.add_argument("--points", default="sweep", choices=["default", "sweep"])
    ap.add_argument("--out", default="artifacts/gpu")
    ap.add_argument("--timeout", type=float, default=560.0, help="wall-clock limit per GPU count, seconds")
    ap.add_argument("--prefix", default="", help="prefix of the trace files' names (e.g. h200x2-)")
    args = ap.parse_args()
    t0 = time.monotonic()
    meta = run_meta(shlex.join(["python3", *sys.argv]))
    ceiling = fp32_ceiling_tflops()
    meta["fp32_ceiling_tflops"] = ceiling
    print(f"measured fp32 matmul ceiling: {ceiling:.1f} TFLOP/s per GPU", flush=True)
    seed = int.from_bytes(os.urandom(4), "little")
    meta["seed"] = seed
    everything = []
    for p in args.gpus:
        cases = []
        if "checks" in args.suite:
            cases += check_cases(p, seed, args.prefix)
        if "bench" in args.suite:
            cases += bench_cases(p, args.points, args.prefix)
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
        keys = ("routing_equal", "counts_equal", "weight_max_abs_err", "rel_err", "dropped", "nan",
                "telemetry_same_output", "sm_utilization", "raised", "seconds_to_raise", "error", "failed")
        print(r["name"], {k: r[k] for k in keys if k in r}, flush=True)
    print(f"commit {meta['commit']}, {', '.join(meta['gpus_seen'])}, driver {meta['driver']}, "
          f"fp32 ceiling {ceiling:.1f} TFLOP/s per GPU")
    print(table(everything, ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
