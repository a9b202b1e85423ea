"""Metrics of one layer call from its trace, whoever produced it (the simulator or the kernel's
telemetry): only the schema's columns and the meta's optional "processors" are read.

- latency: first start to last end.
- SM utilization (per GPU): busy processor time (every processor row but `idle` and `wait`)
  over processors x latency; processors per GPU from meta["processors"], else the processor
  lanes that appear. Reported as mean, min and max over GPUs.
- overlap efficiency, as the FlashMoE paper defines it (Aimuyo, Oh, Singh, NeurIPS 2025,
  arXiv 2506.04667, evaluation, weak scaling): O_e = T(2) / T(N_G), the latency on 2 GPUs over
  the latency on N_G GPUs with the same tokens per GPU. It needs the 2-GPU latency, so it is
  reported when `latency_2gpu_ns` is given (`sim.sweeps` and `moelab sim` do).
- bytes moved per link class: `put` rows of role `link` (peer == rank: a local copy, else
  NVLink) and of role `nic` (network). Proxy rows name the same bytes and are not counted.
- fences (every `fence` row; `blocking` = those of a proxy thread, which stall it), signals
  sent (`signal` rows of roles link and nic), time proxies spent blocked in fences.
- critical path: the GPU that finishes last, the kind of its last interval, and its latency
  split into compute (some processor busy), exposed communication (a put, signal or fence of
  its own or addressed to it in flight while no processor computes) and idle time.
- the weights' roofline of a GEMM phase (`weights_roofline`, from the config alone): its best
  share of a GPU's matmul ceiling where the memory streams every expert weight once.
- the layer's roofline (`layer_roofline`, from the config and the rows each source sends each
  expert): the least time one call can take, the largest over GPUs and bounds of a GPU's GEMM FLOPs
  at the matmul ceiling, its used experts' weight bytes at the memory rate, and its NVLink bytes
  (the plan's dispatch and combine transfers of class nvlink, the larger of those it sends and
  receives) at the rate of one GPU to all its peers. A kernel's latency over it is the figure of
  merit of a point.
"""

from __future__ import annotations

import numpy as np

from reference import Config, plan
from reference.weights import ffn_in_width

from .trace import KIND, KINDS, ROLE, Trace

NOT_BUSY = (KIND["idle"], KIND["wait"])
COMM_ROLES = (ROLE["link"], ROLE["nic"], ROLE["proxy"])


