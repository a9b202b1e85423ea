"""The two papers' stories as tables (lists of dicts), for `moelab sim --sweep`, the app and docs.

- `fused_vs_baseline`: FlashMoE's comparison, the fused kernel against the bulk-synchronous
  baseline over the paper's expert, token and GPU sweeps (`reference.presets.PAPER_SWEEPS`), with
  overlap efficiency T(2) / T(N) on the GPU sweep.
- `multinode`: Perseus' story, latency vs nodes for every transport on a communication-bound
  config (many small experts, k = 8), with fences, signals and proxy stalls per layer;
  `latency_table` and `fence_table` pivot its rows.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed

import reference
from reference import Config, presets

from .engine import simulate, with_nodes
from .network import TRANSPORTS

# Perseus' communication-bound layer, small enough that its tiles (32 rows of bf16, 128 KB) cost
# less on the wire than a fence's round trip: the regime where per-tile fences serialize the NIC
# (about 8x at 8 nodes on h100-sxm, the paper's "up to 10x"); its 16-node point simulates in seconds
COMM_BOUND = presets.get("perseus-comm").replace(name="perseus-comm-256-bf16", tokens=256, precision="bfloat16")
NODES = (1, 2, 4, 8, 16)
GPUS_PER_NODE = 8
# Perseus' models (its evaluation: Qwen3-30B, GPT-OSS-120B and DeepSeek-V3 on 8 to 64 GPUs): the zoo's
# layers (reference.presets.ZOO, bf16, nothing dropped) at PERSEUS_TOKENS tokens per GPU on nodes of 8
PERSEUS_MODELS = ("qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3")
PERSEUS_GPUS = (8, 16, 32, 64)
PERSEUS_TOKENS = 256


def _quiet(_: str) -> None:
    pass


def in_parallel(point: Callable, jobs: list[tuple], workers: int | None = None,
                progress: Callable[[str], None] = _quiet, names: list[str] | None = None) -> list:
    """`point(*job)` of every job, in the jobs' order, run by `workers` processes (default: one per
    core; 1: here, one after another); `progress` names each job as it ends."""
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    names = names or [str(j) for j in jobs]
    if workers <= 1:
        out = []
        for job, name in zip(jobs, names):
            out.append(point(*job))
            progress(f"done: {name}")
        return out
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(point, *job): i for i, job in enumerate(jobs)}
        out = [None] * len(jobs)
        for f in as_completed(futures):
            out[futures[f]] = f.result()
            progress(f"done: {names[futures[f]]}")
    return out


def _fused_and_baseline(cfg: Config, hardware: str) -> tuple[dict, dict]:
    plan = reference.plan_of(cfg)
    return simulate(cfg, hardware, plan=plan).metrics, simulate(cfg, hardware, baseline=True, plan=plan).metrics


def fused_vs_baseline(sweeps: dict[str, list[Config]] | None = None, hardware: str = "h100-sxm",
                      progress: Callable[[str], None] = _quiet, workers: int | None = None) -> list[dict]:
    """One row per sweep point: fused and baseline latency, speedup, SM utilization; the points run
    in parallel (in_parallel)."""
    rows = []
    sweeps = sweeps or {k: presets.SWEEPS[k] for k in presets.PAPER_SWEEPS}
    points = [(sweep, cfg) for sweep, cfgs in sweeps.items() for cfg in cfgs]
    runs = dict(zip(points, in_parallel(_fused_and_baseline, [(cfg, hardware) for _, cfg in points], workers,
                                        progress, [f"{sweep}: {cfg.name}" for sweep, cfg in points])))
    for sweep, cfgs in sweeps.items():
        two = {}
        for cfg in cfgs:
            fused, base = runs[sweep, cfg]
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


@functools.lru_cache(maxsize=4)
def _plan(cfg: Config) -> reference.TilePlan:
    return reference.plan_of(cfg)  # once per worker for all of a node count's transports


def _multinode_row(c: Config, n: int, t: str, hardware: str) -> dict:
    m = simulate(c, hardware, transport=t, plan=_plan(c)).metrics
    return {"nodes": n, "gpus": c.ranks, "transport": t, "latency_ms": m["latency_ms"],
            "fences": m["fences"]["total"], "blocking_fences": m["fences"]["blocking"],
            "signals": m["signals"], "proxy_blocked_us": m["proxy_blocked_us"]["max_per_proxy"],
            "network_mb": m["bytes"]["network"] / 1e6}


def multinode(cfg: Config = COMM_BOUND, nodes: Iterable[int] = NODES, gpus_per_node: int = GPUS_PER_NODE,
              transports: Iterable[str] = TRANSPORTS, hardware: str = "h100-sxm",
              progress: Callable[[str], None] = _quiet, workers: int | None = None) -> list[dict]:
    """Weak scaling over nodes of `gpus_per_node` GPUs: one row per (nodes, transport); the points
    run in parallel (in_parallel), the largest first."""
    cfgs = {n: with_nodes(cfg.replace(ranks=n * gpus_per_node, gpus_per_node=gpus_per_node), n) for n in nodes}
    jobs = [(cfgs[n], n, t, hardware) for n in cfgs for t in transports]
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i][1])  # the longest points start first
    done = in_parallel(_multinode_row, [jobs[i] for i in order], workers, progress,
                       [f"{jobs[i][0].name}: {jobs[i][1]} node(s) x {gpus_per_node} GPUs, {jobs[i][2]}" for i in order])
    rows = [None] * len(jobs)
    for i, row in zip(order, done):
        rows[i] = row
    return rows


def perseus_layer(model: str, gpus: int, tokens: int = PERSEUS_TOKENS) -> Config:
    """`model`'s zoo layer on `gpus` GPUs in nodes of GPUS_PER_NODE, `tokens` a GPU (PERSEUS_MODELS)."""
    cfg = presets.ZOO[model].replace(name=f"{model}-{gpus}gpu-{tokens}", tokens=tokens, ranks=gpus,
                                     gpus_per_node=GPUS_PER_NODE)
    return with_nodes(cfg, max(1, gpus // GPUS_PER_NODE))


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
