"""The tile GEMM task's figures: time = gemm_fixed_ns + the multiply (its FLOPs, rows in whole
`gemm_row_group`s, at matrix_efficiency x the precision's peak per block) with its weight slice's
load (the whole slice's bytes x weight_stream_ns_per_byte, streamed through the L2 by every task,
plus its bytes over the tiles sharing it x weight_load_ns_per_byte, from HBM), added or overlapped
as the p-norm of `gemm_overlap_power` (sim.costs.task_ns prices every GEMM task, gated and shared
ones too, so). The stream is told apart from the fixed time only by tasks of GEMMs of several
depths (the in-layer layers of other widths); without them it is 0 and the fixed time holds it.

Points: the megakernel's own tasks on the in_layer layers of one GPU where IN_LAYER_MIN or more
timed them (tasks out of step, as in a measured layer), else the microbenchmark's at the
megakernel's grid (every block in step; their short tiles ran 10-13% longer than a layer's, H100).
Residual bound: BOUND."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .. import costs
from .common import IN_LAYER_MIN, LINE_MISS, CalibrationError, Fit, layer_label, need, one_gpu_layers, tokens_label

ROW_GROUPS = (16, 32, 64)  # the row groups a tile GEMM may compute in (its threads' rows x their count)
OVERLAP_POWERS = (1.5, 2.0, 3.0, 4.0)  # p-norms of a GEMM task's multiply and weight load the fit tries
OVERLAP_GAIN = 0.1  # the share of the added form's squared residuals a p-norm must take off to be kept
IN_LAYER_TASKS = 4  # tasks of one (kind, height, sharing) in a layer that make it a point of the fit
# (mean, largest) |model - measured| / measured over the fitted tasks, every committed file: a
# layer's typical tasks within a few %, its rare heights and the short tiles of its shallow GEMMs
# (a fixed time that weighs every GEMM alike prices them long) further (docs/notes/tile-gemm.md)
BOUND = (0.12, 0.55)


def gemm_points(raw: dict, blocks: int) -> tuple[list[dict], str]:
    """The tile GEMM tasks the fit takes and a phrase saying which."""
    layers = [c for c in one_gpu_layers(raw, any_width=True) if c.get("gemm")]
    if len(layers) >= IN_LAYER_MIN:
        pts = [g for c in layers for g in c["gemm"] if g["ns_per_task"]["n"] >= IN_LAYER_TASKS]
        return pts, f"the megakernel's own tasks on layers of {tokens_label(layers)} tokens (no measured run's size)"
    pts = [g for g in need(raw, "gemm", "tile GEMM task times") if g["blocks"] >= blocks]
    return pts, "the microbenchmark's tasks at the megakernel's grid"


def gemm_of(g: dict) -> tuple:
    """The GEMM a point's tasks belong to: its layer's (tokens, experts) and its kind and depth; one
    for all the microbenchmark's points of a kind and depth."""
    return g.get("tokens"), g.get("experts"), g["task"], g["k"]


def weight_alone(g: dict) -> float:
    """A task's weight slice's bytes over the tiles of its expert sharing it."""
    return g.get("weight_bytes", 0) / g.get("tiles_per_expert", 2)


def computed(flops, rows, group, whole: bool = False):
    """A task's FLOPs with its rows in whole groups (costs.grouped_rows)."""
    return costs.grouped_rows(rows, group, whole) * (flops / rows)


