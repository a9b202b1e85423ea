"""Speed of the simulator on this machine, one core: simulated events per second and wall time.

    python benchmarks/bench_sim.py [--quick]

Cases: tiny; the FlashMoE default on 8 GPUs; 128 experts x 16K tokens on 8 GPUs;
8 nodes x 8 GPUs with `ibrc` (the communication-bound perseus-comm layer). "plan s" is the
reference's routing and tile plan (drawing every rank's tokens), "sim s" the simulation with
the trace and its metrics. Targets: the 8-GPU FlashMoE default under 10 s, 8 x 8 `ibrc` under
60 s (plan and simulation together).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core: BLAS threads would hide the per-core cost

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import reference  # noqa: E402
import sim  # noqa: E402
from reference import presets  # noqa: E402
from reference.cli import format_table  # noqa: E402


def cases(quick: bool):
    default8 = presets.get("flashmoe").replace(name="flashmoe, 8 GPUs", ranks=8)
    out = [(presets.get("tiny"), "ibgda"), (default8, "ibgda")]
    if not quick:
        out += [(default8.replace(name="128 experts x 16K tokens, 8 GPUs", experts=128, tokens=16384), "ibgda"),
                (presets.get("perseus-comm").replace(name="perseus-comm, 8 x 8 GPUs"), "ibrc")]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="only the first two cases")
    args = p.parse_args()
    rows = []
    for cfg, transport in cases(args.quick):
        t0 = time.perf_counter()
        plan = reference.plan_of(cfg)
        t_plan = time.perf_counter() - t0
        r = sim.simulate(cfg, transport=transport, plan=plan)
        rows.append((cfg.name, f"{cfg.nodes}x{min(cfg.ranks, cfg.gpus_per_node)}", transport, plan.tile_expert.size,
                     plan.task_kind.size, r.events, len(r.trace), round(t_plan, 2), round(r.wall_s, 2),
                     round(t_plan + r.wall_s, 2), f"{r.events / r.wall_s:,.0f}", round(r.metrics["latency_ms"], 3)))
        print(f"done: {cfg.name}", flush=True)
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, one core\n")
    print(format_table(("case", "nodes x GPUs", "transport", "tiles", "tasks", "events", "trace rows",
                        "plan s", "sim s", "total s", "events/s", "latency ms"), rows))


if __name__ == "__main__":
    main()
