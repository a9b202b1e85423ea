"""The two papers' stories as tables (lists of dicts), for `moelab sim --sweep`, the app and docs.

- `fused_vs_baseline`: FlashMoE's comparison, the fused kernel against the bulk-synchronous
  baseline over the paper's expert, token and GPU sweeps (`reference.presets.PAPER_SWEEPS`), with
  overlap efficiency T(2) / T(N) on the GPU sweep.
- `multinode`: Perseus' story, latency vs nodes for every transport on a communication-bound
  config (many small experts, k = 8), with fences, signals and proxy stalls per layer;
  `latency_table` and `fence_table` pivot its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import reference
from reference import Config, presets

from .engine import simulate, with_nodes
from .network import TRANSPORTS

# Perseus' communication-bound layer, small enough that its tiles (32 rows of bf16, 128 KB) cost
# less on the wire than a fence's round trip: the regime where per-tile fences serialize the NIC
# (about 8x at 8 nodes on h100-sxm, the paper's "up to 10x"); its 16-node point simulates in seconds
COMM_BOUND = presets.get("perseus-comm").replace(name="perseus-comm-256-bf16", tokens=256, dtype="bfloat16")
NODES = (1, 2, 4, 8, 16)
GPUS_PER_NODE = 8


def _quiet(_: str) -> None:
    pass


def fused_vs_baseline(sweeps: dict[str, list[Config]] | None = None, hardware: str = "h100-sxm",
                      progress: Callable[[str], None] = _quiet) -> list[dict]:
    """One row per sweep point: fused and baseline latency, speedup, SM utilization."""
    rows = []
    for sweep, points in (sweeps or {k: presets.SWEEPS[k] for k in presets.PAPER_SWEEPS}).items():
        two = {}
        for cfg in points:
            progress(f"{sweep}: {cfg.name}")
            plan = reference.plan_of(cfg)
            fused = simulate(cfg, hardware, plan=plan).metrics
            base = simulate(cfg, hardware, baseline=True, plan=plan).metrics
            row = {"sweep": sweep, "config": cfg.name, "tokens": cfg.tokens, "experts": cfg.experts,
                   "gpus": cfg.ranks, "fused_ms": fused["latency_ms"], "baseline_ms": base["latency_ms"],
                   "speedup": base["latency_ms"] / fused["latency_ms"],
                   "fused_sm_util": fused["sm_utilization"]["mean"],
                   "baseline_sm_util": base["sm_utilization"]["mean"]}
            if sweep == "gpus" and cfg.ranks == 2:
                two = {"fused": fused["latency_ns"], "baseline": base["latency_ns"]}
            rows.append(row)
        if two:
            for row in rows:
                if row["sweep"] == sweep and row["gpus"] >= 2:
                    row["fused_overlap_eff"] = two["fused"] / (row["fused_ms"] * 1e6)
                    row["baseline_overlap_eff"] = two["baseline"] / (row["baseline_ms"] * 1e6)
    return rows


def multinode(cfg: Config = COMM_BOUND, nodes: Iterable[int] = NODES, gpus_per_node: int = GPUS_PER_NODE,
              transports: Iterable[str] = TRANSPORTS, hardware: str = "h100-sxm",
              progress: Callable[[str], None] = _quiet) -> list[dict]:
    """Weak scaling over nodes of `gpus_per_node` GPUs: one row per (nodes, transport)."""
    rows = []
    for n in nodes:
        c = with_nodes(cfg.replace(ranks=n * gpus_per_node, gpus_per_node=gpus_per_node), n)
        plan = reference.plan_of(c)
        for t in transports:
            progress(f"{c.name}: {n} node(s) x {gpus_per_node} GPUs, {t}")
            m = simulate(c, hardware, transport=t, plan=plan).metrics
            rows.append({"nodes": n, "gpus": c.ranks, "transport": t, "latency_ms": m["latency_ms"],
                         "fences": m["fences"]["total"], "blocking_fences": m["fences"]["blocking"],
                         "signals": m["signals"], "proxy_blocked_us": m["proxy_blocked_us"]["max_per_proxy"],
                         "network_mb": m["bytes"]["network"] / 1e6})
    return rows


def latency_table(rows: list[dict]) -> list[dict]:
    """Latency (ms) per node count, one column per transport, and each one's ratio to ibgda."""
    out = {}
    for r in rows:
        out.setdefault(r["nodes"], {"nodes": r["nodes"]})[r["transport"]] = r["latency_ms"]
    for row in out.values():
        if "ibgda" in row:
            for t in TRANSPORTS:
                if t in row and t != "ibgda":
                    row[f"{t}/ibgda"] = row[t] / row["ibgda"]
    return list(out.values())


def fence_table(rows: list[dict], nodes: int = 8) -> list[dict]:
    """Fences, signals and proxy stalls per layer of each transport at `nodes` nodes."""
    return [{k: r[k] for k in ("transport", "fences", "blocking_fences", "signals", "proxy_blocked_us",
                               "latency_ms")} for r in rows if r["nodes"] == nodes]
