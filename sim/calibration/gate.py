"""The gate phase on `units` workers (blocks x their warpgroups, costs.gate_units): least squares of
its time over tokens, experts and top_k against the kernel's work items (H spanned per unit), slot
scans, a fixed time, the H split over units, the choices a token's first lane weighs, the logits a
selecting lane handles past its list, and its top-k selection (sim.costs.gate_kernel_ns): of a
point measured on the passes selection, the logits a selecting lane reads from shared and from
global memory; of one measured on the lists selection, the places a lane compares its logits at
(costs.GATE_SELECTS: a point records its selection, none the passes). Points of both selections
fit together: the rest of the phase is the same code, and the two kernels' points tell its figures
apart better than either alone (docs/notes/gate.md).

Two sets of points: the gate microbenchmark's (the gate's code alone, at the FlashMoE default's
H), and the megakernel's own gate phase on the in-layer layers run on one GPU (H 768 to 4096, k 1
to 8), which also hold what the megakernel's gate event adds to that code (gate_layer_ns, a fixed
time: costs.gate_ns). Residuals are relative: the points span 37 to 380 us. The routers are priced
alike: at one shape the zoo's other routers (gpu.microbench.GATE_ROUTER_POINTS, fitted as points
like the rest) take -5% to +6% of the softmax router's time, within the fit's residuals
(docs/notes/gate.md). Residual bound: BOUND."""

from __future__ import annotations

import numpy as np

from .. import costs
from .common import CalibrationError, Fit, need, one_gpu_layers

BOUND = (0.08, 0.15)  # (mean, largest) |model - measured| / measured over the fitted gate points
NAMES = ("gate_item_ns_per_h", "gate_slot_ns", "gate_fixed_ns", "gate_split_ns", "gate_select_smem_ns",
         "gate_select_global_ns", "gate_list_ns", "gate_weigh_ns", "gate_logit_ns", "gate_layer_ns")
HOW = ("time = H spanned per unit x a + slot scan x b + c + (H split over units) x d + logits considered by a "
       "selecting lane from shared memory x e and from global memory x f (passes selection) + list places a lane "
       "compares its logits at x g (lists selection) + choices a token's first lane weighs x h + logits a selecting "
       "lane handles past its list x i + j on the megakernel's own layers (costs.gate_work, costs.slot_scan, "
       "costs.gate_select_reads, costs.gate_list_steps, costs.gate_weighs, costs.gate_logit_reads), relative "
       "least squares")
# the passes selection's columns and the memory each reads from
SELECTIONS = ((NAMES.index("gate_select_smem_ns"), "shared"), (NAMES.index("gate_select_global_ns"), "global"))
LISTS = NAMES.index("gate_list_ns")  # the lists selection's column
LAYER = NAMES.index("gate_layer_ns")  # the megakernel's own gate's column


def selection(g: dict) -> str:
    """How the kernel that measured gate point `g` selected top-k (costs.GATE_SELECTS)."""
    return g.get("select", costs.UNRECORDED_SELECT)


