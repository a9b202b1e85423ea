"""Run the calibration microbenchmarks (gpu/microbench.py) of the builds and write measurements/calibration-<gpu>.json.

    python benchmarks/calibrate_gpu.py --gpus 2 --out OUT_DIR --commit SHA

Runs the float32 build's microbenchmarks, then the bf16 build's, then the split TF32 one's (tf32x3:
float32 data on the warpgroup GEMM) (one job each; on more than one
GPU each build's layer pieces, scheduler layers and in-layer timings run once more on one GPU alone, so
the dispatch's local stores are timed without NVLink stores beside them and the latencies around
idle processors without a peer's late counts: those are fitted from these), and writes
OUT_DIR/calibration-<gpu>.json: GPU, driver, commit, command and date under "meta", the float32
build's sections at the top level (as before bf16 existed), the bf16 build's under "bfloat16" and
the tf32x3 build's under "tf32x3" (each its tile shape, gemm, copy, gate, dispatch, combine,
scheduler, in_layer; puts and ping-pongs move bytes whatever the build and are measured once, by
the float32 job). Prints a short table of the figures the simulator's calibration fits.
`--from-raw DIR` rebuilds the file and the table from a saved DIR/raw-<dtype>/results.json without
a GPU (a build whose raw results are not there is left out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reference.cli import format_table  # noqa: E402


def gpu_tag(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (the file name's GPU part)."""
    for tag in ("h200", "h100", "b200", "a100"):
        if tag in name.lower():
            return tag
    return "".join(ch for ch in name.lower().split()[-1] if ch.isalnum()) or "gpu"


def driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def table(raw: dict, label: str = "") -> str:
    rows = []
    for g in raw.get("gemm", []):
        rows.append((f"{g['task']} task, {g['rows']} rows, {g.get('tiles_per_expert', 2)}/expert, {g['blocks']} blocks",
                     "µs/task", g["ns_per_task"]["median"] / 1e3))
    for c in raw.get("copy", []):
        if not c["scaled"]:
            rows.append((f"copy_rows 1 tile, {c['blocks']} blocks", "GB/s/block",
                         2 * c["bytes"] / c["ns_per_copy"]["median"]))
    for c in raw.get("copy_nvlink") or []:
        rows.append((f"copy_rows 1 tile into the peer, {c['blocks']} blocks", "GB/s/block",
                     c["bytes"] / c["ns_per_copy"]["median"]))
    for p in raw.get("put", []):
        if p["bytes"] == 1 << 20:
            rows.append((f"put 1 MiB to {p['peer']}, {p['blocks']} blocks", "GB/s (all)", p["aggregate_gbps"]))
    for p in raw.get("pingpong", []):
        rows.append((f"round trip, {p['bytes']} B{' (signal)' if not p['bytes'] else ''}", "µs",
                     p["round_trip_ns"] / 1e3))
    for g in raw.get("gate", []):
        rows.append((f"gate phase T={g['tokens']} E={g['experts']} k={g['top_k']}", "µs", g["ns"] / 1e3))
    for d in raw.get("dispatch", []):
        # files before the kernel stored dispatched rows timed whole tiles, packed and put
        n, what = d.get("shares", d.get("tiles")), "shares" if "shares" in d else "tiles"
        world = f", {d['world']} GPU(s)" if "world" in d else ""
        rows.append((f"dispatch ({d.get('path', 'put')}) to {d['peer']}{world} ({n} {what})", f"µs/{what[:-1]}",
                     d["ns_per_tile"]["median"] / 1e3))
    for c in raw.get("combine", []):
        rows.append((f"ordered combine T={c['tokens']}", "µs/block", c["ns_per_block"]["median"] / 1e3))
    for c in raw.get("in_layer", []):
        by = c.get("gemm_by_source")
        if by:  # the two-GPU layer: its GEMM tasks by their tile's source
            for task, v in by.items():
                rows.append((f"in layer T={c['tokens']}, {c['world']} GPU(s): {task} of a peer's tile beyond own",
                             "µs/task", (v["peer"]["median"] - v["home"]["median"]) / 1e3))
            continue
        mib = c["inflight_bytes"] / 2 ** 20
        rows.append((f"in layer T={c['tokens']}, {c['world']} GPU(s): dispatch share, {mib:.1f} MiB in flight",
                     "µs/share", c["dispatch_ns"]["median"] / 1e3))
        rows.append((f"in layer T={c['tokens']}, {c['world']} GPU(s): final combine", "µs/block",
                     c["final_combine_ns"]["median"] / 1e3))
        if c.get("tile_combine_ns", {}).get("n"):
            rows.append((f"in layer T={c['tokens']}, {c['world']} GPU(s): per-tile combine", "µs/task",
                         c["tile_combine_ns"]["median"] / 1e3))
    s = raw.get("scheduler") or {}
    if s.get("gap_ns"):
        rows.append(("scheduler hand-off gap", "µs", s["gap_ns"]["median"] / 1e3))
    if s.get("arrival_to_first_task_ns"):
        rows.append(("tile arrival to first task", "µs", s["arrival_to_first_task_ns"]["median"] / 1e3))
    for key, where in (("idle", ""), ("idle_one_gpu", ", one GPU")):
        idle = s.get(key) or {}
        for name, what in (("first_task_ns", "signal to first task"), ("assign_ns_per_task", "first round, per task")):
            if name in idle:
                rows.append((f"small layer{where}: {what}", "µs", idle[name] / 1e3))
        if "stop_ns" in idle:
            rows.append((f"small layer{where}: last task to final combine", "µs", idle["stop_ns"]["median"] / 1e3))
    for name, err in raw.get("failed", {}).items():
        rows.append((f"FAILED {name}", "", err.splitlines()[0][:60]))
    return format_table((f"microbenchmark{label}", "unit", "value"), rows)


