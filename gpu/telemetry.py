"""Kernel telemetry: the device logs decoded into the trace schema (`sim.trace.Trace`).

Each processor block and each OS warp has a log of 4 uint64 words per event (kernels/common.cuh
`log_event`): start and end (%globaltimer, ns), then kind | expert << 8 | peer << 24 | rows << 40,
then tile | column << 32. Log n_proc is the scheduler warp, logs n_proc + 1.. the subscriber
warps. Times become ns relative to `origin_ns` (the earliest kernel start over all ranks, so
ranks line up on one axis); tiles become the tile plan's indices when the send counts of every
rank are given (the device logs a tile, and a chunk, as its (expert, window), reference/plan.py).
"""

from __future__ import annotations

import numpy as np

from reference import Config, plan
from sim.trace import KINDS, Trace, TraceBuilder

_DISPATCH, _GEMM0, _GEMM1, _COMBINE, _SIGNAL = (KINDS.index(k) for k in ("dispatch", "gemm0", "gemm1", "combine",
                                                                          "signal"))


def tile_ids(cfg: Config, send_counts: np.ndarray, rank: int = 0) -> np.ndarray:
    """(E + S, windows) plan index of each routed expert's tile window, and of shared expert E + s's
    windows of `rank`'s own tokens (a shared tile is its source's: the kernel logs it as expert
    E + s), -1 where it has no tile. send_counts: (P, E) routed rows per source and expert."""
    counts = np.asarray(send_counts)
    counts = np.concatenate([counts, np.full((cfg.ranks, cfg.shared_experts), cfg.tokens, counts.dtype)], axis=1)
    (expert, owner, window, _), _ = plan.windows(cfg, counts)
    ids = np.full((cfg.experts + cfg.shared_experts, int(window.max(initial=-1)) + 1), -1, np.int64)
    mine = (expert < cfg.experts) | (owner == rank)
    ids[expert[mine], window[mine]] = np.flatnonzero(mine)
    return ids


def decode(tlog: np.ndarray, counts: np.ndarray, *, rank: int, node: int, n_proc: int, hidden: int,
           origin_ns: int, ids: np.ndarray | None = None, elem_bytes: int = 4) -> tuple[TraceBuilder, int]:
    """Events of one rank's logs appended to a TraceBuilder; also the number of dropped events.
    A moved row is `hidden` elements of `elem_bytes` (2 in the bf16 kernel).

    tlog: (logs, cap, 4) uint64; counts: (logs,) events written per log (> cap: dropped)."""
    tlog = np.asarray(tlog, np.uint64)
    logs, cap = tlog.shape[:2]
    counts = np.asarray(counts, np.int64)
    if counts.shape != (logs,):
        raise ValueError(f"telemetry counts have shape {counts.shape}, expected ({logs},)")
    tb = TraceBuilder()
    dropped = int(np.maximum(counts - cap, 0).sum())
    for log in range(logs):
        n = int(min(counts[log], cap))
        if log < n_proc:
            role, lane = "processor", log
        elif log == n_proc:
            role, lane = "scheduler", 0
        else:
            role, lane = "subscriber", log - n_proc - 1
        for w0, w1, w2, w3 in tlog[log, :n].tolist():
            kind = w2 & 0xFF
            expert = (w2 >> 8) & 0xFFFF
            peer = (w2 >> 24) & 0xFFFF
            rows = (w2 >> 40) & 0xFFFF
            tile = np.int64(w3 & 0xFFFFFFFF).astype(np.int32).item()
            expert = -1 if expert == 0xFFFF else expert
            peer = -1 if peer == 0xFFFF else peer
            if ids is not None and tile >= 0 and expert >= 0:
                tile = int(ids[expert, tile])
            moved = rows * hidden * elem_bytes if kind in (_DISPATCH, _COMBINE, _SIGNAL) else 0
            tb.add(rank, node, lane, role, KINDS[kind], float(w0 - origin_ns), float(w1 - origin_ns),
                   expert=expert, tile=tile, peer=peer, nbytes=int(moved))
    return tb, dropped


def processor_utilization(trace: Trace, n_proc: int) -> float:
    """Busy time of the processor blocks over (processors x ranks x kernel span), from a trace."""
    proc = trace.where(role="processor")
    if not len(proc):
        return 0.0
    ranks = np.unique(trace["rank"])
    busy = float((proc["end"] - proc["start"]).sum())
    span = 0.0
    for r in ranks:
        mine = trace["rank"] == r
        span += float(trace["end"][mine].max() - trace["start"][mine].min())
    return busy / (n_proc * span) if span > 0 else 0.0
