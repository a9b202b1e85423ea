"""What every calibration fit shares: the `Fit` it returns, its error, the rows a file must hold,
and the least-squares forms of a cost that is fixed + bytes at the L2's rate up to a knee and
HBM's beyond (`fixed_and_rates`), or that saturates with the bytes in flight (`saturating`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# a knee or a row group is looked for only where the straight line misses a point by more than
# this (the microbenchmark's medians repeat within 1-2% between calls)
LINE_MISS = 0.02
IN_LAYER_MIN = 3  # layers of the in_layer section that a fit from them needs (dispatch, GEMM, combines)
# grids of the moves' fits: the knee (0: slower from the first byte) and the half point, in bytes
KNEES = np.concatenate([[0.0], np.geomspace(2 ** 20, 2 ** 28, 65)])
HALVES = np.geomspace(2 ** 16, 2 ** 31, 61)


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

    def merge(self, other: Fit) -> Fit:
        """This fit with `other`'s figures, sources and residuals added after its own."""
        self.values.update(other.values)
        self.sources.update(other.sources)
        self.residuals.extend(other.residuals)
        return self

    def fitted_misses(self) -> tuple[float, float]:
        """(mean, largest) |model - measured| / measured over the points the fit took (not the
        checks, whose names say "not fitted"); (0, 0) where it took none."""
        miss = [abs(y - m) / m for p, m, y in self.residuals if m and "not fitted" not in p]
        return (sum(miss) / len(miss), max(miss)) if miss else (0.0, 0.0)


def need(raw: dict, key: str, what: str):
    """`raw[key]`, or one error naming it, what it should hold and the microbenchmark's failure if any."""
    v = raw.get(key)
    if not v:
        failed = raw.get("failed", {}).get(key, "").splitlines()[:1]
        raise CalibrationError(key, v, what + (f" (the microbenchmark failed: {failed[0]})" if failed else ""))
    return v


def most_common(values: list):
    """The value most of `values` have (None for none)."""
    return max(set(values), key=values.count) if values else None


def entry_world(raw: dict, entry: dict):
    """An entry's GPUs (files from before the entries said theirs: the file's world)."""
    return entry.get("world", raw.get("world"))


def one_gpu_layers(raw: dict, any_width: bool = False, other_k: bool = False) -> list[dict]:
    """The in_layer section's layers run on one GPU alone (entries from before `world` was
    recorded: the file's world), of most layers' widths (hidden, ffn) and k unless `any_width`: the
    layers of other widths are the tile GEMM's (its tasks' depths), and the other fits keep to the
    widths and the k they were made on. With `other_k`, the layers of those widths at another k
    instead: the checks of how the rows a token reads and returns scale, never fitted."""
    layers = [c for c in raw.get("in_layer") or [] if entry_world(raw, c) == 1]
    if any_width:
        return layers
    widths = [(c.get("hidden"), c.get("ffn")) for c in layers]
    usual = most_common(widths)
    k = most_common([c.get("top_k") for c, w in zip(layers, widths) if w == usual])
    return [c for c, w in zip(layers, widths) if w == usual and (c.get("top_k") != k) == other_k]


def tokens_label(points: list[dict]) -> str:
    """The layers' token counts, with the experts, or the widths, of a layer whose count or widths are
    not most layers' (the in-layer section's sharing layer and its layers of other GEMM depths)."""
    experts, widths = (most_common([p.get(key) for p in points]) for key in ("experts", "hidden"))
    return ", ".join(f"{p['tokens']}" + (f" ({p.get('experts')} experts)" if p.get("experts") != experts else "")
                     + (f" (H {p['hidden']}, I {p.get('ffn')})" if p.get("hidden") != widths else "")
                     for p in points)


def layer_label(c: dict) -> str:
    """An in-layer entry's name in the fits' checks: its tokens, and its experts, k and widths where
    the entry has them."""
    return (f"T={c['tokens']}" + (f" E={c['experts']}" if "experts" in c else "")
            + (f" k={c['top_k']}" if "top_k" in c else "") + (f" H={c['hidden']} I={c['ffn']}" if "ffn" in c else ""))


def fixed_and_rates(points: list[tuple[str, float, float, float]]) -> tuple[float, float, float, float]:
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


def saturating(points: list[tuple[float, float]], knee: float) -> tuple[float, float, float, float]:
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


def preset_with(given: dict, names) -> object:
    """A preset carrying `given`'s figures `names` (those it has) over h200-sxm's, for a fit's model
    of its own points (every other figure it reads is among `names`)."""
    from ..hardware import PRESETS

    return PRESETS["h200-sxm"].replace(**{k: given[k] for k in names if k in given})
