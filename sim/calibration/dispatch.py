"""The dispatch: a share of a tile stored into this GPU's inbox, all processors at once on one GPU
alone (on two the NVLink shares beside it hold it back, which the model checks, not fits). From the
megakernel's own layers where IN_LAYER_MIN or more were timed (right after the gate, the scheduler
and subscriber polling beside it): a share's median time = dispatch_store_fixed_ns + the first
round's mean share of bytes x (the L2's rate x held + HBM's x (1 - held)), held = min(1, knee / the
GPU's tokens' bytes, which the shares gather), the knee searched (costs.dispatch_ns charges every
share that mean); else the dispatch microbenchmark, least squares of time = fixed + bytes x per
byte. Every dispatch entry (put path, two GPUs) is checked against the moves' figures. Residual
bound: BOUND.

A block's walk to its shares (`fit_deal`): from the same layers' deal_walk, a block's turnaround
before its first share = deal_first_ns, before each next = deal_share_ns, both + deal_count_ns x
the experts' row counts its deal read since (least squares of the medians, each weighted by its
shares); residual bound: DEAL_BOUND."""

from __future__ import annotations

import numpy as np

from reference.plan import LOCAL, NVLINK

from .. import costs
from .common import (
    IN_LAYER_MIN,
    Fit,
    entry_world,
    fixed_and_rates,
    layer_label,
    one_gpu_layers,
    preset_with,
    tokens_label,
)
from .moves import MOVE_FIGURES

BOUND = (0.10, 0.20)  # (mean, largest) |model - measured| / measured over the fitted dispatch shares
NAMES = ("dispatch_store_fixed_ns", "dispatch_store_l2_ns_per_byte", "dispatch_store_ns_per_byte",
         "dispatch_store_knee_bytes")
DEAL_NAMES = ("deal_first_ns", "deal_share_ns", "deal_count_ns")
DEAL_BOUND = (0.15, 0.35)  # (mean, largest) over the walks' medians (a single share's turnaround is ~2 us)


def _shares(layers: list[dict]) -> list[tuple[str, float, float, float]]:
    """(name, a share's mean bytes, the GPU's tokens' bytes, median time) of in-layer `layers`."""
    return [(f"in layer: dispatch share, {layer_label(c)}, {c['inflight_bytes'] / 2 ** 20:.1f} MiB in flight",
             c["inflight_bytes"] / c["first_round_shares"], c["tokens"] * c["hidden"] * c["bytes_per_value"],
             c["dispatch_ns"]["median"]) for c in layers]


def fit_store(pts: list[dict], layers: list[dict], hw, origin: str, checks: list[dict] = ()) -> Fit:
    """The store path's figures from the in-layer `layers` or the one-GPU store shares `pts`;
    files with neither keep preset `hw`'s figures (a gather at the copy rate). The in-layer
    `checks` (layers at another k) are predicted, not fitted."""
    f = Fit()
    in_layer = _shares(layers)
    if len(layers) >= IN_LAYER_MIN:
        knee, fixed, l2, hbm = fixed_and_rates(in_layer)
        how = (f"{origin}: the dispatch shares inside the megakernel at {tokens_label(layers)} tokens (layers no "
               "measured run uses, one GPU), least squares of relative residuals of time = fixed + bytes x (L2 rate x "
               "held + HBM rate x (1 - held)), held = min(1, knee / the GPU's tokens' bytes, which the shares gather), "
               "the knee where it halves one rate's")
    elif len(pts) >= 2:
        a = np.array([(1.0, d["rows"]["median"] * d["bytes_per_row"]) for d in pts])
        (fixed, hbm), *_ = np.linalg.lstsq(a, np.array([d["ns_per_tile"]["median"] for d in pts]), rcond=None)
        knee = l2 = 0.0
        how = (f"{origin}: a share of a stored dispatch tile at {len(pts)} layer sizes ({tokens_label(pts)} tokens, "
               "all processors at once, one GPU), least squares of time = fixed + bytes x per byte")
    else:
        for name in NAMES:
            f.set(name, getattr(hw, name), f"{origin}: no store-path dispatch timed on one GPU alone (a file from "
                  "before it): the base preset's")
        return f
    for name, v in zip(NAMES, (fixed, l2, hbm, knee)):
        f.set(name, max(float(v), 0.0), how)
    model = preset_with(f.values, NAMES)
    for point, nbytes, tokens, y in in_layer:
        f.check(f"{point} (ns)", y, costs.store_dispatch_ns(model, nbytes, tokens))
    for point, nbytes, tokens, y in _shares(checks):
        f.check(f"{point} (ns; not fitted)", y, costs.store_dispatch_ns(model, nbytes, tokens))
    return f


