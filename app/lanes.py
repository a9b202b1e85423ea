"""A trace as Gantt rows and bars, aggregated so that any trace stays drawable.

Rows: one per (GPU, role, lane), per GPU in the order processor blocks, scheduler, subscriber,
proxy, NIC, links (a link's lane is its peer rank). A role with more lanes on one GPU than
`ROW_CAPS` allows is drawn as groups of consecutive lanes ("blocks 0-32"): a processor row is
one of the kernel's processor blocks, not an SM (a GPU runs several per SM), and 500 rows per GPU
would be unreadable long before they are slow.

Bars: while the time window holds at most `max_bars` intervals and every row is one lane, each
interval is one bar (exact). Otherwise each row is cut into equal time bins; a bin takes the kind
of work busiest in it and its busy fraction (busy lane-time over bin width x lanes in the row),
and runs of bins with the same kind and busy level (quarters) merge into one bar, so the number
of bars is bounded by rows x bins whatever the trace size. `idle` intervals count as not busy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.trace import KIND, KINDS, ROLES, Trace

ROLE_ORDER = ("processor", "scheduler", "subscriber", "proxy", "nic", "link")
ROW_CAPS = {"processor": 16, "scheduler": 2, "subscriber": 4, "proxy": 2, "nic": 2, "link": 8}
_LABEL = {"processor": ("block", "blocks"), "scheduler": ("scheduler", "schedulers"),
          "subscriber": ("subscriber", "subscribers"), "proxy": ("proxy", "proxies"),
          "nic": ("NIC", "NICs"), "link": ("link→", "links→")}
# the bound on bars drawn: in headless Chromium on 2 cores (benchmarks/bench_app_render.py)
# 10k bars draw in 0.95 s and zoom in 0.25 s; 20k take 1.6 s / 0.7 s, 50k 5 s / 2.2 s
MAX_BARS = 10_000
MIN_BINS = 24  # fewer bins than this per row would hide the pipeline's phases
MAX_BINS = 1_000


@dataclass(frozen=True)
class Rows:
    """Gantt rows, top to bottom: their labels, the GPU of each, lanes in each, and the row of
    every event of the trace they were made from."""

    labels: list[str]
    rank: np.ndarray
    lanes: np.ndarray
    of_event: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def grouped(self) -> bool:
        return bool((self.lanes > 1).any())


@dataclass(frozen=True)
class Bars:
    """Bars to draw: row, start and end (ns), kind, busy fraction; for exact bars the event's
    expert, tile, peer and bytes; for aggregated bars each kind's share of the row (n, KINDS)."""

    row: np.ndarray
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    busy: np.ndarray
    expert: np.ndarray
    tile: np.ndarray
    peer: np.ndarray
    nbytes: np.ndarray
    share: np.ndarray | None
    bin_ns: float

    @property
    def exact(self) -> bool:
        return self.share is None

    def __len__(self) -> int:
        return len(self.start)


def rows_of(trace: Trace) -> Rows:
    """The Gantt rows of `trace` (see the module text for order and grouping)."""
    role_pos = np.array([ROLE_ORDER.index(r) for r in ROLES], np.int64)[trace["role"]]
    pair = trace["rank"].astype(np.int64) * len(ROLE_ORDER) + role_pos
    # the distinct (GPU, role, lane) triples are few even when events are millions
    triples, inverse = np.unique(np.stack([pair, trace["lane"].astype(np.int64)]), axis=1,
                                 return_inverse=True)
    inverse = inverse.reshape(-1)
    group = np.empty(triples.shape[1], np.int64)
    for p in np.unique(triples[0]):
        idx = np.flatnonzero(triples[0] == p)
        lanes = triples[1, idx]
        cap = ROW_CAPS[ROLE_ORDER[p % len(ROLE_ORDER)]]
        size = 1 if len(lanes) <= cap else math.ceil((lanes.max() + 1) / cap)
        group[idx] = lanes // size if size > 1 else np.arange(len(lanes))
    keys, row_of_triple = np.unique(np.stack([triples[0], group]), axis=1, return_inverse=True)
    row_of_triple = row_of_triple.reshape(-1)
    labels, ranks, counts = [], [], []
    for r in range(keys.shape[1]):
        lanes = triples[1, row_of_triple == r]
        p = int(keys[0, r])
        rank, role = divmod(p, len(ROLE_ORDER))
        one, many = _LABEL[ROLE_ORDER[role]]
        n_role = int((triples[0] == p).sum())
        if len(lanes) > 1:
            name = f"{many}{'' if many.endswith('→') else ' '}{lanes.min()}–{lanes.max()}"
        elif ROLE_ORDER[role] in ("processor", "link") or n_role > 1:
            name = f"{one}{'' if one.endswith('→') else ' '}{lanes[0]}"
        else:
            name = one
        labels.append(f"GPU{rank} {name}")
        ranks.append(rank)
        counts.append(len(lanes))
    return Rows(labels, np.array(ranks, np.int64), np.array(counts, np.int64),
                row_of_triple[inverse])


