"""`moelab calibrate`: fit the hardware preset's figures to a GPU's microbenchmarks.

Reads measurements/calibration-<gpu>.json (written by benchmarks/calibrate_gpu.py from
gpu/microbench.py) and fits, on those microbenchmarks only (never on the layer runs that
`moelab compare` predicts):

- blocks_per_sm: the megakernel's resident blocks per SM (its grid over the SMs);
  warpgroups_per_block: the build's 128-thread units per block (its tile options);
- matrix_efficiency, gemm_fixed_ns, weight_load_ns_per_byte, gemm_row_group, gemm_overlap_power:
  the tile GEMM task as fixed cost + flops / block rate (its rows in whole groups where the
  multiply computes them so) + its weight slice's bytes over the tiles sharing it x per byte, the
  last two added or, where a p-norm of them fits markedly better, overlapped
  (sim.costs.overlapped), least squares over tile heights (GEMM0 and GEMM1): the megakernel's own
  tasks on the in_layer layers, or, in files without them, the microbenchmark's at the
  megakernel's grid; task_overhead_ns is 0 (each measurement times a whole task body);
- copy_nvlink_ns_per_byte: copy_rows of a tile into the NVLink peer's memory by one block alone (the
  staged dispatch's senders; checked at up to 32 blocks against its rate or their port share), 0
  where not measured;
- l2_knee_bytes, copy_*, put_local_*: copy_rows of a tile and its put to the block's own GPU by
  1 to all blocks at once: time per byte = alone while the bytes all blocks move at once fit in
  the L2 (up to the knee), + extra x beyond / (beyond + half) for the bytes beyond it;
- put_nvlink_ns_per_byte, nvlink_gbps: a put over NVLink by one block alone, and the largest
  aggregate to the peer; the dispatch microbenchmark (the kernel's dispatch at the layer's
  concurrency) is checked against all these;
- return_store_ns_per_byte: on two GPUs, inside the megakernel on a layer no measured run uses
  (6144 tokens a GPU), how much longer a GEMM1 task of a peer's tile takes than one of its own
  GPU's (it stores its output over NVLink), less the same difference of GEMM0's, per byte of its
  output; put_nvlink_ns_per_byte in files without that layer;
- dispatch_store_fixed_ns, dispatch_store_l2_ns_per_byte, dispatch_store_ns_per_byte,
  dispatch_store_knee_bytes: a share stored into this GPU's inbox on one GPU alone (its stores
  drain before the tile's signal: slower per byte than copy_rows; on two GPUs the local shares
  are held to the NVLink ones' pace, which the model checks, not fits), timed inside the
  megakernel on layers no measured run uses (the in_layer section: 768 to 24576 tokens, and 7168
  over 8 experts): fixed + the round's mean share x (the L2's rate up to a knee in the bytes in
  flight, HBM's beyond); files without those layers fit fixed + bytes x one rate on the dispatch
  microbenchmark;
- tile_combine_fixed_ns, tile_combine_ns_per_byte, tile_combine_l2_ns_per_byte,
  tile_combine_knee_bytes: the float32 kernel's per-tile combine task on the same in-layer layers
  (one block weights a returned tile beside the GEMMs), fixed + its bytes at the L2's rate for
  the share of the layer's returned bytes the L2 holds and HBM's for the rest; 0 (copy_rows'
  rate alone) for the bf16 build and files without those layers;
- reduce_fixed_ns, reduce_ns_per_byte, reduce_l2_ns_per_byte, reduce_knee_bytes: the final
  ordered combine's time per block, fixed + the bytes it moves at the L2's rate for the share of
  all blocks' bytes the L2 holds and HBM's for the rest, on the same in-layer layers (the rows
  GEMM1 just wrote); files without them fit the microbenchmark at 1K-16K tokens with no fixed
  time and the copies' knee;
- gate_item_ns_per_h, gate_slot_ns, gate_fixed_ns, gate_split_ns, gate_select_smem_ns, gate_select_global_ns:
  least squares of the gate phase over tokens, experts and top_k against the kernel's work items, top-k
  selections and slot scans (sim.costs.gate_ns; a selection figure only where the points vary top_k);
- handoff_ns: the processors' median gap between tasks, from the megakernel's telemetry on a
  12K-token layer (its shortest arrival-to-first-task delay is printed beside the preset's
  subscriber_ns, not fitted: that delay waits for a processor too);
- wake_ns, assign_ns, stop_ns: on a 1.5K-token layer on one GPU (processors idle), the first
  task's start after its tile's signal (less subscriber_ns), the first round's spacing per task,
  and the final combine's start after the last task;
- nvlink_latency_ns: half a bare-signal round trip between two GPUs.

The file's top level is the float32 kernel build's microbenchmarks; its "bfloat16" section (when
measured) the bf16 build's, fitted the same way: the matrix rate against the BF16 peak, rows of
2-byte elements, the gate on bf16 tokens, the bf16 layer's scheduler; its "tf32x3" section (when
measured) the split TF32 build's: float32 rows, the matrix rate against a third of the TF32 peak;
puts and ping-pongs move bytes whatever the build, so those fits take them from the top level.

Writes a calibration preset (`{"base": preset, field: value, "sources": {field: how}, "dtypes":
{"float32": {"tile": [bM, bN, bK]}, "bfloat16": {"tile": [...], field: value, "sources": ...}}}`,
see sim/hardware.py) that `sim.hardware.get` loads, and prints every fit with its residuals.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reference.files import FileError, check_output, read_json
from reference.plan import LOCAL, NVLINK

from . import costs
from .hardware import DTYPES, PRESETS, HardwareError, from_dict

MEASUREMENTS = Path(__file__).resolve().parent.parent / "measurements"
GPU_PRESET = {"h100": "h100-sxm", "h200": "h200-sxm"}
BF16 = "bfloat16"  # the file's section of the bf16 kernel build
BYTE_SECTIONS = ("put", "pingpong")  # measured once (float32 job): NVSHMEM moves bytes whatever the dtype


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


def fit(raw: dict, base: str, origin: str, dtype: str = "float32") -> Fit:
    """Every fitted figure of preset `base` from one kernel build's microbenchmarks (`dtype`'s)."""
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
    wgs = int((raw.get("tile") or {}).get("BLOCK_WARPGROUPS", 1))
    f.set("warpgroups_per_block", wgs, f"{origin}: the build's warpgroups per block (its tile options)")
    blocks = grid // sms * sms
    _fit_gemm(f, raw, hw, blocks, origin, dtype)
    _fit_latency(f, raw, origin)
    _fit_moves(f, raw, hw, base, origin, dtype)
    _fit_return_store(f, raw, origin)
    _fit_gate(f, raw, blocks * wgs, wgs, origin)
    _fit_scheduler(f, raw, hw, origin)
    _check_round_trips(f, raw)
    return f


def fit_dtype(raw: dict, dtype: str, base: str, origin: str) -> Fit:
    """The fit of `dtype`'s build: its section of the file, with the top level's byte moves."""
    section = raw.get(dtype)
    if not isinstance(section, dict):
        raise CalibrationError(dtype, section, f"an object of the {dtype} build's microbenchmarks")
    merged = {**{k: raw[k] for k in BYTE_SECTIONS if k in raw}, **section}
    try:
        return fit(merged, base, f"{origin} ({dtype} build)", dtype)
    except CalibrationError as e:
        raise CalibrationError(f"{dtype}.{e.field}", e.value, e.allowed) from e


def tile_of(raw: dict, where: str) -> list[int]:
    """The [bM, bN, bK] a build's microbenchmarks ran at (its compile options)."""
    t = raw.get("tile") or {}
    shape = [t.get(k) for k in ("TILE_M", "TILE_N", "TILE_K")]
    if not all(isinstance(v, int) and v > 0 for v in shape):
        raise CalibrationError(f"{where}tile", raw.get("tile"), "the build's TILE_M, TILE_N and TILE_K")
    return shape