def _walks(c: dict) -> list[tuple[str, int, float, int]]:
    """(which, counts read, median ns, shares) of an in-layer entry's deal_walk: "first" and "next"
    shares apart, or (entries from before they were) "any"."""
    walk = c["deal_walk"]
    parts = [(w, walk[w]) for w in ("first", "next") if w in walk] or [("any", walk)]
    return [(w, loads, ns, n) for w, d in parts for loads, ns, n in zip(d["loads"], d["ns"], d["n"])]


def fit_deal(layers: list[dict], origin: str) -> Fit:
    """deal_first_ns, deal_share_ns and deal_count_ns from the in-layer `layers`' walks (deal_walk):
    a block's first share after its turnaround (deal_first_ns: its deal reads its list before it),
    each next after the turnaround between shares (deal_share_ns), both plus the counts read x
    deal_count_ns; entries that timed every share together give one turnaround for both; files from
    before the microbenchmark timed them: 0 (the walk not modelled)."""
    f = Fit()
    timed = [c for c in layers if c.get("deal_walk")]
    pts = [(c, *walk) for c in timed for walk in _walks(c)]
    if len({loads for _, _, loads, _, _ in pts}) < 2:
        for name in DEAL_NAMES:
            f.set(name, 0.0, f"{origin}: no block's walk to its dispatch shares timed (a file from before it): "
                  "not modelled")
        return f
    which = [w for _, w, _, _, _ in pts]
    x, y, n = (np.array([p[i] for p in pts], np.float64) for i in (2, 3, 4))
    kinds = [k for k in ("first", "next", "any") if k in which]
    a = np.column_stack([[float(w == k) for w in which] for k in kinds] + [x]) * np.sqrt(n)[:, None]
    coef, *_ = np.linalg.lstsq(a, y * np.sqrt(n), rcond=None)
    turn = dict(zip(kinds, coef[:-1]))
    first, share = turn.get("first", turn.get("any", 0.0)), turn.get("next", turn.get("any", 0.0))
    how = (f"{origin}: each block's turnaround before its dispatch shares inside the megakernel at "
           f"{tokens_label(timed)} tokens (one GPU, every expert's row count read in turn), least squares of the "
           "medians by counts read, each weighted by its shares, of time = turnaround (a block's first share, its "
           "next ones) + counts x per count")
    for name, v in zip(DEAL_NAMES, (first, share, coef[-1])):
        f.set(name, max(float(v), 0.0), how)
    v = f.values
    for c, w, loads, ns, shares in pts:
        turnaround = v["deal_first_ns"] if w == "first" else v["deal_share_ns"]
        f.check(f"in layer: walk to a dispatch share ({w}), {layer_label(c)}, {loads} counts read, {shares} shares "
                "(ns)", ns, turnaround + loads * v["deal_count_ns"])
    return f


def fit_dispatch(raw: dict, hw, origin: str, given: dict) -> Fit:
    """The store path's figures, and every dispatch entry checked against them and `given`'s moves."""
    dispatches = raw.get("dispatch", [])
    layers = one_gpu_layers(raw)
    f = fit_store([d for d in dispatches if d.get("path") == "store" and d["peer"] == "self"
                   and entry_world(raw, d) == 1], layers, hw, origin, one_gpu_layers(raw, other_k=True))
    model = preset_with({**given, **f.values}, MOVE_FIGURES + NAMES)

    def layer_of(d: dict) -> tuple:  # the dispatch an entry belongs to: its tokens, GPUs and path
        return d.get("tokens"), entry_world(raw, d), d.get("path")

    for d in dispatches:
        # files before the kernel stored dispatched rows timed packed and put tiles, one a block
        n, link, path = d["concurrent_blocks"], LOCAL if d["peer"] == "self" else NVLINK, d.get("path", "put")
        nbytes = d["rows"]["median"] * d["bytes_per_row"]
        # the shares over each link in the same layer's dispatch (its other entry, on two GPUs)
        over = {LOCAL if e["peer"] == "self" else NVLINK: e.get("shares", e.get("tiles")) for e in dispatches
                if layer_of(e) == layer_of(d)}
        tokens = d["tokens"] * d["bytes_per_row"] if "tokens" in d else None
        ns = costs.dispatch_ns(model, nbytes, link, path, n * nbytes, over, tokens) - model.task_overhead_ns
        layer = f"T={d['tokens']}, " if "tokens" in d else ""
        world = entry_world(raw, d)
        fitted = path == "store" and link == LOCAL and world == 1 and not layers and \
            f.values["dispatch_store_ns_per_byte"]
        f.check(f"dispatch ({path}) of {d['rows']['median']:.0f} rows to {d['peer']}, {layer}{world} GPU(s), "
                f"{n} blocks (ns{'' if fitted else '; not fitted'})", d["ns_per_tile"]["median"], ns)
    return f