def gate_rows(pts: list[dict], units: int, wgs: int) -> np.ndarray:
    """Each point's terms, in NAMES' order."""
    rows = []
    for g in pts:
        grid = g["grid"] * wgs if "grid" in g else units
        split = float(costs.gate_splits(g["tokens"], g["hidden"], grid) > 1)
        lists = selection(g) == "lists"
        passes = (0, 0) if lists else costs.gate_select_reads(g["tokens"], g["top_k"], g["experts"], grid)
        rows.append((costs.gate_work(g["tokens"], g["hidden"], g["experts"], grid),
                     costs.slot_scan(g["tokens"], g["top_k"], g["experts"], grid), 1.0, split, *passes,
                     costs.gate_list_steps(g["tokens"], g["top_k"], g["experts"], grid) if lists else 0,
                     costs.gate_weighs(g["tokens"], g["top_k"], grid),
                     costs.gate_logit_reads(g["tokens"], g["experts"], grid), float(g.get("layer", False))))
    return np.array(rows, np.float64)


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Least squares over the columns `keep` with every figure at least zero, by Lawson and Hanson's
    active set (a figure the data want negative, such as the slot scans of the bf16 128 x 256 build,
    as many per unit at 8 as at 64 and 128 experts, rests at zero). Clipping a negative figure threw
    the others off by 20%; dropping every negative one at once could drop a needed one with it."""
    norms = np.linalg.norm(a, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    s = a / scale  # unit columns, so one tolerance serves figures of every size
    tol = 1e-12 * max(1.0, float(np.abs(y).max()))
    free = keep & (norms > 0)
    x = np.zeros(a.shape[1])
    fitted = np.zeros(a.shape[1], bool)
    for _ in range(3 * a.shape[1]):
        grad = s.T @ (y - s @ x)
        want = free & ~fitted & (grad > tol)
        if not want.any():
            break
        fitted[np.argmax(np.where(want, grad, -np.inf))] = True
        while True:
            z = np.zeros_like(x)
            z[fitted], *_ = np.linalg.lstsq(s[:, fitted], y, rcond=None)
            if (z[fitted] > 0).all():
                x = z
                break
            low = fitted & (z <= 0)
            step = np.min(x[low] / (x[low] - z[low]))
            x = x + step * (z - x)
            fitted &= x > tol
            if not fitted.any():
                break
    return x / scale


def layer_gates(raw: dict) -> list[dict]:
    """The megakernel's gate phase on the in-layer layers run on one GPU that recorded it, as gate
    points (on more GPUs its event also waits for every rank's start)."""
    return [{"tokens": c["tokens"], "experts": c["experts"], "hidden": c["hidden"], "top_k": c["top_k"],
             "ns": c["gate_ns"]["median"], "select": selection(c), "layer": True}
            for c in one_gpu_layers(raw, any_width=True) if c.get("gate_ns")]


def point_label(g: dict) -> str:
    """A gate point's name in the fit's checks: its shape, router (where not the FlashMoE default's),
    selection and whether the megakernel measured it."""
    router = (f" {g['gate']}" if "gate" in g else "") + (f" {g['n_group']} groups" if g.get("n_group", 1) > 1 else "")
    layer = g.get("layer", False)
    return (f"gate T={g['tokens']} E={g['experts']} k={g['top_k']}" + (f" H={g['hidden']}" if layer else "")
            + router + (" lists" if selection(g) == "lists" else "") + (" in layer" if layer else "") + " (ns)")


def fit_gate(raw: dict, units: int, wgs: int, origin: str) -> Fit:
    """The gate's figures. The passes selection's time per logit (from shared or from global memory)
    is fitted only where the points vary top_k among layers whose logits are read from that memory:
    the E-dependent costs of points of one top_k (the softmax, the row counts) are no selection's.
    The lists selection's, only where a point measured it; what the megakernel's gate adds, only
    where an in-layer layer recorded its gate."""
    bench = need(raw, "gate", "gate phase times")
    if len(bench) < 4:
        raise CalibrationError("gate", len(bench), "at least 4 (tokens, experts) points")
    pts = bench + layer_gates(raw)
    for i, g in enumerate(pts):
        if selection(g) not in costs.GATE_SELECTS:
            where = f"gate[{i}]" if i < len(bench) else f"in_layer gate T={g['tokens']}"
            raise CalibrationError(f"{where}.select", selection(g), "one of " + ", ".join(costs.GATE_SELECTS))
    a = gate_rows(pts, units, wgs)
    y = np.array([g["ns"] for g in pts])
    lists = a[:, LISTS] > 0
    keep = np.ones(a.shape[1], bool)
    unfitted = {}
    for col, memory in SELECTIONS:
        ks = sorted({g["top_k"] for g, row in zip(pts, a) if row[col]})
        if len(ks) < 2:
            keep[col] = False
            unfitted[NAMES[col]] = (f"{origin}: none (no gate point with its logits in {memory} memory varies top_k: "
                                    f"{ks or 'none there'})")
    if not lists.any():
        keep[LISTS] = False
        unfitted[NAMES[LISTS]] = f"{origin}: none (no gate point measured the lists selection)"
    if len(pts) == len(bench):
        keep[LAYER] = False
        unfitted[NAMES[LAYER]] = f"{origin}: none (no in-layer layer on one GPU recorded the megakernel's gate)"
    coef = nonnegative_lstsq(a / y[:, None], np.ones_like(y), keep)
    f = Fit()
    n_layer = len(pts) - len(bench)
    for name, c in zip(NAMES, coef):
        f.set(name, float(c), unfitted.get(name) or f"{origin}: gate phase over {len(bench)} microbenchmark and "
              f"{n_layer} in-layer (tokens, experts, top_k) points, least squares of {HOW}")
    for g, row in zip(pts, a):
        f.check(point_label(g), g["ns"], float(row @ coef))
    return f
