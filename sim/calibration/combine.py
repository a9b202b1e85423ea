"""The combine side: the float32 kernel's per-tile combine task, the final ordered combine, and a
GEMM1 task's stores of a peer's tile over NVLink. The combines are timed inside the megakernel on
layers no measured run uses (the in_layer section) where IN_LAYER_MIN or more were: fixed + bytes
x (the L2's rate x held + HBM's x (1 - held)), the knee searched (common.fixed_and_rates); the
final combine falls back on its microbenchmark. Residual bounds: TILE_COMBINE_BOUND and REDUCE_BOUND."""

from __future__ import annotations

import numpy as np

from .. import costs
from .common import IN_LAYER_MIN, Fit, fixed_and_rates, layer_label, preset_with, tokens_label

# (mean, largest) |model - measured| / measured over the fitted points: the per-tile combine's few
# blocks' medians, the final combine's
TILE_COMBINE_BOUND = (0.15, 0.30)
REDUCE_BOUND = (0.05, 0.10)
TILE_COMBINE = ("tile_combine_fixed_ns", "tile_combine_l2_ns_per_byte", "tile_combine_ns_per_byte",
                "tile_combine_knee_bytes")
REDUCE = ("reduce_fixed_ns", "reduce_ns_per_byte", "reduce_l2_ns_per_byte", "reduce_knee_bytes")


def fit_tile_combine(layers: list[dict], dtype: str, origin: str) -> Fit:
    """The per-tile combine's median time = fixed + its median tile bytes x (L2 rate x held + HBM
    rate x (1 - held)), held = min(1, knee / the layer's returned bytes). A bf16 build's task only
    marks its tile's arrival: its fixed time alone, the median of the layers' medians. A file
    without those layers: 0, the model prices the task at copy_rows' rate alone."""
    f = Fit()
    timed = [c for c in layers if c.get("tile_combine_ns", {}).get("n")]
    weighted = costs.WEIGHTED_IN_TASK.get(dtype, True)
    if len(timed) < IN_LAYER_MIN:
        for name in TILE_COMBINE:
            f.set(name, 0.0, f"{origin}: 0, no per-tile combine timed in the layers (a file from before it): "
                             "copy_rows' rate alone")
        return f
    if not weighted:
        mark = float(np.median([c["tile_combine_ns"]["median"] for c in timed]))
        how = (f"{origin}: the bf16 build's task only marks its tile's arrival: the median of its tasks' medians "
               f"inside the megakernel at {tokens_label(timed)} tokens (layers no measured run uses)")
        for name in TILE_COMBINE:
            f.set(name, mark if name == "tile_combine_fixed_ns" else 0.0, how)
        for c in timed:
            f.check(f"in layer: per-tile combine (a mark), {layer_label(c)} (ns)", c["tile_combine_ns"]["median"], mark)
        return f
    points = [(f"in layer: per-tile combine, {layer_label(c)}", c["tile_combine_bytes"]["median"],
               costs.returned_bytes(c["tokens"], c["top_k"], c["hidden"], c["bytes_per_value"]),
               c["tile_combine_ns"]["median"]) for c in timed]
    how = (f"{origin}: the per-tile combine tasks inside the megakernel at {tokens_label(timed)} tokens (layers no "
           "measured run uses), least squares of relative residuals of time = fixed + the tile's bytes x (L2 rate x "
           "held + HBM rate x (1 - held)), held = min(1, knee / the layer's returned bytes), the knee where it halves "
           "one rate's")
    knee, fixed, l2, hbm = fixed_and_rates(points)
    for name, v in zip(TILE_COMBINE, (fixed, l2, hbm, knee)):
        f.set(name, max(float(v), 0.0), how)
    hw = preset_with(f.values, TILE_COMBINE)
    for point, nbytes, total, y in points:
        f.check(f"{point} (ns)", y, hw.tile_combine_fixed_ns + nbytes * costs.tile_combine_ns_per_byte_at(hw, total))
    return f


def _reduce_rows(points: list[dict]) -> list[tuple[str, float, float, float]]:
    """The ordered combine microbenchmark's (name, bytes a block moves, all blocks' bytes, time) rows."""
    rows = []
    for c in points:
        nb = c.get("bytes_per_value", 4)  # files before bf16 measured float32 rows only
        busiest = int(costs.reduce_tokens(c["tokens"], c["n_proc"]).max())
        moved = costs.reduce_bytes(busiest, c["top_k"], c["hidden"], nb)
        total = costs.reduce_bytes(c["tokens"], c["top_k"], c["hidden"], nb)
        rows.append((f"microbenchmark: ordered combine of {c['tokens']} tokens, per block", moved, total,
                     c["ns_per_block"]["median"]))
    return rows


