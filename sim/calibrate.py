"""`moelab calibrate`: fit the hardware preset's figures to a GPU's microbenchmarks.

Reads measurements/calibration-<gpu>.json (written by benchmarks/calibrate_gpu.py from
gpu/microbench.py) and fits, on those microbenchmarks only (never on the layer runs that
`moelab compare` predicts), one mechanism at a time (sim/calibration/, each module's docstring
names its figures, its microbenchmark and its residual bound):

- the occupancy (here): the device's SMs, the megakernel's blocks per SM, the build's warpgroups;
- `gemm`: the tile GEMM task (matrix_efficiency, gemm_fixed_ns, weight_stream_ns_per_byte,
  weight_load_ns_per_byte, gemm_row_group, gemm_overlap_power; task_overhead_ns 0: each
  measurement times a whole task);
- `moves`: copy_rows and puts (l2_knee_bytes, copy_*, put_local_*, put_nvlink_ns_per_byte,
  nvlink_gbps, copy_nvlink_ns_per_byte);
- `dispatch`: the store path's shares (dispatch_store_*), every dispatch entry checked, and a
  block's walk to its shares (deal_share_ns, deal_count_ns);
- `combine`: tile_combine_*, reduce_*, return_store_ns_per_byte;
- `gate`: gate_item_ns_per_h, gate_slot_ns, gate_fixed_ns, gate_split_ns, gate_select_*, gate_list_ns,
  gate_weigh_ns, gate_logit_ns, and what the megakernel adds to the gate's code (gate_layer_ns, from the
  in-layer layers' gate phase);
- `scheduler`: handoff_ns, wake_ns, assign_ns, stop_ns, nvlink_latency_ns, the subscriber's
  delay in seeing a landed tile (signal_seen_ns, signal_seen_ns_per_entry), and one thread's enqueue
  of an expert's tasks (enqueue_ns, enqueue_source_ns, enqueue_task_ns).

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
import sys
from pathlib import Path

from reference.files import FileError, check_output, read_json

from .calibration import combine, dispatch, gate, gemm, moves, scheduler
from .calibration.common import HALVES, IN_LAYER_MIN, KNEES, CalibrationError, Fit, need, one_gpu_layers
from .hardware import DTYPES, PRESETS, HardwareError, from_dict

__all__ = ["HALVES", "IN_LAYER_MIN", "KNEES", "CalibrationError", "Fit", "calibrate", "fit", "fit_dtype"]

MEASUREMENTS = Path(__file__).resolve().parent.parent / "measurements"
GPU_PRESET = {"h100": "h100-sxm", "h200": "h200-sxm"}
BF16 = "bfloat16"  # the file's section of the bf16 kernel build
BYTE_SECTIONS = ("put", "pingpong")  # measured once (float32 job): NVSHMEM moves bytes whatever the dtype


def gpu_tag(name: str) -> str:
    for tag in GPU_PRESET:
        if tag in name.lower():
            return tag
    raise CalibrationError("meta.gpu", name, "an H100 or H200 (the GPUs with a preset: " + ", ".join(PRESETS) + ")")


def fit(raw: dict, base: str, origin: str, dtype: str = "float32") -> Fit:
    """Every fitted figure of preset `base` from one kernel build's microbenchmarks (`dtype`'s), one
    mechanism's fit after another (each may read the figures fitted before it)."""
    if base not in PRESETS:
        raise CalibrationError("base", base, "one of " + ", ".join(PRESETS))
    hw = PRESETS[base]
    f = occupancy(raw, origin)
    wgs = int(f.values["warpgroups_per_block"])
    blocks = int(f.values["blocks_per_sm"] * f.values["sms"])
    f.merge(gemm.fit_gemm(raw, hw, blocks, origin, dtype))
    f.merge(scheduler.fit_latency(raw, origin))
    f.merge(moves.fit_moves(raw, hw, base, origin, f.values))
    f.merge(dispatch.fit_dispatch(raw, hw, origin, f.values))
    layers = one_gpu_layers(raw)
    f.merge(dispatch.fit_deal(layers, origin))
    f.merge(scheduler.fit_signal_seen(layers, origin))
    f.merge(combine.fit_tile_combine(layers, dtype, origin))
    f.merge(combine.fit_reduce(need(raw, "combine", "the final combine's time per block"), layers,
                               f.values["l2_knee_bytes"], origin, one_gpu_layers(raw, other_k=True)))
    f.merge(combine.fit_return_store(raw, f.values["put_nvlink_ns_per_byte"],
                                     f.values.get("nvlink_latency_ns", hw.nvlink_latency_ns), origin))
    f.merge(gate.fit_gate(raw, blocks * wgs, wgs, origin))
    f.merge(scheduler.fit_enqueue(raw, origin))
    f.merge(scheduler.fit_scheduler(raw, hw, origin, {k: f.values[k] for k in scheduler.ENQUEUE_NAMES}))
    return f.merge(scheduler.check_round_trips(raw, f.values))


def occupancy(raw: dict, origin: str) -> Fit:
    """The device's SMs, the megakernel's resident blocks per SM and the build's warpgroups per block."""
    occ = need(raw, "occupancy", "the megakernel's grid and SMs")
    sms, grid = int(occ.get("sms") or raw.get("sms") or 0), int(occ.get("megakernel_grid") or 0)
    if sms < 1 or grid < sms:
        raise CalibrationError("occupancy", occ, "sms >= 1 and megakernel_grid >= sms")
    f = Fit()
    f.set("sms", sms, f"{origin}: the device's multiprocessor count")
    f.set("blocks_per_sm", grid // sms, f"{origin}: the megakernel's occupancy, grid {grid} over {sms} SMs")
    wgs = int((raw.get("tile") or {}).get("BLOCK_WARPGROUPS", 1))
    f.set("warpgroups_per_block", wgs, f"{origin}: the build's warpgroups per block (its tile options)")
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


def preset_json(fits: dict[str, Fit], tiles: dict[str, list[int]], base: str, name: str) -> dict:
    """The calibrated preset: float32's figures at the top level, every dtype's tile, and in the
    other dtypes' sections the figures their fit gave differently or by another method (the shared
    byte moves stay at the top level, so a change made there reaches every dtype)."""
    f = fits["float32"]
    dtypes = {"float32": {"tile": tiles["float32"]}}

    def method(how: str) -> str:  # a source less its file and build
        return how.split(": ", 1)[-1]

    for d in [d for d in fits if d != "float32"]:  # in the file's order (a set's would vary from run to run)
        own = {k: v for k, v in fits[d].values.items()
               if v != f.values.get(k) or method(fits[d].sources[k]) != method(f.sources.get(k, ""))}
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
