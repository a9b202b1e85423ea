"""Byte moves by the processors: copy_rows of a tile and its put to the block's own GPU by 1 to
all blocks at once (time per byte flat while the L2 holds all blocks' bytes in flight, up to
l2_knee_bytes, then saturating towards + extra: one knee for copies and local puts, the same
L2), a put over NVLink by one block alone and the largest aggregate to the peer (the port), and
copy_rows into the peer by a staged sender (its rate, or its share of the port). A one-GPU file
(an H100 lent alone) has no peer: its NVLink figures stay the base preset's, and say so.
Residual bound: BOUND."""

from __future__ import annotations

from reference.plan import LOCAL, NVLINK

from .. import costs
from .common import KNEES, CalibrationError, Fit, need, preset_with, saturating

# (mean, largest) |model - measured| / measured over the fitted copies and puts (one curve per path:
# a float32 copy by one block alone is up to 41% off it)
BOUND = (0.10, 0.45)
MOVE_FIGURES = ("blocks_per_sm", "l2_knee_bytes", "copy_ns_per_byte", "copy_extra_ns_per_byte", "copy_half_bytes",
                "put_local_ns_per_byte", "put_local_extra_ns_per_byte", "put_local_half_bytes",
                "put_nvlink_ns_per_byte", "copy_nvlink_ns_per_byte", "nvlink_gbps", "nvlink_latency_ns")


def _puts(raw: dict) -> tuple[int, list[dict], list[dict], bool]:
    """(largest put's bytes, local puts of a quarter of it or more, NVLink puts of it, one GPU alone)."""
    puts = need(raw, "put", "put-with-signal times")
    big = max(p["bytes"] for p in puts)
    local = [p for p in puts if p["peer"] == "self" and p["bytes"] >= big // 4]
    remote = [p for p in puts if p["peer"] == "nvlink" and p["bytes"] == big]
    alone = raw.get("world") == 1
    if not local or not (alone or any(p["blocks"] == 1 for p in remote)):
        raise CalibrationError("put", sorted({p["peer"] for p in puts}), f"puts of {big} B to self and nvlink "
                               "(to self only from a one-GPU run, world 1)")
    return big, local, remote, alone


def fit_l2_moves(f: Fit, copies: list[dict], local: list[dict], big: int, origin: str) -> None:
    """The knee, copy_rows' and local puts' curves: the knee of least total relative error of both."""
    cpts = [(c["blocks"] * c["bytes"], c["ns_per_copy"]["median"] / c["bytes"]) for c in copies]
    ppts = [(p["blocks"] * p["bytes"], p["ns_per_put"]["median"] / p["bytes"]) for p in local]
    knee, (_, c1, cx, ch), (_, p1, px, ph) = min(
        ((k, saturating(cpts, k), saturating(ppts, k)) for k in KNEES), key=lambda r: r[1][0] + r[2][0])
    most = max(c["blocks"] for c in copies)
    f.set("l2_knee_bytes", float(knee), f"{origin}: copy_rows and local puts by 1 to {most} blocks at once, the knee "
          "of least relative error of both fits below")
    how = (f"{origin}: copy_rows of one tile by 1 to {most} blocks at once, least squares "
           "of time per byte = alone + extra x beyond / (beyond + half), beyond the knee")
    for name, v in (("copy_ns_per_byte", c1), ("copy_extra_ns_per_byte", cx), ("copy_half_bytes", ch)):
        f.set(name, v, how)
    how = (f"{origin}: put-with-signal to its own GPU of tiles >= {big // 4} B by 1 to "
           f"{max(p['blocks'] for p in local)} blocks at once, the same least squares")
    for name, v in (("put_local_ns_per_byte", p1), ("put_local_extra_ns_per_byte", px), ("put_local_half_bytes", ph)):
        f.set(name, v, how)


def fit_nvlink(f: Fit, raw: dict, remote: list[dict], big: int, alone: bool, hw, base: str, origin: str) -> list:
    """One block's put rate over NVLink, the port's largest aggregate and a staged sender's
    copy_rows into the peer; returns the copies into the peer (each checked)."""
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
    return into_peer


def fit_moves(raw: dict, hw, base: str, origin: str, given: dict) -> Fit:
    """The moves' figures of preset `hw` (`base`), beside `given` (the build's blocks_per_sm, and
    the NVLink latency where measured: a local share queues behind the NVLink ones only beside
    another block, and a share stored into the peer ends with a round trip)."""
    copies = need(raw, "copy", "copy_rows times")
    big, local, remote, alone = _puts(raw)
    f = Fit()
    fit_l2_moves(f, copies, local, big, origin)
    into_peer = fit_nvlink(f, raw, remote, big, alone, hw, base, origin)
    model = preset_with({**given, **f.values}, MOVE_FIGURES)
    for c in into_peer:  # each block at its own rate or its share of the port
        note = "" if c["blocks"] == 1 else "; not fitted"
        f.check(f"copy_rows {c['bytes']} B into the peer, {c['blocks']} blocks (ns{note})", c["ns_per_copy"]["median"],
                c["bytes"] * costs.port_ns_per_byte(model.copy_nvlink_ns_per_byte, c["blocks"], model.nvlink_gbps))
    for c in copies:
        f.check(f"copy_rows {c['bytes']} B{' weighted' if c['scaled'] else ''}, {c['blocks']} blocks (ns)",
                c["ns_per_copy"]["median"],
                c["bytes"] * costs.contended_ns_per_byte(model.copy_ns_per_byte, model.copy_extra_ns_per_byte,
                                                         model.copy_half_bytes, c["blocks"] * c["bytes"],
                                                         model.l2_knee_bytes))
    for p in local + remote:
        f.check(f"put {p['bytes']} B to {p['peer']}, {p['blocks']} blocks (ns)", p["ns_per_put"]["median"],
                costs.put_ns(model, LOCAL if p["peer"] == "self" else NVLINK, p["bytes"], p["blocks"] * p["bytes"],
                             p["blocks"]))
    return f