def union_ns(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of intervals [start, end)."""
    if not len(start):
        return 0.0
    order = np.argsort(start, kind="stable")
    s, reach = start[order], np.maximum.accumulate(end[order])
    gap = s[1:] > reach[:-1]
    starts = np.r_[s[0], s[1:][gap]]
    ends = np.r_[reach[:-1][gap], reach[-1]]
    return float((ends - starts).sum())


def overlap_efficiency(latency_2gpu_ns: float, latency_ns: float) -> float:
    """FlashMoE's O_e = T(2) / T(N_G) (see the module text)."""
    return latency_2gpu_ns / latency_ns


def weights_roofline(cfg: Config, kept_rows: int, ceiling_tflops: float, gbps: float) -> float:
    """The GEMM phase's best rate, in % of a GPU's matmul ceiling `ceiling_tflops`, where each
    GPU's memory, at `gbps` GB/s, has to stream every expert weight it holds once: the layer's
    GEMM FLOPs (4 H I per kept row, both GEMMs) over its weight bytes (2 H I a weight matrix pair
    per expert) times the rate. With R kept rows an expert a bf16 weight byte carries R FLOPs, a
    float32 one R / 2; under 60, the bar on the GEMM phase (60% of the ceiling) cannot hold, short of keeping
    weights on chip between calls."""
    experts = cfg.experts + cfg.shared_experts * cfg.ranks  # every GPU holds the shared experts
    return 100 * 4 * kept_rows * gbps * 1e9 / (experts * 2 * cfg.dtype_bytes * ceiling_tflops * 1e12)


ROOFLINE_BOUNDS = ("gemm", "weights", "nvlink")


def layer_roofline(cfg: Config, send_counts, ceiling_tflops: float, memory_gbps: float,
                   nvlink_gbps: float | None) -> dict:
    """The layer's roofline (see the module text) for `send_counts` (P, E) rows each source sends
    each routed expert (shared experts take all T tokens of their own GPU): {"ms": the bound,
    "bound": which of ROOFLINE_BOUNDS sets it, and each bound's ms, the largest over GPUs}.
    Weights are stored in the config's dtype (float32 for tf32 and tf32x3). Without NVLink bytes
    (one GPU) the NVLink rate is not needed."""
    counts = np.asarray(send_counts, np.int64)
    p, e, s = cfg.ranks, cfg.experts, cfg.shared_experts
    if counts.shape != (p, e):
        raise ValueError(f"send counts have shape {counts.shape}, expected ({p}, {e})")
    counts = np.concatenate([counts, np.full((p, s), cfg.tokens, np.int64)], axis=1)
    (tile_expert, tile_owner, _, _), (chunk_tile, chunk_src, _, chunk_rows) = plan.windows(cfg, counts)
    owner = tile_owner[chunk_tile]
    rows = np.bincount(owner, weights=chunk_rows, minlength=p)
    per_row = cfg.hidden * (ffn_in_width(cfg) + cfg.ffn)  # multiply-adds of GEMM0 and GEMM1
    # experts with rows on each GPU (every GPU its own copy of each shared expert)
    used = np.bincount(np.unique(tile_expert.astype(np.int64) * p + tile_owner) % p, minlength=p)
    row_bytes = chunk_rows.astype(np.int64) * cfg.hidden * cfg.dtype_bytes
    nvl = plan.link_class(cfg, chunk_src, owner) == plan.NVLINK
    # each chunk goes to its owner and comes back: a GPU sends what it dispatches and returns
    sent = np.bincount(chunk_src[nvl], weights=row_bytes[nvl], minlength=p) + \
        np.bincount(owner[nvl], weights=row_bytes[nvl], minlength=p)
    ms = {"gemm": 2 * rows.max() * per_row / (ceiling_tflops * 1e9),
          "weights": used.max() * per_row * cfg.dtype_bytes / (memory_gbps * 1e6),
          "nvlink": 0.0}
    if sent.any():
        if not nvlink_gbps:
            raise ValueError(f"the layer moves {int(sent.max())} bytes over NVLink: an NVLink rate is needed")
        ms["nvlink"] = sent.max() / (nvlink_gbps * 1e6)  # sent == received: every chunk goes and comes back
    bound = max(ROOFLINE_BOUNDS, key=ms.get)
    return {"ms": float(ms[bound]), "bound": bound, **{f"{b}_ms": float(ms[b]) for b in ROOFLINE_BOUNDS}}


def by_rank(rank: np.ndarray, mask: np.ndarray, values: np.ndarray, ranks) -> list[np.ndarray]:
    """values[mask & (rank == r)] for each r of `ranks`, in trace order, from one sort (a mask a
    rank would read the whole trace once per GPU)."""
    rows = np.flatnonzero(mask)
    rows = rows[np.argsort(rank[rows], kind="stable")]
    ranks, sorted_rank, picked = np.asarray(ranks), rank[rows], values[rows]
    lo, hi = np.searchsorted(sorted_rank, ranks, "left"), np.searchsorted(sorted_rank, ranks, "right")
    return [picked[a:b].copy() for a, b in zip(lo.tolist(), hi.tolist())]


def compute(trace: Trace, cfg: Config, latency_2gpu_ns: float | None = None) -> dict:
    if not len(trace):
        return {"latency_ns": 0.0, "latency_ms": 0.0, "gpus": cfg.ranks, "nodes": cfg.nodes}
    start, end, rank, role, kind = trace["start"], trace["end"], trace["rank"], trace["role"], trace["kind"]
    t0, t1 = float(start.min()), float(end.max())
    latency = t1 - t0
    proc = role == ROLE["processor"]
    busy = proc & ~np.isin(kind, NOT_BUSY)
    dur = end - start
    lanes = trace.meta.get("processors")
    lanes = [lanes] * cfg.ranks if lanes else [np.unique(x).size for x in by_rank(rank, proc, trace["lane"],
                                                                                  range(cfg.ranks))]
    util = [float(d.sum()) / (n * latency) if n and latency else 0.0
            for d, n in zip(by_rank(rank, busy, dur, range(cfg.ranks)), lanes)]
    busy_total = float(dur[busy].sum())
    share = {KINDS[k]: float(dur[busy & (kind == k)].sum()) / busy_total if busy_total else 0.0
             for k in np.unique(kind[busy])}
    put = kind == KIND["put"]
    link_put = put & (role == ROLE["link"])
    nbytes = trace["bytes"]
    fence = kind == KIND["fence"]
    proxy_fence = fence & (role == ROLE["proxy"])
    blocked = [float(d.sum()) for d in by_rank(rank, proxy_fence, dur, np.unique(rank[proxy_fence]))]
    out = {
        "latency_ns": latency,
        "latency_ms": latency / 1e6,
        "gpus": cfg.ranks,
        "nodes": cfg.nodes,
        "sm_utilization": {"mean": float(np.mean(util)), "min": float(min(util)), "max": float(max(util))},
        "processor_time_share": share,
        "tasks": int((proc & np.isin(kind, [KIND["gemm0"], KIND["gemm1"], KIND["combine"]])).sum()),
        "bytes": {
            "local": int(nbytes[link_put & (trace["peer"] == rank)].sum()),
            "nvlink": int(nbytes[link_put & (trace["peer"] != rank)].sum()),
            "network": int(nbytes[put & (role == ROLE["nic"])].sum()),
        },
        "fences": {"total": int(fence.sum()), "blocking": int(proxy_fence.sum()),
                   "nic_ordered": int((fence & (role == ROLE["nic"])).sum())},
        "signals": int(((kind == KIND["signal"]) & np.isin(role, [ROLE["link"], ROLE["nic"]])).sum()),
        "proxy_blocked_us": {"total": sum(blocked) / 1e3, "max_per_proxy": max(blocked, default=0.0) / 1e3},
        "critical_path": critical_path(trace),
    }
    if latency_2gpu_ns is not None:
        out["overlap_efficiency"] = overlap_efficiency(latency_2gpu_ns, latency)
    return out


def critical_path(trace: Trace) -> dict:
    """The last GPU to finish and how its time splits (see the module text)."""
    start, end, rank, role, kind = trace["start"], trace["end"], trace["rank"], trace["role"], trace["kind"]
    last = int(np.argmax(end))
    r = int(rank[last])
    mine = rank == r
    t0 = float(start.min())
    compute = mine & (role == ROLE["processor"]) & ~np.isin(kind, NOT_BUSY)
    comm = np.isin(role, COMM_ROLES) & (mine | (trace["peer"] == r))
    busy = union_ns(start[compute], end[compute])
    either = union_ns(start[compute | comm], end[compute | comm])
    t_end = float(end[mine].max())
    return {"gpu": r, "last_kind": KINDS[int(kind[last])], "compute_us": busy / 1e3,
            "exposed_comm_us": (either - busy) / 1e3, "idle_us": (t_end - t0 - either) / 1e3}
