"""`moelab calibrate`: fit the hardware preset's figures to a GPU's microbenchmarks.

Reads measurements/calibration-<gpu>.json (written by benchmarks/calibrate_gpu.py from
gpu/microbench.py) and fits, on those microbenchmarks only (never on the layer runs that
`moelab compare` predicts):

- blocks_per_sm: the megakernel's resident blocks per SM (its grid over the SMs);
- matrix_efficiency, task_overhead_ns: least squares of the tile GEMM task time at the
  megakernel's grid against the task's FLOPs (full and short tiles, GEMM0 and GEMM1):
  time = overhead + flops / block rate, block rate = peak x efficiency / blocks;
- copy_ns_per_byte: a block's copy_rows time per byte at 128 concurrent blocks;
- put_local_ns_per_byte, put_nvlink_ns_per_byte: the dispatch of a tile (pack + put, per row
  byte) minus its packing;
- reduce_ns_per_byte: the final ordered combine's time per block over the bytes it moves;
- gate_item_ns_per_h, gate_slot_ns, gate_fixed_ns: least squares of the gate phase over tokens
  and experts against the kernel's work items and slot scans (sim.costs.gate_ns);
- handoff_ns, subscriber_ns: the processors' median gap between tasks and the shortest tenth of
  the arrival-to-first-task delays, from the megakernel's telemetry on a small layer;
- nvlink_latency_ns: half a bare-signal round trip between two GPUs; nvlink_gbps: the largest
  aggregate put bandwidth to the peer.

Writes a calibration preset (`{"base": preset, field: value, "sources": {field: how}}`) that
`sim.hardware.get` loads, and prints every fit with its residuals.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import costs
from .hardware import PRESETS, HardwareError, from_dict

MEASUREMENTS = Path(__file__).resolve().parent.parent / "measurements"
GPU_PRESET = {"h100": "h100-sxm", "h200": "h200-sxm"}
COPY_BLOCKS = 128  # the dispatch's concurrency at the FlashMoE default: one tile per block


class CalibrationError(ValueError):
    """A calibration file that lacks what a fit needs."""

    def __init__(self, name: str, value, allowed: str):
        self.field, self.value, self.allowed = name, value, allowed
        super().__init__(f"calibration field '{name}' = {value!r} is not allowed: {allowed}")


@dataclass
class Fit:
    """Fitted figures, where each came from, and (point, measured, fitted) residual rows."""

    values: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    residuals: list = field(default_factory=list)

    def set(self, name: str, value: float, how: str) -> None:
        self.values[name] = value
        self.sources[name] = how

    def check(self, point: str, measured: float, fitted: float) -> None:
        self.residuals.append((point, measured, fitted))


def gpu_tag(name: str) -> str:
    for tag in GPU_PRESET:
        if tag in name.lower():
            return tag
    raise CalibrationError("meta.gpu", name, "an H100 or H200 (the GPUs with a preset: " + ", ".join(PRESETS) + ")")


def _need(raw: dict, key: str, what: str):
    v = raw.get(key)
    if not v:
        failed = raw.get("failed", {}).get(key, "").splitlines()[:1]
        raise CalibrationError(key, v, what + (f" (the microbenchmark failed: {failed[0]})" if failed else ""))
    return v


def fit(raw: dict, base: str, origin: str) -> Fit:
    """Every fitted figure of preset `base` from one calibration file's microbenchmarks."""
    if base not in PRESETS:
        raise CalibrationError("base", base, "one of " + ", ".join(PRESETS))
    hw = PRESETS[base]
    f = Fit()
    occ = _need(raw, "occupancy", "the megakernel's grid and SMs")
    sms, grid = int(occ.get("sms") or raw.get("sms") or 0), int(occ.get("megakernel_grid") or 0)
    if sms < 1 or grid < sms:
        raise CalibrationError("occupancy", occ, "sms >= 1 and megakernel_grid >= sms")
    f.set("sms", sms, f"{origin}: the device's multiprocessor count")
    f.set("blocks_per_sm", grid // sms, f"{origin}: the megakernel's occupancy, grid {grid} over {sms} SMs")
    blocks = grid // sms * sms
    _fit_gemm(f, raw, hw, blocks, origin)
    _fit_moves(f, raw, origin)
    _fit_gate(f, raw, blocks, origin)
    _fit_scheduler(f, raw, origin)
    _fit_link(f, raw, origin)
    return f


def _fit_gemm(f: Fit, raw: dict, hw, blocks: int, origin: str) -> None:
    pts = [g for g in _need(raw, "gemm", "tile GEMM task times") if g["blocks"] >= blocks]
    if len({g["flops"] for g in pts}) < 2:
        raise CalibrationError("gemm", len(pts), "tasks of two tile heights at the megakernel's grid")
    x = np.array([g["flops"] for g in pts], np.float64)
    y = np.array([g["ns_per_task"]["median"] for g in pts])
    slope, intercept = np.polyfit(x, y, 1)
    rate = 1.0 / slope  # flops per ns of one block
    eff = rate * blocks / (hw.tflops_float32 * 1e3)
    f.set("matrix_efficiency", float(min(eff, 1.0)), f"{origin}: tile GEMM tasks at the megakernel's grid, least "
          f"squares over {len(pts)} points: {rate:.1f} FLOP/ns per block x {blocks} blocks / fp32 peak")
    f.set("task_overhead_ns", float(max(intercept, 0.0)), f"{origin}: the same fit's intercept")
    for g, yy in zip(pts, y):
        f.check(f"{g['task']} {g['rows']} rows, {g['blocks']} blocks (ns)", yy, intercept + g["flops"] * slope)
    for g in raw["gemm"]:
        if g["blocks"] == 1:
            f.check(f"{g['task']} {g['rows']} rows, 1 block alone (ns; not fitted)", g["ns_per_task"]["median"],
                    intercept + g["flops"] * slope)


def _fit_moves(f: Fit, raw: dict, origin: str) -> None:
    copies = [c for c in _need(raw, "copy", "copy_rows times") if c["blocks"] == COPY_BLOCKS]
    if not copies:
        raise CalibrationError("copy", [c["blocks"] for c in raw["copy"]], f"a point at {COPY_BLOCKS} blocks")
    per_byte = [c["ns_per_copy"]["median"] / c["bytes"] for c in copies]
    copy = float(np.mean(per_byte))
    f.set("copy_ns_per_byte", copy, f"{origin}: copy_rows of one tile by each of {COPY_BLOCKS} blocks, mean of "
          "plain and weighted copies")
    for c in copies:
        f.check(f"copy_rows {c['bytes']} B{' weighted' if c['scaled'] else ''}, {COPY_BLOCKS} blocks (ns)",
                c["ns_per_copy"]["median"], copy * c["bytes"])
    for d in _need(raw, "dispatch", "dispatch tile times"):
        name = {"self": "put_local_ns_per_byte", "nvlink": "put_nvlink_ns_per_byte"}[d["peer"]]
        per_row = d["ns_per_row"]["median"] / d["bytes_per_row"]
        f.set(name, float(max(per_row - copy, 0.0)), f"{origin}: dispatch_tile to {d['peer']} ({d['tiles']} tiles, "
              f"{d['concurrent_blocks']} blocks at once) per row byte, minus copy_ns_per_byte")
        rows = d["rows"]["median"]
        f.check(f"dispatch tile of {rows:.0f} rows to {d['peer']} (ns)", d["ns_per_tile"]["median"],
                rows * d["bytes_per_row"] * (copy + f.values[name]))
    for p in raw.get("put", []):
        if p["blocks"] == COPY_BLOCKS and p["bytes"] == 1 << 20:
            name = {"self": "put_local_ns_per_byte", "nvlink": "put_nvlink_ns_per_byte"}[p["peer"]]
            if name in f.values:
                f.check(f"bare put 1 MiB to {p['peer']}, {COPY_BLOCKS} blocks (ns; not fitted)",
                        p["ns_per_put"]["median"], p["bytes"] * f.values[name])
    comb = _need(raw, "combine", "the final combine's time per block")[0]
    warps = comb["n_proc"] * costs.REDUCE_WARPS
    moved = math.ceil(comb["tokens"] / warps) * costs.REDUCE_WARPS * (comb["top_k"] + 1) * comb["hidden"] * 4
    f.set("reduce_ns_per_byte", comb["ns_per_block"]["median"] / moved,
          f"{origin}: the ordered combine of {comb['tokens']} tokens over {comb['n_proc']} processors, per byte")


def _fit_gate(f: Fit, raw: dict, blocks: int, origin: str) -> None:
    pts = _need(raw, "gate", "gate phase times")
    if len(pts) < 3:
        raise CalibrationError("gate", len(pts), "at least 3 (tokens, experts) points")
    rows = []
    for g in pts:
        grid = g.get("grid", blocks)
        waves = math.ceil(math.ceil(g["tokens"] / costs.GATE_TOKENS) / grid)
        items = waves * math.ceil(g["experts"] / costs.GATE_EXPERTS)
        slots = math.ceil(g["experts"] / grid) * g["tokens"] * g["top_k"]
        rows.append((items * g["hidden"], slots, 1.0))
    a = np.array(rows, np.float64)
    y = np.array([g["ns"] for g in pts])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    coef = np.maximum(coef, 0.0)
    names = ("gate_item_ns_per_h", "gate_slot_ns", "gate_fixed_ns")
    for name, c in zip(names, coef):
        f.set(name, float(c), f"{origin}: gate phase over {len(pts)} (tokens, experts) points, least squares of "
              "time = items x H x a + slot scans x b + c")
    for g, row in zip(pts, a):
        f.check(f"gate T={g['tokens']} E={g['experts']} (ns)", g["ns"], float(row @ coef))


def _fit_scheduler(f: Fit, raw: dict, origin: str) -> None:
    s = _need(raw, "scheduler", "the megakernel's task gaps")
    if not s.get("gap_ns") or not s.get("arrival_to_first_task_ns"):
        raise CalibrationError("scheduler", sorted(s), "gap_ns and arrival_to_first_task_ns")
    f.set("handoff_ns", s["gap_ns"]["median"], f"{origin}: median gap between a processor's tasks "
          f"({s['tasks']} tasks of a small layer)")
    f.set("subscriber_ns", s["arrival_to_first_task_ns"]["p10"], f"{origin}: tenth percentile of a tile's "
          "arrival to its first task (processors idle)")


def _fit_link(f: Fit, raw: dict, origin: str) -> None:
    pings = [p for p in raw.get("pingpong", []) if not p.get("failed")]
    bare = [p for p in pings if p["bytes"] == 0]
    if bare:
        f.set("nvlink_latency_ns", bare[0]["round_trip_ns"] / 2, f"{origin}: half a bare-signal round trip")
        for p in pings:
            if p["bytes"]:
                f.check(f"put-with-signal round trip {p['bytes']} B, 1 block (ns; not fitted)", p["round_trip_ns"],
                        2 * (f.values["nvlink_latency_ns"] + p["bytes"] * f.values.get("put_nvlink_ns_per_byte", 0.0)))
    remote = [p for p in raw.get("put", []) if p["peer"] == "nvlink"]
    if remote:
        best = max(remote, key=lambda p: p["aggregate_gbps"])
        f.set("nvlink_gbps", best["aggregate_gbps"], f"{origin}: the largest aggregate put-with-signal bandwidth to "
              f"the peer ({best['blocks']} blocks x {best['bytes']} B)")


def preset_json(f: Fit, base: str, name: str) -> dict:
    return {"base": base, "name": name, **f.values, "sources": f.sources}


def report(f: Fit) -> str:
    from reference.cli import format_table

    fitted = format_table(("figure", "value", "from"), [(k, f"{v:.6g}", f.sources[k]) for k, v in f.values.items()])
    res = format_table(("point", "measured", "model", "residual %"),
                       [(p, f"{m:.6g}", f"{y:.6g}", f"{100 * (y - m) / m:+.1f}" if m else "")
                        for p, m, y in f.residuals])
    return f"fitted figures\n{fitted}\n\nresiduals (model - measured) / measured\n{res}"


def calibrate(path: Path, base: str | None = None, out: Path | None = None) -> tuple[Path, Fit]:
    """Fit `path`'s microbenchmarks on preset `base` (default: the file's GPU); write `out`."""
    if not path.is_file():
        raise CalibrationError("calibration", str(path), "an existing measurements/calibration-<gpu>.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CalibrationError("calibration", str(path), f"well-formed JSON ({e})") from e
    tag = gpu_tag(raw.get("meta", {}).get("gpu", ""))
    base = base or GPU_PRESET[tag]
    out_tag = next((t for t, p in GPU_PRESET.items() if p == base), tag)
    out = out or MEASUREMENTS / f"calibrated-{out_tag}.json"
    origin = _relative(path)
    f = fit(raw, base, origin)
    doc = preset_json(f, base, f"{base}+calibrated({path.stem})")
    from_dict(doc, origin=str(out))  # the file must load as a preset
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out, f


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(MEASUREMENTS.parent))
    except ValueError:
        return str(path)


def cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        out, f = calibrate(Path(args.calibration), args.base, Path(args.out) if args.out else None)
    except (CalibrationError, HardwareError) as e:
        print(f"moelab calibrate: error: {e}", file=sys.stderr)
        return 2
    print(report(f))
    print(f"\nwrote {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the hardware preset to a GPU's microbenchmarks",
                       description="Fit the simulator's hardware figures to the microbenchmarks in a "
                                   "measurements/calibration-<gpu>.json file, print the fit and its residuals, and "
                                   "write a calibrated preset (loadable by sim.simulate(hardware=...)).")
    p.add_argument("--calibration", default=str(MEASUREMENTS / "calibration-h200.json"), metavar="FILE",
                   help="the microbenchmarks (default: measurements/calibration-h200.json)")
    p.add_argument("--base", choices=sorted(PRESETS), help="the preset to start from (default: the file's GPU)")
    p.add_argument("--out", metavar="FILE", help="where to write it (default: measurements/calibrated-<gpu>.json, "
                                                 "<gpu> of the base preset)")
    p.set_defaults(func=cmd_calibrate)