def _reduce_from_microbenchmark(rows: list, points: list[dict], knee: float, origin: str) -> tuple:
    """(knee, fixed, L2 rate, HBM rate, how): one rate at one layer size, else the two with held
    over l2_knee_bytes `knee`, no fixed time."""
    if len(rows) == 1:
        _, moved, total, y = rows[0]
        return 0.0, 0.0, 0.0, y / moved, f"{origin}: the ordered combine microbenchmark at one layer size: one rate"
    held = [costs.l2_held(knee, total) for _, _, total, _ in rows]
    a = np.array([(1.0 - h, h) for h in held])
    (hbm, l2), *_ = np.linalg.lstsq(a, np.array([y / moved for _, moved, _, y in rows]), rcond=None)
    return knee, 0.0, l2, hbm, (f"{origin}: the ordered combine microbenchmark at {tokens_label(points)} tokens, least "
                                "squares of time per byte = L2 rate x held + HBM rate x (1 - held), held = min(1, "
                                "l2_knee_bytes / all blocks' bytes)")


def _final_combines(layers: list[dict]) -> list[tuple[str, float, float, float]]:
    """(name, the busiest blocks' bytes, all blocks' bytes, median time) of in-layer `layers`."""
    return [(f"in layer: final combine, {layer_label(c)}, busiest blocks",
             costs.reduce_bytes(c["combine_tokens_per_block"], c["top_k"], c["hidden"], c["bytes_per_value"]),
             costs.reduce_bytes(c["tokens"], c["top_k"], c["hidden"], c["bytes_per_value"]),
             c["final_combine_ns"]["median"]) for c in layers]


def fit_reduce(points: list[dict], layers: list[dict], l2_knee: float, origin: str,
               checks: list[dict] = ()) -> Fit:
    """The final combine's time per block: from the megakernel's own layers (the rows GEMM1 just
    wrote), held = min(1, knee / all blocks' bytes), the knee searched; else from the
    microbenchmark `points` with the copies' knee `l2_knee`. The in-layer `checks` (layers at
    another k) are predicted, not fitted."""
    rows = _reduce_rows(points)
    in_layer = _final_combines(layers)
    if len(in_layer) >= IN_LAYER_MIN:
        knee, fixed, l2, hbm = fixed_and_rates(in_layer)
        how = (f"{origin}: the final combine inside the megakernel at {tokens_label(layers)} tokens (layers no "
               "measured run uses), least squares of relative residuals of time = fixed + bytes x (L2 rate x held + "
               "HBM rate x (1 - held)), held = min(1, knee / all blocks' bytes), the knee where it halves one rate's")
        fitted = in_layer
    else:
        knee, fixed, l2, hbm, how = _reduce_from_microbenchmark(rows, points, l2_knee, origin)
        fitted = rows
    f = Fit()
    for name, v in zip(REDUCE, (fixed, hbm, l2, knee)):
        f.set(name, max(float(v), 0.0), how)
    hw = preset_with(f.values, REDUCE)
    for point, moved, total, y in rows + in_layer + _final_combines(checks):
        note = "" if any(point == r[0] for r in fitted) else "; not fitted"
        f.check(f"{point} (ns{note})", y, hw.reduce_fixed_ns + moved * costs.reduce_ns_per_byte_at(hw, total))
    return f


def fit_return_store(raw: dict, put_nvlink_ns_per_byte: float, nvlink_latency_ns: float, origin: str) -> Fit:
    """A GEMM1 task's stores into the peer per byte of its output: the median of the tasks of the
    peer's tiles over those of the GPU's own, less GEMM0's (the same tiles, nothing stored away)
    and less the task's fence after them (a round trip, costs.return_fence_ns), on the in_layer
    layer of two GPUs; each of its tasks stores its tile's rows x its columns. Files without that
    layer: one block's put rate."""
    f = Fit()
    layers = [c for c in raw.get("in_layer") or [] if c.get("world", 1) > 1 and c.get("gemm_by_source")]
    if not layers:
        f.set("return_store_ns_per_byte", put_nvlink_ns_per_byte, f"{origin}: not measured (no in-layer layer on two "
              "GPUs): put_nvlink_ns_per_byte, one block's put rate")
        return f
    c = layers[0]
    by = c["gemm_by_source"]

    def extra(task: str) -> float:
        return by[task]["peer"]["median"] - by[task]["home"]["median"]

    nbytes = c["tile_rows"]["median"] * c["tile_n"] * c["bytes_per_value"]
    fence = costs.return_fence_ns(preset_with({"nvlink_latency_ns": nvlink_latency_ns}, ("nvlink_latency_ns",)))
    f.set("return_store_ns_per_byte", max(extra("gemm1") - extra("gemm0") - fence, 0.0) / nbytes,
          f"{origin}: GEMM1 tasks of the peer's tiles against the GPU's own, less GEMM0's difference and the "
          f"task's fence ({fence:.0f} ns, a round trip), in the megakernel at {c['tokens']} tokens on "
          f"{c['world']} GPUs (no measured run's size), over a task's {nbytes:.0f} B of output")
    return f