@dataclass
class Tasks:
    """The fitted tasks as arrays: FLOPs, rows, weight slice bytes (whole and alone), median time,
    and the square root of each point's weight: its share of the tasks of its GEMM (a layer's typical
    tasks, not its rare heights), every GEMM of the in-layer layers weighing as much as another (each
    is one shape of the fit set, whatever tokens it ran)."""

    flops: np.ndarray
    rows: np.ndarray
    slice: np.ndarray
    alone: np.ndarray
    ns: np.ndarray
    sw: np.ndarray

    @classmethod
    def of(cls, pts: list[dict]) -> Tasks:
        col = lambda fn: np.array([fn(g) for g in pts], np.float64)  # noqa: E731
        n = col(lambda g: g["ns_per_task"].get("n", 1))
        gemm = [gemm_of(g) for g in pts]
        of_gemm: dict[tuple, float] = defaultdict(float)  # each GEMM's tasks
        for c, key in zip(n, gemm):
            of_gemm[key] += c
        return cls(col(lambda g: g["flops"]), col(lambda g: g["rows"]), col(lambda g: g.get("weight_bytes", 0)),
                   col(weight_alone), col(lambda g: g["ns_per_task"]["median"]),
                   np.sqrt(n / np.array([of_gemm[k] for k in gemm])))

    @property
    def shared(self) -> bool:  # files from before the sharing points (2 tiles per expert throughout): no weight term
        return len(set(self.alone.tolist())) > 1

    @property
    def deep(self) -> bool:  # tasks of one GEMM depth only: the stream is not told from the fixed time
        return len(set(self.slice.tolist())) > 1

    def load_columns(self) -> list[np.ndarray]:
        """The weight load's terms the points tell apart: the whole slice (streamed), its share alone."""
        return ([self.slice] if self.deep else []) + ([self.alone] if self.shared else [])

    def load_figures(self, coefs) -> tuple[float, float]:
        """(per byte streamed, per byte alone) from coefficients in load_columns' order; 0 for a
        term the points do not tell apart."""
        it = iter(coefs)
        return (float(next(it)) if self.deep else 0.0), (float(next(it)) if self.shared else 0.0)

    def lstsq(self, cols: list[np.ndarray], y: np.ndarray) -> tuple[np.ndarray, float]:
        a = np.column_stack(cols)
        coef, *_ = np.linalg.lstsq(a * self.sw[:, None], y * self.sw, rcond=None)
        return coef, float(np.sum(((a @ coef - y) * self.sw) ** 2))


def row_group(t: Tasks) -> tuple[int, np.ndarray, float]:
    """(group, coefficients of fixed + computed FLOPs [+ weight bytes], the straight line's worst
    miss): a group among ROW_GROUPS below the tallest tile is kept where the straight line misses a
    task by more than LINE_MISS and the group at least halves its squared residuals (the float32
    SIMT GEMM gives each thread 4 rows of every 64: its 32-row tasks take about its 64-row ones')."""
    extra = t.load_columns()
    one = np.ones_like(t.flops)

    def solve(group):
        a = np.column_stack([one, computed(t.flops, t.rows, group)] + extra)
        coef, sse = t.lstsq(list(a.T), t.ns)
        return coef, sse, float(np.max(np.abs(a @ coef - t.ns) / t.ns))

    coef, line_sse, line_miss = solve(1)
    group, sse = 1, line_sse
    for gr in ROW_GROUPS if line_miss > LINE_MISS else ():
        if gr < t.rows.max():
            c, e, _ = solve(gr)
            if c[1] > 0 and e <= line_sse / 2 and e < sse:
                group, coef, sse = gr, c, e
    return group, coef, line_miss


def wgmma_rows(t: Tasks) -> tuple[int, np.ndarray, float]:
    """row_group's answer for a tensor-core build: its multiply's whole row blocks, not searched."""
    extra = t.load_columns()
    group = costs.WGMMA_ROW_BLOCK
    coef, _ = t.lstsq([np.ones_like(t.flops), computed(t.flops, t.rows, group, True)] + extra, t.ns)
    return group, coef, 0.0


def fit_overlap(t: Tasks, work: np.ndarray, power: float, peak: float) -> tuple[float, float, float, float, float]:
    """rate, fixed, per byte streamed, per byte alone of y = fixed + costs.overlapped(work / rate,
    stream x slice + per byte x alone, power) by weighted least squares over `t`'s tasks, the rate at
    most `peak` (rate and the load's figures on log grids, narrowed around their best; a load term
    the points do not tell apart stays 0; fixed, given them, in closed form, at least 0): (rate,
    fixed, stream, per byte, squared residuals)."""
    y, weight = t.ns, t.sw ** 2
    loads = t.load_columns()
    wide = 61 if len(loads) == 1 else 21  # points a load's first grid has (two loads: a coarser cube)
    grids = [np.geomspace(peak / 30, peak, 41)] + [np.geomspace(1e-5, 10.0, wide) for _ in loads]

    def solve(axes):
        # costs.overlapped over the mesh, each term's p-th power on its own axes: one sum and one
        # root over the whole mesh (rate x load figures x tasks)
        multiply = (work / axes[0][:, None]) ** power
        load = sum((m[..., None] * col for m, col in zip(np.meshgrid(*axes[1:], indexing="ij"), loads)),
                   np.zeros_like(y)) ** power
        base = _root(multiply.reshape(len(axes[0]), *[1] * len(loads), len(y)) + load, power)
        beyond = y - base  # each task's time beyond its multiply and load: the fixed time and the residual
        fixed = np.maximum(beyond @ weight / np.sum(weight), 0.0)
        left = beyond - fixed[..., None]
        return fixed, (left * left) @ weight

    for _ in range(5):
        _, sse = solve(grids)
        best = np.unravel_index(int(np.argmin(sse)), sse.shape)
        grids = [np.geomspace(g[max(i - 1, 0)], g[min(i + 1, len(g) - 1)], 21) for g, i in zip(grids, best)]
    fixed, sse = solve(grids)
    best = np.unravel_index(int(np.argmin(sse)), sse.shape)
    rate, *load = (float(g[i]) for g, i in zip(grids, best))
    return rate, float(fixed[best]), *t.load_figures(load), float(sse[best])