# a row group is looked for only where the straight line misses a measured task by more than this
# (the microbenchmark's medians repeat within 1-2% between calls)
LINE_MISS = 0.02
ROW_GROUPS = (16, 32, 64)  # the row groups a tile GEMM may compute in (its threads' rows x their count)
OVERLAP_POWERS = (1.5, 2.0, 3.0, 4.0)  # p-norms of a GEMM task's multiply and weight load the fit tries
OVERLAP_GAIN = 0.1  # the share of the added form's squared residuals a p-norm must take off to be kept
IN_LAYER_TASKS = 4  # tasks of one (kind, height, sharing) in a layer that make it a point of the fit


def _gemm_points(raw: dict, blocks: int) -> tuple[list[dict], str]:
    """The tile GEMM tasks the fit takes: the megakernel's own, on the in_layer layers of one GPU
    where IN_LAYER_MIN or more timed them (tasks out of step, as in a measured layer), else the
    microbenchmark's at the megakernel's grid (every block in step)."""
    layers = [c for c in raw.get("in_layer") or [] if c.get("world", raw.get("world")) == 1 and c.get("gemm")]
    if len(layers) >= IN_LAYER_MIN:
        pts = [g for c in layers for g in c["gemm"] if g["ns_per_task"]["n"] >= IN_LAYER_TASKS]
        return pts, f"the megakernel's own tasks on layers of {_tokens(layers)} tokens (no measured run's size)"
    pts = [g for g in _need(raw, "gemm", "tile GEMM task times") if g["blocks"] >= blocks]
    return pts, "the microbenchmark's tasks at the megakernel's grid"


