"""The GPU matrix: build, check and time the megakernel against the golden and the torch layer.

    python benchmarks/bench_gpu.py --gpus 1 2 4 --suite checks bench --out OUT_DIR

`checks`: small configs against the float64 golden (fresh seeds, skewed routing, all tokens to one
expert, capacity dropping, T not a multiple of tile_m, E = P and E = 8P, every gate and
activation the kernel supports), telemetry on/off, and a rank that sits out (the others must
time out and raise). `bench`: the FlashMoE default and its token/expert sweeps, kernel vs the
torch layer (float32 and bf16), random inputs drawn on the GPU, checked against the torch layer.
Writes OUT_DIR/gpus-N/results.json and traces, and prints one table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
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


def flops(cfg: dict) -> float:
    """Expert FLOPs of one layer call over all ranks (2 GEMMs, kept rows ~ T k P when cf = 1)."""
    return 4.0 * cfg["tokens"] * cfg["top_k"] * cfg["ranks"] * cfg["hidden"] * cfg["ffn"]


def table(all_results: list[dict], ceiling: float) -> str:
    rows = []
    for r in all_results:
        if "kernel_ms" not in r:
            continue
        c = r["config"]
        tf = flops(c) / (r["kernel_ms"] * 1e-3) / 1e12
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
    args = ap.parse_args()
    t0 = time.monotonic()
    ceiling = fp32_ceiling_tflops()
    print(f"measured fp32 matmul ceiling: {ceiling:.1f} TFLOP/s per GPU", flush=True)
    seed = int.from_bytes(os.urandom(4), "little")
    everything = []
    for p in args.gpus:
        cases = []
        if "checks" in args.suite:
            cases += check_cases(p, seed)
        if "bench" in args.suite:
            cases += bench_cases(p, args.points)
        if "sitout" in args.suite and p > 1:
            cases.append(sit_out_case(p))
        out = Path(args.out) / f"gpus-{p}"
        left = args.timeout - (time.monotonic() - t0)
        try:
            results = spawn.run(cases, p, out, timeout_s=max(left, 30))
        except spawn.SpawnError as e:
            print(f"gpus={p}: {e}", flush=True)
            results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else []
        everything += results
    meta = {"command": " ".join(sys.argv), "seed": seed, "fp32_ceiling_tflops": ceiling,
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    try:
        import torch

        meta["gpu"] = torch.cuda.get_device_name(0)
        meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout.strip().splitlines()[0]
    except Exception as e:  # the table still prints
        meta["gpu_info_error"] = str(e)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps({"meta": meta, "results": everything}, indent=1,
                                                            default=str))
    checks = [r for r in everything if r["name"].startswith(("check", "sit"))]
    for r in checks:
        keys = ("routing_equal", "counts_equal", "weight_max_abs_err", "rel_err", "dropped", "nan",
                "telemetry_same_output", "sm_utilization", "raised", "seconds_to_raise", "error", "failed")
        print(r["name"], {k: r[k] for k in keys if k in r}, flush=True)
    print(table(everything, ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