def _root(x: np.ndarray, power: float) -> np.ndarray:
    """x ** (1 / power), through the square and cube roots where `power` is 2, 3 or 4 (far faster
    than the general power over the fit's whole mesh)."""
    if power == 2:
        return np.sqrt(x)
    if power == 3:
        return np.cbrt(x)
    if power == 4:
        return np.sqrt(np.sqrt(x))
    return x ** (1.0 / power)


def rate_and_terms(t: Tasks, work: np.ndarray, slope: float, peak: float) -> tuple[float, float, float, float, float,
                                                                                   float]:
    """(rate, fixed, stream, per byte, power, share of squared residuals the p-norm took off): the
    rate the slope gives, at most `peak`; fixed and the load's figures again with it, multiply and
    load added; then each p-norm of OVERLAP_POWERS (where there is a load term), kept where it takes
    OVERLAP_GAIN or more off the added form's squared residuals (a slice streamed from HBM hides a
    short tile's multiply: one H200's bf16 tasks alone on their expert took 38-44 us for 13-128 rows)."""
    rate = min(1.0 / slope, peak) if slope > 0 else peak
    loads = t.load_columns()
    sol, added_sse = t.lstsq([np.ones_like(work)] + loads, t.ns - work / rate)
    fixed, (stream, per_byte) = sol[0], t.load_figures(sol[1:])
    power, best_sse = 1.0, added_sse
    for pw in OVERLAP_POWERS if loads else ():
        r, fx, st, pb, e = fit_overlap(t, work, pw, peak)
        if e <= (1 - OVERLAP_GAIN) * added_sse and e < best_sse:
            power, rate, fixed, stream, per_byte, best_sse = pw, r, fx, st, pb, e
    return rate, float(fixed), float(stream), float(per_byte), power, 1 - best_sse / added_sse if added_sse else 0.0


def fit_gemm(raw: dict, hw, blocks: int, origin: str, dtype: str) -> Fit:
    """The tile GEMM task's figures from `raw`'s GEMM points on `blocks` blocks of preset `hw`."""
    pts, which = gemm_points(raw, blocks)
    pts = sorted(pts, key=lambda g: g["flops"])
    if len({g["flops"] for g in pts}) < 2:
        raise CalibrationError("gemm", len(pts), "tasks of two tile heights at the megakernel's grid")
    t = Tasks.of(pts)
    whole = dtype in costs.WHOLE_ROW_BLOCKS
    group, coef, line_miss = wgmma_rows(t) if whole else row_group(t)
    peak = hw.tflops(dtype) * 1e3 / blocks  # flops per ns of one block at the dtype's peak
    rate, fixed, stream, per_byte, power, gain = rate_and_terms(t, computed(t.flops, t.rows, group, whole), coef[1],
                                                                peak)
    heights = sorted({g["rows"] for g in pts})
    f = Fit()
    span = f"{heights[0]} to {heights[-1]}" if len(heights) > 4 else str(heights)
    f.set("matrix_efficiency", rate / peak, f"{origin}: slope of the tile GEMM task time over tile heights {span} "
          f"({which}){' beside the p-norm of gemm_overlap_power' if power > 1 else ''}: {rate:.0f} FLOP/ns per "
          f"block (capped at the {dtype} peak, {peak:.0f})")
    f.set("gemm_row_group", float(group) if group > 1 else 0.0,
          f"{origin}: the build's tensor-core GEMM (tile_gemm_wgmma.cuh) multiplies whole {group}-row blocks of A "
          "(costs.WGMMA_ROW_BLOCK)" if whole else
          f"{origin}: the group of least squares among {list(ROW_GROUPS)} rows (the straight line missed a task by "
          f"{100 * line_miss:.0f}%; the group halves its squared residuals or more)" if group > 1 else
          f"{origin}: none (the straight line misses no task by more than {100 * LINE_MISS:.0f}%, or no group among "
          f"{list(ROW_GROUPS)} rows halves its squared residuals)")
    _record_terms(f, t, fixed, stream, per_byte, power, gain, pts, origin)
    if t.shared:  # the first-principles rate beside it: a block's share of HBM
        f.check("weight slice streamed alone, ns per byte (the fit; model: HBM rate / blocks; not fitted)",
                f.values["weight_load_ns_per_byte"], blocks / hw.hbm_gbps)
    full = max(pts, key=lambda g: (g["flops"], g.get("tiles_per_expert", 2) == 2))
    _check_tasks(f, raw, {id(g) for g in pts}, blocks, full, rate, whole)
    return f