# the builds measured, each with its share of --timeout (the float32 job also times the byte moves)
BUILDS = (("float32", 0.4), ("bfloat16", 0.3), ("tf32x3", 0.3))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--out", default="artifacts/calibration")
    ap.add_argument("--commit", default="unknown",
                    help="the commit measured (the copy on the GPU machine may have no .git)")
    ap.add_argument("--timeout", type=float, default=370.0, help="wall-clock limit of both jobs, seconds")
    ap.add_argument("--from-raw", metavar="DIR", help="rebuild from DIR/raw-<dtype>/results.json (no GPU)")
    args = ap.parse_args()
    if args.gpus not in (1, 2):
        # the NVLink ping-pong and the two-GPU layer pair rank r with 1 - r
        ap.error(f"--gpus {args.gpus}: 1 or 2 (the NVLink figures are measured between two GPUs)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(dtype, share) for dtype, share in BUILDS
            if not args.from_raw or (Path(args.from_raw) / f"raw-{dtype}" / "results.json").is_file()]
    raw = {dtype: collect(args, out, dtype, share) for dtype, share in jobs}
    fp32 = raw["float32"]
    meta = {"gpu": next((r["gpu"] for r in raw.values() if r.get("gpu")), "unknown"), "gpus": args.gpus,
            "driver": driver(), "commit": args.commit, "command": " ".join(["python", *sys.argv]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "producer": "gpu/microbench.py (kernels/microbench.cu), " + ", ".join(raw) + " builds"}
    drop = ("gpu", "dtype")
    doc = {"meta": meta, **{k: v for k, v in fp32.items() if k not in drop},
           **{dtype: {k: v for k, v in r.items() if k not in drop} for dtype, r in raw.items() if dtype != "float32"}}
    path = out / f"calibration-{gpu_tag(meta['gpu'])}.json"
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")  # compact: ~0.5 MB of numbers
    print(f"wrote {path}")
    for dtype, r in raw.items():
        print(table(r, f" ({dtype})"))
    return 0


def collect(args: argparse.Namespace, out: Path, dtype: str, share: float) -> dict:
    """`dtype`'s microbenchmark results on args.gpus GPUs, with the dispatch shares of its layer
    pieces and its in-layer timings on one GPU alone added where args.gpus > 1 (each says its
    world), and the one-GPU scheduler layer's idle latencies as scheduler.idle_one_gpu."""
    if args.gpus == 1:
        return run_job(args, out, dtype, f"raw-{dtype}", 1, args.timeout * share)
    raw = run_job(args, out, dtype, f"raw-{dtype}", args.gpus, args.timeout * share * 0.75)
    alone = run_job(args, out, dtype, f"raw-{dtype}-alone", 1, args.timeout * share * 0.25,
                    ("layer_pieces", "scheduler", "in_layer"))
    for key in ("dispatch", "in_layer"):
        raw.setdefault(key, []).extend(alone.get(key, []))
    if "idle" in alone.get("scheduler", {}) and "scheduler" in raw:
        raw["scheduler"]["idle_one_gpu"] = alone["scheduler"]["idle"]
    raw.setdefault("failed", {}).update({f"{k} (one GPU)": v for k, v in alone.get("failed", {}).items()})
    return raw


def run_job(args: argparse.Namespace, out: Path, dtype: str, name: str, gpus: int, timeout_s: float,
            sections: tuple[str, ...] | None = None) -> dict:
    """One microbenchmark job's results (saved under `name`/), or what rank 0 saved before a
    failure, or the failure alone."""
    saved = Path(args.from_raw or out) / name / "results.json"
    if args.from_raw:
        return json.loads(saved.read_text()) if saved.is_file() else {"failed": {"job": f"{saved} missing"}}
    from gpu import microbench, spawn

    try:
        return microbench.collect(gpus, saved.parent, timeout_s=timeout_s, dtype=dtype,
                                  sections=sections or microbench.SECTIONS)
    except spawn.SpawnError as e:  # whatever rank 0 saved before the failure still counts, and so does the failure
        print(f"microbenchmarks ({dtype}, {gpus} GPU(s)): {e}", flush=True)
        got = json.loads(saved.read_text()) if saved.is_file() else {}
        got.setdefault("failed", {})["job"] = str(e)
        return got


if __name__ == "__main__":
    sys.exit(main())