def _fit_gemm(f: Fit, raw: dict, hw, blocks: int, origin: str, dtype: str) -> None:
    """time = fixed + flops / block rate + weight bytes alone x per byte, least squares over the
    tile heights and the tiles per expert sharing each weight slice (the rate at most the
    dtype's peak; weight bytes alone: the task's slice over the tiles sharing it), the rows
    computed in whole groups where the kernel's multiply does: the float32 SIMT GEMM gives each
    thread 4 rows of every 64, so its 32-row tasks take about as long as its 64-row
    ones. A group among ROW_GROUPS is kept where the straight line misses a task by more than
    LINE_MISS and the group at least halves its squared residuals (the bf16 build's heights lie
    near the line). The tasks: _gemm_points; the microbenchmark's, where those are fitted, start
    in step on every block and ran their short tiles 10-13% longer than a layer's (H100).
    Files from before the sharing points (2 tiles per expert throughout) fit no weight term:
    their fixed cost holds it. With the weight term, each p-norm of OVERLAP_POWERS is fitted too
    (rate, fixed, per byte: _fit_overlap) and the best kept where it takes OVERLAP_GAIN or more
    off the added form's squared residuals: a slice streamed from HBM hides a short tile's
    multiply (one H200's bf16 tasks alone on their expert: 38-44 us for 13-128 rows)."""
    pts, which = _gemm_points(raw, blocks)
    pts = sorted(pts, key=lambda g: g["flops"])
    if len({g["flops"] for g in pts}) < 2:
        raise CalibrationError("gemm", len(pts), "tasks of two tile heights at the megakernel's grid")

    def alone(g):
        return g.get("weight_bytes", 0) / g.get("tiles_per_expert", 2)

    def computed(g_flops, g_rows, group):  # a task's FLOPs with its rows in whole groups
        return costs.grouped_rows(g_rows, group) * (g_flops / g_rows)

    x = np.array([g["flops"] for g in pts], np.float64)
    rows = np.array([g["rows"] for g in pts], np.float64)
    w = np.array([alone(g) for g in pts], np.float64)
    y = np.array([g["ns_per_task"]["median"] for g in pts])
    shared = len(set(w.tolist())) > 1
    one = np.ones_like(x)

    # each point weighs as many tasks as it holds (a layer's typical tasks, not its rare heights)
    sw = np.sqrt(np.array([g["ns_per_task"].get("n", 1) for g in pts], np.float64))

    def solve(group):
        a = np.column_stack([one, computed(x, rows, group)] + ([w] if shared else []))
        coef, *_ = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)
        return coef, float(np.sum(((a @ coef - y) * sw) ** 2)), float(np.max(np.abs(a @ coef - y) / y))

    tile_m = max(g["rows"] for g in pts)
    heights = sorted({g["rows"] for g in pts})
    coef, line_sse, line_miss = solve(1)
    group, sse = 1, line_sse
    for gr in ROW_GROUPS if line_miss > LINE_MISS else ():
        if gr < tile_m:
            c, e, _ = solve(gr)
            if c[1] > 0 and e <= line_sse / 2 and e < sse:
                group, coef, sse = gr, c, e
    peak = hw.tflops(dtype) * 1e3 / blocks  # flops per ns of one block at the dtype's peak
    rate = min(1.0 / coef[1], peak) if coef[1] > 0 else peak
    work = computed(x, rows, group)
    # the other terms again with the rate as capped, the multiply and the load added, then overlapped
    rest = [one] + ([w] if shared else [])
    sol, *_ = np.linalg.lstsq(np.column_stack(rest) * sw[:, None], (y - work / rate) * sw, rcond=None)
    fixed, per_byte = sol[0], (sol[-1] if shared else 0.0)
    power, added_sse = 1.0, float(np.sum((y - fixed - work / rate - per_byte * w) ** 2 * sw ** 2))
    best_sse = added_sse
    for pw in OVERLAP_POWERS if shared else ():
        r, fx, pb, e = _fit_overlap(work, w, y, sw ** 2, pw, peak)
        if e <= (1 - OVERLAP_GAIN) * added_sse and e < best_sse:
            power, rate, fixed, per_byte, best_sse = pw, r, fx, pb, e
    sharing = sorted({g.get("tiles_per_expert", 2) for g in pts})
    span = f"{heights[0]} to {heights[-1]}" if len(heights) > 4 else str(heights)
    f.set("matrix_efficiency", rate / peak, f"{origin}: slope of the tile GEMM task time over tile heights {span} "
          f"({which}){' beside the p-norm of gemm_overlap_power' if power > 1 else ''}: {rate:.0f} FLOP/ns per "
          f"block (capped at the {dtype} peak, {peak:.0f})")
    f.set("gemm_row_group", float(group) if group > 1 else 0.0,
          f"{origin}: the group of least squares among {list(ROW_GROUPS)} rows (the straight line missed a task by "
          f"{100 * line_miss:.0f}%; the group halves its squared residuals or more)" if group > 1 else
          f"{origin}: none (the straight line misses no task by more than {100 * LINE_MISS:.0f}%, or no group among "
          f"{list(ROW_GROUPS)} rows halves its squared residuals)")
    f.set("gemm_fixed_ns", max(float(fixed), 0.0), f"{origin}: the same tasks' time beyond their FLOPs at that rate"
          + (" and their weight loads" if shared else ""))
    f.set("weight_load_ns_per_byte", max(float(per_byte), 0.0),
          f"{origin}: the same least squares over {sharing} tiles per expert sharing each weight slice"
          if shared else f"{origin}: not measured (every task at 2 tiles per expert): in gemm_fixed_ns")
    f.set("gemm_overlap_power", power if power > 1 else 0.0,
          f"{origin}: the p-norm of multiply and load among {list(OVERLAP_POWERS)} of least squares over the same "
          f"tasks ({100 * (1 - best_sse / added_sse):.0f}% fewer squared residuals than the two added)"
          if power > 1 else f"{origin}: none (added: no p-norm among {list(OVERLAP_POWERS)} took "
          f"{100 * OVERLAP_GAIN:.0f}% off the squared residuals)" if shared else
          f"{origin}: not measured (no weight term): added")
    f.set("task_overhead_ns", 0.0, f"{origin}: 0, every microbenchmark times a whole task body (its overhead "
          "included); the gap between tasks is handoff_ns")

    def model(g):
        return f.values["gemm_fixed_ns"] + costs.overlapped(computed(g["flops"], g["rows"], group) / rate,
                                                            f.values["weight_load_ns_per_byte"] * alone(g), power)

    fitted = {id(g) for g in pts}
    for g in raw["gemm"] + [g for c in raw.get("in_layer") or [] for g in c.get("gemm", [])]:
        where = f"in layer {_layer(g)}, " if "tokens" in g else ""
        note = "" if id(g) in fitted else ", alone; not fitted" if g["blocks"] < blocks else "; not fitted"
        share = f", {g['tiles_per_expert']} tiles per expert" if g.get("tiles_per_expert", 2) != 2 else ""
        f.check(f"{where}{g['task']} {g['rows']} rows{share}, {g['blocks']} blocks (ns{note})",
                g["ns_per_task"]["median"], float(model(g)))
    layer = (raw.get("scheduler") or {}).get("task_ns")
    if layer:
        full = max(pts, key=lambda g: (g["flops"], g.get("tiles_per_expert", 2) == 2))
        f.check("megakernel task on the scheduler layer, median (ns; not fitted)", layer["median"], float(model(full)))


def _fit_overlap(work: np.ndarray, alone: np.ndarray, y: np.ndarray, weight: np.ndarray, power: float,
                 peak: float) -> tuple[float, float, float, float]:
    """rate, fixed and per byte of y = fixed + costs.overlapped(work / rate, per byte x alone,
    power) by weighted least squares, the rate at most `peak` (rate and per byte on log grids,
    narrowed around their best; fixed, given them, in closed form, at least 0): (rate, fixed, per
    byte, squared residuals)."""
    def solve(rates, per_bytes):
        base = costs.overlapped(work / rates[:, None, None], per_bytes[None, :, None] * alone, power)
        fixed = np.maximum(np.sum(weight * (y - base), axis=-1) / np.sum(weight), 0.0)
        return fixed, np.sum(weight * (y - fixed[..., None] - base) ** 2, axis=-1)

    rates, per_bytes = np.geomspace(peak / 30, peak, 41), np.geomspace(1e-5, 10.0, 61)
    for _ in range(5):
        _, sse = solve(rates, per_bytes)
        i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
        rates = np.geomspace(rates[max(i - 1, 0)], rates[min(i + 1, len(rates) - 1)], 21)
        per_bytes = np.geomspace(per_bytes[max(j - 1, 0)], per_bytes[min(j + 1, len(per_bytes) - 1)], 21)
    fixed, sse = solve(rates, per_bytes)
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
    return float(rates[i]), float(fixed[i, j]), float(per_bytes[j]), float(sse[i, j])


# grids of the moves' fit: the knee (0: slower from the first byte) and the half point, in bytes
KNEES = np.concatenate([[0.0], np.geomspace(2 ** 20, 2 ** 28, 65)])
HALVES = np.geomspace(2 ** 16, 2 ** 31, 61)
IN_LAYER_MIN = 3  # layers of the in_layer section that a fit from them needs (dispatch, GEMM, combines)


def _saturating(points: list[tuple[float, float]], knee: float) -> tuple[float, float, float, float]:
    """(relative squared error, alone, extra, half) of time per byte = alone + extra x beyond /
    (beyond + half), beyond = max(W - knee, 0), over (bytes in flight W, time per byte) points:
    least squares of the relative residuals for alone and extra at each half of HALVES, the best
    half kept (no slowdown with more bytes in flight: the mean alone)."""
    w = np.array([p[0] for p in points], np.float64)
    y = np.array([p[1] for p in points], np.float64)
    beyond = np.maximum(w - knee, 0.0)
    best = (float((((y - y.mean()) / y) ** 2).sum()), float(y.mean()), 0.0, float(HALVES[0]))
    for half in HALVES:
        a = np.column_stack([np.ones_like(w), beyond / (beyond + half)]) / y[:, None]
        (alone, extra), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
        if extra < 0 or alone < 0:
            continue
        err = float(((a @ [alone, extra] - 1.0) ** 2).sum())
        if err < best[0]:
            best = (err, float(alone), float(extra), float(half))
    return best