def _record_terms(f: Fit, t: Tasks, fixed: float, stream: float, per_byte: float, power: float, gain: float,
                  pts: list[dict], origin: str) -> None:
    sharing = sorted({g.get("tiles_per_expert", 2) for g in pts})
    depths = sorted({g["k"] for g in pts})
    f.set("gemm_fixed_ns", max(fixed, 0.0), f"{origin}: the same tasks' time beyond their FLOPs at that rate"
          + (" and their weight loads" if t.shared or t.deep else ""))
    f.set("weight_stream_ns_per_byte", max(stream, 0.0),
          f"{origin}: the same least squares over GEMMs of depth {', '.join(map(str, depths))} (each task's whole "
          "weight slice, streamed through the L2)"
          if t.deep else f"{origin}: not measured (every task of depth {depths[0]}): in gemm_fixed_ns")
    f.set("weight_load_ns_per_byte", max(per_byte, 0.0),
          f"{origin}: the same least squares over {sharing} tiles per expert sharing each weight slice"
          if t.shared else f"{origin}: not measured (every task at 2 tiles per expert): in gemm_fixed_ns")
    f.set("gemm_overlap_power", power if power > 1 else 0.0,
          f"{origin}: the p-norm of multiply and load among {list(OVERLAP_POWERS)} of least squares over the same "
          f"tasks ({100 * gain:.0f}% fewer squared residuals than the two added)"
          if power > 1 else f"{origin}: none (added: no p-norm among {list(OVERLAP_POWERS)} took "
          f"{100 * OVERLAP_GAIN:.0f}% off the squared residuals)" if t.shared or t.deep else
          f"{origin}: not measured (no weight term): added")
    f.set("task_overhead_ns", 0.0, f"{origin}: 0, every microbenchmark times a whole task body (its overhead "
          "included); the gap between tasks is handoff_ns")


def task_model_ns(values: dict, rate: float, g: dict, whole: bool = False) -> float:
    """A microbenchmark row's time under the fitted figures `values` and block rate `rate` (its rows
    in whole groups of gemm_row_group, in warps' shares of a short tile unless `whole`)."""
    group = values["gemm_row_group"] or 1
    load = values["weight_stream_ns_per_byte"] * g.get("weight_bytes", 0) + \
        values["weight_load_ns_per_byte"] * weight_alone(g)
    return values["gemm_fixed_ns"] + float(costs.overlapped(computed(g["flops"], g["rows"], group, whole) / rate,
                                                            load, values["gemm_overlap_power"]))


def _check_tasks(f: Fit, raw: dict, fitted: set, blocks: int, full: dict, rate: float, whole: bool) -> None:
    """Every GEMM row of the file against the model at block rate `rate` (those the fit did not
    take say so), and the scheduler layer's median task against the tallest fitted task's model."""
    for g in raw["gemm"] + [g for c in raw.get("in_layer") or [] for g in c.get("gemm", [])]:
        where = f"in layer {layer_label(g)}, " if "tokens" in g else ""
        note = "" if id(g) in fitted else ", alone; not fitted" if g["blocks"] < blocks else "; not fitted"
        share = f", {g['tiles_per_expert']} tiles per expert" if g.get("tiles_per_expert", 2) != 2 else ""
        f.check(f"{where}{g['task']} {g['rows']} rows{share}, {g['blocks']} blocks (ns{note})",
                g["ns_per_task"]["median"], task_model_ns(f.values, rate, g, whole))
    layer = (raw.get("scheduler") or {}).get("task_ns")
    if layer:
        f.check("megakernel task on the scheduler layer, median (ns; not fitted)", layer["median"],
                task_model_ns(f.values, rate, full, whole))
