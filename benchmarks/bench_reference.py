"""Speed of the golden forward on this machine: dense formula vs tile walk, float32.

    python benchmarks/bench_reference.py [--quick]

Prints one row per (config, method): seconds and GFLOP/s of the expert GEMMs, plus the time to
draw the weights. Targets: the FlashMoE default (8192 tokens, 64 experts, H = I = 2048,
k = 2) under 30 s dense, the tile walk within 3x of dense.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from reference import golden, plan, presets, routing, weights
from reference.cli import format_table
from reference.plan import GEMM0, GEMM1


def cases(quick: bool):
    tiny = presets.get("tiny")
    if quick:
        return [tiny, presets.get("small")]
    default = presets.get("flashmoe")
    return [tiny, default.replace(name="flashmoe (8192 tokens, 1 rank)", ranks=1), default,
            default.replace(name="tokens-16k x experts-128 (1 rank)", tokens=16384, experts=128, ranks=1)]


def run(cfg, path="float32"):
    t0 = time.perf_counter()
    w = weights.draw(cfg)
    t_draw = time.perf_counter() - t0
    r = routing.route(cfg, w.x, w.wg, w.gate_bias, w.wg_bias)
    tp = plan.build(cfg, r)
    gflop = tp.task_flops[np.isin(tp.task_kind, (GEMM0, GEMM1))].sum() / 1e9
    methods = {"dense": lambda: golden.dense(cfg, w, r, path),
               "tile_walk": lambda: golden.tile_walk(cfg, w, tp, path)}
    rows, outputs = [], {}
    for method, forward in methods.items():
        t0 = time.perf_counter()
        outputs[method] = forward()
        dt = time.perf_counter() - t0
        rows.append((cfg.name, cfg.ranks * cfg.tokens, method, t_draw, dt, gflop / dt))
    return rows, golden.max_rel_error(outputs["tile_walk"], outputs["dense"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny and small only")
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}")
    table = []
    for cfg in cases(args.quick):
        rows, err = run(cfg)
        dense_s, walk_s = rows[0][4], rows[1][4]
        table += [(*r, walk_s / dense_s, err) for r in rows]
        print(f"{cfg.name}: dense {dense_s:.2f} s, tile walk {walk_s:.2f} s", file=sys.stderr, flush=True)
    print(format_table(("config", "tokens", "method", "draw s", "forward s", "GFLOP/s", "walk/dense",
                        "walk vs dense err"), table))


if __name__ == "__main__":
    main()