def _fit_moves(f: Fit, raw: dict, hw, base: str, origin: str, dtype: str) -> None:
    """copy_rows and puts: time per byte against the bytes all blocks have in flight at once
    (blocks x bytes): flat while the L2 holds them, then slower, with one knee for copies and
    local puts alike (the same L2; the knee of least total relative error); puts over NVLink: a
    block alone, or the port's share. The dispatch microbenchmark (the kernel's dispatch at the
    layer's concurrency, on both sides of the knee) fits the store path's figures
    (_fit_store_dispatch) and checks the put path's against these. A one-GPU file (an H100 lent
    alone) has no peer: its NVLink figures stay the base preset's, and say so."""
    copies = _need(raw, "copy", "copy_rows times")
    puts = _need(raw, "put", "put-with-signal times")
    big = max(p["bytes"] for p in puts)
    local = [p for p in puts if p["peer"] == "self" and p["bytes"] >= big // 4]
    remote = [p for p in puts if p["peer"] == "nvlink" and p["bytes"] == big]
    alone = raw.get("world") == 1
    if not local or not (alone or any(p["blocks"] == 1 for p in remote)):
        raise CalibrationError("put", sorted({p["peer"] for p in puts}), f"puts of {big} B to self and nvlink "
                               "(to self only from a one-GPU run, world 1)")
    cpts = [(c["blocks"] * c["bytes"], c["ns_per_copy"]["median"] / c["bytes"]) for c in copies]
    ppts = [(p["blocks"] * p["bytes"], p["ns_per_put"]["median"] / p["bytes"]) for p in local]
    knee, (_, c1, cx, ch), (_, p1, px, ph) = min(
        ((k, _saturating(cpts, k), _saturating(ppts, k)) for k in KNEES), key=lambda r: r[1][0] + r[2][0])
    f.set("l2_knee_bytes", float(knee), f"{origin}: copy_rows and local puts by 1 to "
          f"{max(c['blocks'] for c in copies)} blocks at once, the knee of least relative error of both fits below")
    how = (f"{origin}: copy_rows of one tile by 1 to {max(c['blocks'] for c in copies)} blocks at once, least squares "
           "of time per byte = alone + extra x beyond / (beyond + half), beyond the knee")
    f.set("copy_ns_per_byte", c1, how)
    f.set("copy_extra_ns_per_byte", cx, how)
    f.set("copy_half_bytes", ch, how)
    how = (f"{origin}: put-with-signal to its own GPU of tiles >= {big // 4} B by 1 to "
           f"{max(p['blocks'] for p in local)} blocks at once, the same least squares")
    f.set("put_local_ns_per_byte", p1, how)
    f.set("put_local_extra_ns_per_byte", px, how)
    f.set("put_local_half_bytes", ph, how)
    if alone:
        for name in ("put_nvlink_ns_per_byte", "nvlink_gbps"):
            f.set(name, getattr(hw, name), f"{origin}: not measured (one GPU, no peer): the {base} preset's")
    else:
        one = next(p for p in remote if p["blocks"] == 1)
        f.set("put_nvlink_ns_per_byte", one["ns_per_put"]["median"] / big,
              f"{origin}: put-with-signal of {big} B over NVLink by 1 block alone")
        best = max(remote, key=lambda p: p["aggregate_gbps"])
        f.set("nvlink_gbps", best["aggregate_gbps"], f"{origin}: the largest aggregate put-with-signal bandwidth "
              f"to the peer ({best['blocks']} blocks x {best['bytes']} B)")
    into_peer = [] if alone else [c for c in raw.get("copy_nvlink") or [] if c.get("blocks")]
    one = next((c for c in into_peer if c["blocks"] == 1), None)
    if one:
        f.set("copy_nvlink_ns_per_byte", one["ns_per_copy"]["median"] / one["bytes"],
              f"{origin}: copy_rows of one {one['bytes']} B tile into the NVLink peer's memory by 1 block alone "
              "(a staged dispatch sender's stores, before its fence)")
    else:
        f.set("copy_nvlink_ns_per_byte", 0.0, f"{origin}: not measured (no copy_rows into a peer): a staged sender "
              "stores at copy_rows' own rate")
    # the build's blocks per SM too (a local share queues behind the NVLink ones only beside another
    # block) and the measured NVLink latency (a share stored into the peer ends with a round trip)
    hw_moves = PRESETS["h200-sxm"].replace(**{k: f.values[k] for k in (
        "blocks_per_sm", "l2_knee_bytes", "copy_ns_per_byte", "copy_extra_ns_per_byte", "copy_half_bytes",
        "put_local_ns_per_byte", "put_local_extra_ns_per_byte", "put_local_half_bytes", "put_nvlink_ns_per_byte",
        "copy_nvlink_ns_per_byte", "nvlink_gbps") + (("nvlink_latency_ns",) if "nvlink_latency_ns" in f.values
                                                     else ())})
    for c in into_peer:  # each block at its own rate or its share of the port
        f.check(f"copy_rows {c['bytes']} B into the peer, {c['blocks']} blocks (ns)", c["ns_per_copy"]["median"],
                c["bytes"] * costs.port_ns_per_byte(hw_moves.copy_nvlink_ns_per_byte, c["blocks"],
                                                    hw_moves.nvlink_gbps))
    for c in copies:
        inflight = c["blocks"] * c["bytes"]
        f.check(f"copy_rows {c['bytes']} B{' weighted' if c['scaled'] else ''}, {c['blocks']} blocks (ns)",
                c["ns_per_copy"]["median"], c["bytes"] * costs.contended_ns_per_byte(c1, cx, ch, inflight, knee))
    for p in local + remote:
        f.check(f"put {p['bytes']} B to {p['peer']}, {p['blocks']} blocks (ns)", p["ns_per_put"]["median"],
                costs.put_ns(hw_moves, LOCAL if p["peer"] == "self" else NVLINK, p["bytes"],
                             p["blocks"] * p["bytes"], p["blocks"]))
    dispatches = raw.get("dispatch", [])

    def world(d: dict):  # files from before the entries said theirs: the file's world
        return d.get("world", raw.get("world"))

    layers = [c for c in raw.get("in_layer") or [] if world(c) == 1]
    _fit_store_dispatch(f, [d for d in dispatches if d.get("path") == "store" and d["peer"] == "self"
                            and world(d) == 1], layers, hw, origin)
    hw_moves = hw_moves.replace(**{k: f.values[k] for k in f.values if k.startswith("dispatch_store_")})
    for d in dispatches:
        # files before the kernel stored dispatched rows timed packed and put tiles, one a block
        n, link, path = d["concurrent_blocks"], LOCAL if d["peer"] == "self" else NVLINK, d.get("path", "put")
        nbytes = d["rows"]["median"] * d["bytes_per_row"]
        # the shares over each link in the same layer's dispatch (its other entry, on two GPUs)
        over = {LOCAL if e["peer"] == "self" else NVLINK: e.get("shares", e.get("tiles")) for e in dispatches
                if (e.get("tokens"), world(e), e.get("path")) == (d.get("tokens"), world(d), d.get("path"))}
        model = costs.dispatch_ns(hw_moves, nbytes, link, path, n * nbytes, over) - hw_moves.task_overhead_ns
        layer = f"T={d['tokens']}, " if "tokens" in d else ""
        fitted = path == "store" and link == LOCAL and world(d) == 1 and not layers and \
            f.values["dispatch_store_ns_per_byte"]
        f.check(f"dispatch ({path}) of {d['rows']['median']:.0f} rows to {d['peer']}, {layer}{world(d)} GPU(s), "
                f"{n} blocks (ns{'' if fitted else '; not fitted'})", d["ns_per_tile"]["median"], model)
    _fit_tile_combine(f, layers, dtype, origin)
    _fit_reduce(f, _need(raw, "combine", "the final combine's time per block"), layers, origin)


def _fit_return_store(f: Fit, raw: dict, origin: str) -> None:
    """A GEMM1 task's stores into the peer per byte of its output: the median of the tasks of
    the peer's tiles over those of the GPU's own, less GEMM0's (the same tiles, nothing stored
    away), on the in_layer layer of two GPUs; each of its tasks stores its tile's rows x its
    columns."""
    layers = [c for c in raw.get("in_layer") or [] if c.get("world", 1) > 1 and c.get("gemm_by_source")]
    if not layers:
        f.set("return_store_ns_per_byte", f.values["put_nvlink_ns_per_byte"], f"{origin}: not measured (no in-layer "
              "layer on two GPUs): put_nvlink_ns_per_byte, one block's put rate")
        return
    c = layers[0]
    by = c["gemm_by_source"]

    def extra(task: str) -> float:
        return by[task]["peer"]["median"] - by[task]["home"]["median"]

    nbytes = c["tile_rows"]["median"] * c["tile_n"] * c["bytes_per_value"]
    f.set("return_store_ns_per_byte", max(extra("gemm1") - extra("gemm0"), 0.0) / nbytes,
          f"{origin}: GEMM1 tasks of the peer's tiles against the GPU's own, less GEMM0's difference, in the "
          f"megakernel at {c['tokens']} tokens on {c['world']} GPUs (no measured run's size), over a task's "
          f"{nbytes:.0f} B of output")


def _fit_tile_combine(f: Fit, layers: list[dict], dtype: str, origin: str) -> None:
    """The float32 kernel's per-tile combine task, timed inside the megakernel where IN_LAYER_MIN
    or more layers were: its median time = fixed + its median tile bytes x (L2 rate x held + HBM
    rate x (1 - held)), held = min(1, knee / the layer's returned bytes), the knee searched
    (_fixed_and_rates). Elsewhere (a bf16 build, whose task only marks the tile's arrival, or a
    file without those layers) 0: the model prices the task at copy_rows' rate alone."""
    names = ("tile_combine_fixed_ns", "tile_combine_l2_ns_per_byte", "tile_combine_ns_per_byte",
             "tile_combine_knee_bytes")
    timed = [c for c in layers if c.get("tile_combine_ns", {}).get("n")]
    if not costs.WEIGHTED_IN_TASK.get(dtype, True) or len(timed) < IN_LAYER_MIN:
        why = ("the bf16 build's task only marks its tile's arrival" if not costs.WEIGHTED_IN_TASK.get(dtype, True)
               else "no per-tile combine timed in the layers (a file from before it)")
        for name in names:
            f.set(name, 0.0, f"{origin}: 0, {why}: copy_rows' rate alone")
        return
    points = [(f"in layer: per-tile combine, {_layer(c)}", c["tile_combine_bytes"]["median"],
               costs.returned_bytes(c["tokens"], c["top_k"], c["hidden"], c["bytes_per_value"]),
               c["tile_combine_ns"]["median"])
              for c in timed]
    knee, fixed, l2, hbm = _fixed_and_rates(points)
    how = (f"{origin}: the per-tile combine tasks inside the megakernel at {_tokens(timed)} tokens (layers no measured "
           "run uses), least squares of relative residuals of time = fixed + the tile's bytes x (L2 rate x held + HBM "
           "rate x (1 - held)), held = min(1, knee / the layer's returned bytes), the knee where it halves one rate's")
    for name, v in zip(names, (fixed, l2, hbm, knee)):
        f.set(name, max(float(v), 0.0), how)
    hw = PRESETS["h200-sxm"].replace(**{k: f.values[k] for k in names})
    for point, nbytes, total, y in points:
        f.check(f"{point} (ns)", y, hw.tile_combine_fixed_ns + nbytes * costs.tile_combine_ns_per_byte_at(hw, total))


def _fit_reduce(f: Fit, points: list[dict], layers: list[dict], origin: str) -> None:
    """The final combine: from the megakernel's own layers where IN_LAYER_MIN or more were timed
    (the rows GEMM1 just wrote), time = fixed + bytes x (L2 rate x held + HBM rate x (1 - held)),
    held = min(1, knee / all blocks' bytes), the knee searched (_fixed_and_rates); else from the
    microbenchmark, time per byte at one rate (one layer size) or at the two with held over
    l2_knee_bytes, no fixed time."""
    rows = []
    for c in points:
        warps = c["n_proc"] * costs.REDUCE_WARPS
        nb = c.get("bytes_per_value", 4)  # files before bf16 measured float32 rows only
        moved = costs.reduce_bytes(math.ceil(c["tokens"] / warps) * costs.REDUCE_WARPS, c["top_k"], c["hidden"], nb)
        total = costs.reduce_bytes(c["tokens"], c["top_k"], c["hidden"], nb)
        rows.append((f"microbenchmark: ordered combine of {c['tokens']} tokens, per block", moved, total,
                     c["ns_per_block"]["median"]))
    in_layer = [(f"in layer: final combine of {c['tokens']} tokens, busiest blocks",
                 costs.reduce_bytes(c["combine_tokens_per_block"], c["top_k"], c["hidden"], c["bytes_per_value"]),
                 costs.reduce_bytes(c["tokens"], c["top_k"], c["hidden"], c["bytes_per_value"]),
                 c["final_combine_ns"]["median"]) for c in layers]
    if len(in_layer) >= IN_LAYER_MIN:
        knee, fixed, l2, hbm = _fixed_and_rates(in_layer)
        how = (f"{origin}: the final combine inside the megakernel at {_tokens(layers)} tokens (layers no measured "
               "run uses), least squares of relative residuals of time = fixed + bytes x (L2 rate x held + HBM rate "
               "x (1 - held)), held = min(1, knee / all blocks' bytes), the knee where it halves one rate's")
        fitted = in_layer
    elif len(rows) == 1:
        _, moved, total, y = rows[0]
        knee, fixed, l2, hbm = 0.0, 0.0, 0.0, y / moved
        how = f"{origin}: the ordered combine microbenchmark at one layer size: one rate"
        fitted = rows
    else:
        knee, fixed = f.values["l2_knee_bytes"], 0.0
        held = [costs.l2_held(knee, total) for _, _, total, _ in rows]
        a = np.array([(1.0 - h, h) for h in held])
        (hbm, l2), *_ = np.linalg.lstsq(a, np.array([y / moved for _, moved, _, y in rows]), rcond=None)
        how = (f"{origin}: the ordered combine microbenchmark at {_tokens(points)} tokens, least squares of time per "
               "byte = L2 rate x held + HBM rate x (1 - held), held = min(1, l2_knee_bytes / all blocks' bytes)")
        fitted = rows
    for name, v in (("reduce_fixed_ns", fixed), ("reduce_ns_per_byte", hbm), ("reduce_l2_ns_per_byte", l2),
                    ("reduce_knee_bytes", knee)):
        f.set(name, max(float(v), 0.0), how)
    hw = PRESETS["h200-sxm"].replace(**{k: f.values[k] for k in (
        "reduce_fixed_ns", "reduce_ns_per_byte", "reduce_l2_ns_per_byte", "reduce_knee_bytes")})
    for point, moved, total, y in rows + in_layer:
        note = "" if any(point == r[0] for r in fitted) else "; not fitted"
        f.check(f"{point} (ns{note})", y, hw.reduce_fixed_ns + moved * costs.reduce_ns_per_byte_at(hw, total))


def _fit_store_dispatch(f: Fit, pts: list[dict], layers: list[dict], hw, origin: str) -> None:
    """A share of a tile stored into this GPU's inbox, all processors at once on one GPU alone (on
    two the NVLink shares beside it hold it back). From the megakernel's own layers where
    IN_LAYER_MIN or more were timed (right after the gate, the scheduler and subscriber polling
    beside it): a share's median time = fixed + the first round's mean share of bytes x (L2 rate
    x held + HBM rate x (1 - held)), held = min(1, knee / its bytes in flight), the knee searched
    (_fixed_and_rates; costs.dispatch_ns charges every share that mean); else from
    the dispatch microbenchmark, least squares of time = fixed + bytes x per byte. Files from
    before the store path, or from two GPUs without the one-GPU shares, keep the base preset's
    figures (a gather at the copy rate)."""
    names = ("dispatch_store_fixed_ns", "dispatch_store_l2_ns_per_byte", "dispatch_store_ns_per_byte",
             "dispatch_store_knee_bytes")
    in_layer = [(f"in layer: dispatch share, {_layer(c)}, {c['inflight_bytes'] / 2 ** 20:.1f} MiB in flight",
                 c["inflight_bytes"] / c["first_round_shares"], c["inflight_bytes"], c["dispatch_ns"]["median"])
                for c in layers]
    if len(layers) >= IN_LAYER_MIN:
        knee, fixed, l2, hbm = _fixed_and_rates(in_layer)
        how = (f"{origin}: the dispatch shares inside the megakernel at {_tokens(layers)} tokens (layers no measured "
               "run uses, one GPU), least squares of relative residuals of time = fixed + bytes x (L2 rate x held + "
               "HBM rate x (1 - held)), held = min(1, knee / the bytes in flight), the knee where it halves one rate's")
    elif len(pts) >= 2:
        a = np.array([(1.0, d["rows"]["median"] * d["bytes_per_row"]) for d in pts])
        (fixed, hbm), *_ = np.linalg.lstsq(a, np.array([d["ns_per_tile"]["median"] for d in pts]), rcond=None)
        knee = l2 = 0.0
        how = (f"{origin}: a share of a stored dispatch tile at {len(pts)} layer sizes ({_tokens(pts)} tokens, all "
               "processors at once, one GPU), least squares of time = fixed + bytes x per byte")
    else:
        for name in names:
            f.set(name, getattr(hw, name), f"{origin}: no store-path dispatch timed on one GPU alone (a file from "
                  "before it): the base preset's")
        return
    for name, v in zip(names, (fixed, l2, hbm, knee)):
        f.set(name, max(float(v), 0.0), how)
    model = PRESETS["h200-sxm"].replace(**{k: f.values[k] for k in names})
    for point, nbytes, inflight, y in in_layer:
        f.check(f"{point} (ns)", y, costs.store_dispatch_ns(model, nbytes, inflight))


def _tokens(points: list[dict]) -> str:
    """The layers' token counts, with the experts of a layer whose count is not most layers' (the
    in-layer section's sharing layer)."""
    experts = [p.get("experts") for p in points]
    usual = max(set(experts), key=experts.count) if experts else None
    return ", ".join(f"{p['tokens']}" + (f" ({e} experts)" if e != usual else "") for p, e in zip(points, experts))


def _layer(c: dict) -> str:
    """An in-layer entry's name in the fits' checks: its tokens, and its experts where the entry has them."""
    return f"T={c['tokens']}" + (f" E={c['experts']}" if "experts" in c else "")


def _fixed_and_rates(points: list[tuple[str, float, float, float]]) -> tuple[float, float, float, float]:
    """(knee, fixed, L2 rate, HBM rate) of time = fixed + x x (L2 rate x held + HBM rate x (1 -
    held)), held = min(1, knee / total), over (name, x, total, time) points: least squares of
    the relative residuals with every figure >= 0; where one rate for all bytes (knee 0) misses
    a point by more than LINE_MISS, the knee among KNEES (below some point's total) that at
    least halves its squared residuals."""
    x, total, y = (np.array([p[i] for p in points], np.float64) for i in (1, 2, 3))

    def solve(cols: list[np.ndarray]) -> tuple[float, np.ndarray, float]:
        a = np.column_stack(cols) / y[:, None]
        coef, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
        miss = a @ coef - 1.0
        return float((miss ** 2).sum()), coef, float(np.abs(miss).max())

    err, (fixed, rate), miss = solve([np.ones_like(x), x])
    if rate <= 0:
        raise CalibrationError("in_layer", [p[0] for p in points], "times that grow with the bytes moved")
    if fixed < 0:
        err, (fixed, rate), miss = solve([np.zeros_like(x), x])
    best = (err / 2, 0.0, float(fixed), 0.0, float(rate))
    for knee in KNEES[1:] if miss > LINE_MISS else ():
        if knee >= total.max():
            break
        held = np.minimum(1.0, knee / total)
        got_err, coef, _ = solve([np.ones_like(x), x * held, x * (1.0 - held)])
        if (coef >= 0).all() and got_err < best[0]:
            best = (got_err, float(knee), *map(float, coef))
    return best[1:]


def _fit_gate(f: Fit, raw: dict, units: int, wgs: int, origin: str) -> None:
    """The gate phase on `units` workers (blocks x their `wgs` warpgroups, costs.gate_units). The
    top-k selection's time per logit (from shared or from global memory) is fitted only where the
    points vary top_k among layers whose logits are read from that memory: the E-dependent costs
    of points of one top_k (the softmax, the row counts) are no selection's."""
    pts = _need(raw, "gate", "gate phase times")
    if len(pts) < 4:
        raise CalibrationError("gate", len(pts), "at least 4 (tokens, experts) points")
    rows = []
    for g in pts:
        grid = g["grid"] * wgs if "grid" in g else units
        slots = costs.slot_scan(g["tokens"], g["top_k"], g["experts"], grid)
        split = float(costs.gate_splits(g["tokens"], g["hidden"], grid) > 1)
        rows.append((costs.gate_work(g["tokens"], g["hidden"], g["experts"], grid), slots, 1.0, split,
                     *costs.gate_select_reads(g["tokens"], g["top_k"], g["experts"], grid)))
    a = np.array(rows, np.float64)
    y = np.array([g["ns"] for g in pts])
    names = ("gate_item_ns_per_h", "gate_slot_ns", "gate_fixed_ns", "gate_split_ns", "gate_select_smem_ns",
             "gate_select_global_ns")
    how = ("time = H spanned per unit x a + slot scan x b + c + (H split over units) x d + logits considered by "
           "a selecting lane from shared memory x e and from global memory x f (costs.gate_work, costs.slot_scan, "
           "costs.gate_select_reads)")
    keep = np.ones(a.shape[1], bool)
    unfitted = {}
    for col, memory in ((4, "shared"), (5, "global")):
        ks = sorted({g["top_k"] for g, row in zip(pts, a) if row[col]})
        if len(ks) < 2:
            keep[col] = False
            unfitted[names[col]] = (f"{origin}: none (no gate point with its logits in {memory} memory varies top_k: "
                                    f"{ks or 'none there'})")
    # a figure the least squares wants negative is dropped and the rest fitted again (the slot
    # scans of the bf16 128 x 256 build: as many per unit at 8 as at 64 and 128 experts, whose
    # gate times differ by the selection alone); clipping it instead threw the others off by 20%
    while True:
        coef = np.zeros(a.shape[1])
        coef[keep], *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        if (coef >= 0).all():
            break
        keep &= coef >= 0
    for name, c in zip(names, coef):
        f.set(name, float(c), unfitted.get(name) or f"{origin}: gate phase over {len(pts)} (tokens, experts, top_k) "
              f"points, least squares of {how}")
    for g, row in zip(pts, a):
        f.check(f"gate T={g['tokens']} E={g['experts']} k={g['top_k']} (ns)", g["ns"], float(row @ coef))


def _fit_scheduler(f: Fit, raw: dict, hw, origin: str) -> None:
    s = _need(raw, "scheduler", "the megakernel's task gaps")
    if not s.get("gap_ns"):
        raise CalibrationError("scheduler", sorted(s), "gap_ns")
    f.set("handoff_ns", s["gap_ns"]["median"], f"{origin}: median gap between a processor's tasks "
          f"({s['tasks']} tasks of a layer no measured run uses)")
    delay = s.get("arrival_to_first_task_ns") or {}
    if delay.get("min", -1) >= 0:  # files before the fix also matched returned tiles (negative delays)
        # printed, not fitted: even the shortest delay waits for a processor (the first tiles land
        # while every processor still dispatches), which the model times itself. Taken as the
        # subscriber's turn less the hand-off it was 0-15 us beside the one-slot mailbox's 8-10 us
        # hand-off, and 11-29 us beside the two-slot mailbox's 2.4 us, which made the model's three
        # subscriber warps the bottleneck of every large layer (predicted 12-18% long). The
        # subscriber's turn stays the preset's estimate.
        f.check("a tile's arrival to its first task, shortest (ns; not fitted)", delay["min"],
                f.values["handoff_ns"] + hw.subscriber_ns)
    _fit_idle(f, raw, s, hw, origin)


def _fit_idle(f: Fit, raw: dict, s: dict, hw, origin: str) -> None:
    """The latencies around idle processors, from the small scheduler layer on one GPU (on two, the
    peer's late row counts hold back the first tasks: its figures are printed beside the model's).
    Files from before it: no wake or pace, the final combine a hand-off after the last task."""
    idle = s.get("idle_one_gpu") or (s.get("idle") if raw.get("world") == 1 else None)
    need = ("first_task_ns", "assign_ns_per_task", "stop_ns")
    if not idle or any(k not in idle for k in need):
        f.set("wake_ns", 0.0, f"{origin}: not measured (a file from before the small scheduler layer)")
        f.set("assign_ns", 0.0, f"{origin}: not measured (a file from before the small scheduler layer)")
        f.set("stop_ns", f.values["handoff_ns"], f"{origin}: not measured: the hand-off")
        return
    where = f"{origin}: the small scheduler layer ({idle['config']['tokens']} tokens, one GPU)"
    f.set("wake_ns", max(idle["first_task_ns"] - hw.subscriber_ns, 0.0),
          f"{where}: its first task's start after its tile's signal, less the subscriber's turn")
    f.set("assign_ns", idle["assign_ns_per_task"], f"{where}: the first round of tasks once every processor has "
          "dispatched, from first start to last over their number")
    f.set("stop_ns", idle["stop_ns"]["median"], f"{where}: median over processors of the final combine's start "
          "after the last task's end")
    other = s.get("idle") if s.get("idle_one_gpu") else None
    if other and all(k in other for k in need):
        f.check("small layer, two GPUs: signal to first task (ns; not fitted)", other["first_task_ns"],
                f.values["wake_ns"] + hw.subscriber_ns)
        f.check("small layer, two GPUs: first round, per task (ns; not fitted)", other["assign_ns_per_task"],
                f.values["assign_ns"])
        f.check("small layer, two GPUs: last task to final combine (ns; not fitted)", other["stop_ns"]["median"],
                f.values["stop_ns"])


def _pings(raw: dict) -> list[dict]:
    return [p for p in raw.get("pingpong", []) if not p.get("failed")]


def _fit_latency(f: Fit, raw: dict, origin: str) -> None:
    """The NVLink latency, before the moves' checks (a share stored into the peer ends with a round trip)."""
    bare = [p for p in _pings(raw) if p["bytes"] == 0]
    if bare:
        f.set("nvlink_latency_ns", bare[0]["round_trip_ns"] / 2, f"{origin}: half a bare-signal round trip")


def _check_round_trips(f: Fit, raw: dict) -> None:
    """Put-with-signal round trips against the fitted latency and NVLink put rate (checks only)."""
    if "nvlink_latency_ns" in f.values:
        for p in _pings(raw):
            if p["bytes"]:
                f.check(f"put-with-signal round trip {p['bytes']} B, 1 block (ns; not fitted)", p["round_trip_ns"],
                        2 * (f.values["nvlink_latency_ns"] + p["bytes"] * f.values.get("put_nvlink_ns_per_byte", 0.0)))


def preset_json(fits: dict[str, Fit], tiles: dict[str, list[int]], base: str, name: str) -> dict:
    """The calibrated preset: float32's figures at the top level, every dtype's tile, and in the
    other dtypes' sections the figures their fit gave differently (the shared byte moves stay at
    the top level, so a change made there reaches every dtype)."""
    f = fits["float32"]
    dtypes = {"float32": {"tile": tiles["float32"]}}
    for d in fits.keys() - {"float32"}:
        own = {k: v for k, v in fits[d].values.items() if v != f.values.get(k)}
        dtypes[d] = {"tile": tiles[d], **own, "sources": {k: fits[d].sources[k] for k in own}}
    return {"base": base, "name": name, **f.values, "sources": f.sources, "dtypes": dtypes}


def report(f: Fit, dtype: str = "float32") -> str:
    from reference.cli import format_table

    fitted = format_table(("figure", "value", "from"), [(k, f"{v:.6g}", f.sources[k]) for k, v in f.values.items()])
    res = format_table(("point", "measured", "model", "residual %"),
                       [(p, f"{m:.6g}", f"{y:.6g}", f"{100 * (y - m) / m:+.1f}" if m else "")
                        for p, m, y in f.residuals])
    return f"fitted figures ({dtype} build)\n{fitted}\n\nresiduals ({dtype}; model - measured) / measured\n{res}"


def calibrate(path: Path, base: str | None = None, out: Path | None = None) -> tuple[Path, dict[str, Fit]]:
    """Fit `path`'s microbenchmarks on preset `base` (default: the file's GPU); write `out`.
    Returns the fit of each build the file measured (float32, and bfloat16 where present)."""
    if out is None:
        raise CalibrationError("out", None, "a path to write the calibrated preset (nothing is written by default)")
    raw = read_json(path, "the microbenchmarks of benchmarks/calibrate_gpu.py (calibration-<gpu>.json)")
    meta = raw.get("meta", {})
    tag = gpu_tag(meta.get("gpu", "") if isinstance(meta, dict) and isinstance(meta.get("gpu", ""), str) else "")
    base = base or GPU_PRESET[tag]
    origin = _relative(path)
    if base != GPU_PRESET[tag]:  # e.g. an H100 preset from H200 microbenchmarks: the same GH100 SMs
        origin += f" (measured on {raw['meta']['gpu']}, applied to {base})"
    try:
        fits, tiles = {"float32": fit(raw, base, origin)}, {"float32": tile_of(raw, "")}
        for build in DTYPES:  # every build's section but float32's, the top level
            if build != "float32" and build in raw:
                fits[build], tiles[build] = fit_dtype(raw, build, base, origin), tile_of(raw[build], f"{build}.")
    except (TypeError, KeyError, AttributeError, IndexError, ValueError) as e:
        if isinstance(e, (CalibrationError, HardwareError)):
            raise
        raise CalibrationError("calibration", str(path), f"microbenchmark sections of the shape "
                               f"benchmarks/calibrate_gpu.py writes ({type(e).__name__}: {e})") from e
    doc = preset_json(fits, tiles, base, f"{base}+calibrated({path.stem})")
    from_dict(doc, origin=str(out))  # the file must load as a preset
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out, fits


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(MEASUREMENTS.parent))
    except ValueError:
        return str(path)


def cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        if args.out is None:
            raise CalibrationError("--out", None, "a path to write the calibrated preset to (nothing is written by "
                                   "default; measurements/calibrated-<gpu>.json replaces the committed one)")
        out = check_output(args.out, (".json",))
        out, fits = calibrate(Path(args.calibration), args.base, out)
    except (CalibrationError, HardwareError, FileError) as e:
        print(f"moelab calibrate: error: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(report(f, dtype) for dtype, f in fits.items()))
    if BF16 not in fits:
        print(f"\nno {BF16} section in {args.calibration}: the preset covers the float32 build only")
    print(f"\nwrote {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the hardware preset to a GPU's microbenchmarks",
                       description="Fit the simulator's hardware figures to the microbenchmarks in a "
                                   "measurements/calibration-<gpu>.json file, print the fit and its residuals, and "
                                   "write a calibrated preset (loadable by sim.simulate(hardware=...)) to --out.",
                       epilog="exit status: 0 written, 2 a bad option or file (or one lacking what a fit needs).")
    p.add_argument("--calibration", default=str(MEASUREMENTS / "calibration-h200.json"), metavar="FILE",
                   help="the microbenchmarks (default: measurements/calibration-h200.json)")
    p.add_argument("--base", choices=sorted(PRESETS), help="the preset to start from (default: the file's GPU)")
    p.add_argument("--out", metavar="FILE.json", help="where to write it (required: nothing is written by default; "
                                                      "measurements/calibrated-<gpu>.json replaces the committed one)")
    p.set_defaults(func=cmd_calibrate)