def bars_of(trace: Trace, rows: Rows, max_bars: int = MAX_BARS,
            window: tuple[float, float] | None = None) -> Bars:
    """The bars of `trace` (laid out as `rows`) inside `window` (ns; default: all of it)."""
    start, end = trace["start"], trace["end"]
    if window is None:
        window = (float(start.min()), float(end.max())) if len(trace) else (0.0, 1.0)
    t0, t1 = window
    inside = (end > t0) & (start < t1) if t1 > t0 else np.zeros(len(trace), bool)
    if inside.sum() <= max_bars and not rows.grouped:
        idx = np.flatnonzero(inside)
        return Bars(rows.of_event[idx], np.maximum(start[idx], t0), np.minimum(end[idx], t1),
                    trace["kind"][idx].astype(np.int64), np.ones(len(idx)), trace["expert"][idx],
                    trace["tile"][idx], trace["peer"][idx], trace["bytes"][idx], None, 0.0)
    return _binned(trace, rows, inside, t0, t1, max_bars)


def _binned(trace: Trace, rows: Rows, inside: np.ndarray, t0: float, t1: float,
            max_bars: int) -> Bars:
    n_rows, n_kinds = len(rows), len(KINDS)
    n_bins = int(np.clip(max_bars // max(n_rows, 1), MIN_BINS, MAX_BINS))
    width = (t1 - t0) / n_bins
    work = inside & (trace["kind"] != KIND["idle"])
    cell = rows.of_event[work] * n_kinds + trace["kind"][work].astype(np.int64)
    # busy time of each (row, kind) in each bin, exactly: an interval [u, v) in bin units adds
    # clip(b + 1 - u, 0, 1) - clip(b + 1 - v, 0, 1) to bin b; the sum over starts is a count of
    # the starts in earlier bins plus (1 - frac) for those in bin b, and likewise for ends.
    busy = np.zeros(n_rows * n_kinds * (n_bins + 1))
    for edge, sign in ((trace["start"][work], 1.0), (trace["end"][work], -1.0)):
        u = (np.clip(edge, t0, t1) - t0) / width
        b = np.minimum(np.floor(u).astype(np.int64), n_bins)
        at = cell * (n_bins + 1) + b
        counts = np.bincount(at, minlength=busy.size).reshape(-1, n_bins + 1)
        before = np.cumsum(counts, axis=1) - counts
        partial = np.bincount(at, weights=1.0 - (u - b), minlength=busy.size).reshape(-1, n_bins + 1)
        busy += sign * (before + partial).reshape(-1)
    busy = busy.reshape(n_rows, n_kinds, n_bins + 1)[:, :, :n_bins] * width
    frac = busy / (width * rows.lanes[:, None, None])  # (rows, kinds, bins)
    total = frac.sum(axis=1)
    dominant = frac.argmax(axis=1)
    level = np.ceil(np.clip(total, 0, 1) * 4).astype(np.int64)  # 0 empty, 1..4 quarters
    key = np.where(total > 1e-9, dominant * 8 + level, -1).reshape(-1)
    bin_index = np.tile(np.arange(n_bins), n_rows)
    change = np.r_[True, key[1:] != key[:-1]] | (bin_index == 0)
    first = np.flatnonzero(change)
    length = np.diff(np.r_[first, key.size])
    keep = key[first] >= 0
    first, length = first[keep], length[keep]
    shares = _run_sums(frac.transpose(0, 2, 1).reshape(-1, n_kinds), first, length)
    shares /= length[:, None]
    row = first // n_bins
    s = t0 + (first % n_bins) * width
    none = np.full(first.size, -1, np.int32)
    return Bars(row, s, s + length * width, shares.argmax(axis=1), shares.sum(axis=1), none, none,
                none, np.zeros(first.size, np.int64), shares, width)


def _run_sums(values: np.ndarray, first: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Sums of values[first[i]:first[i] + length[i]] over axis 0, for every run i."""
    csum = np.vstack([np.zeros((1, values.shape[1])), np.cumsum(values, axis=0)])
    return csum[first + length] - csum[first]
