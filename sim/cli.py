"""`moelab sim`: simulate one layer call (a table, JSON, a trace, a timeline), or the sweeps; also
registers `moelab calibrate` (sim.calibrate) and `moelab compare` (sim.compare_cli)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from reference import budget, presets
from reference.cli import Progress, add_config_args, config_from_args, format_table, path_ending, positive_int
from reference.files import check_output

from .costs import DEFAULT_DISPATCH, QUEUE_POLICIES, STAGED_BLOCKS
from .hardware import DEFAULT, PRESETS, HardwareError
from .network import TRANSPORTS
from .trace import DISPATCH_PATHS

SWEEPS = ("fused", "nodes", "all")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def cmd_sim(args: argparse.Namespace) -> int:
    from .engine import SimError

    try:
        for path in (args.trace, args.timeline):  # before the work: a bad path fails now, not after it
            if path:
                check_output(path)
        return _sweep(args) if args.sweep else _one(args)
    except (HardwareError, SimError) as e:
        print(f"moelab sim: error: {e}", file=sys.stderr)
        return 2


def _one(args) -> int:
    from . import engine, metrics, timeline

    progress = Progress(not args.quiet)
    cfg = config_from_args(args)
    if args.nodes is not None:
        cfg = engine.with_nodes(cfg, args.nodes)
    progress(f"estimate for {cfg.name}: {budget.check(cfg, 'sim', args.long).text()}")
    result = engine.simulate(cfg, args.hardware, args.transport, args.baseline, progress, dispatch=args.dispatch,
                             queue=args.queue, staged_blocks=args.staged_blocks)
    m = result.metrics
    if cfg.ranks > 2 and cfg.experts % 2 == 0:
        progress("2-GPU run of the same layer for overlap efficiency T(2)/T(N)")
        two = engine.simulate(cfg.replace(ranks=2, gpus_per_node=2), args.hardware, args.transport, args.baseline,
                              dispatch=args.dispatch, queue=args.queue, staged_blocks=args.staged_blocks)
        m = metrics.compute(result.trace, cfg, latency_2gpu_ns=two.metrics["latency_ns"])
    summary = {"config": cfg.name, "gpus": cfg.ranks, "nodes": cfg.nodes, "hardware": result.trace.meta["hardware"],
               "transport": args.transport, "dispatch": result.trace.meta["dispatch"],
               "staged_blocks": args.staged_blocks,
               "queue": result.trace.meta["queue"],
               "kernel": "baseline" if args.baseline else "fused",
               **flatten(m), "sim_events": result.events, "sim_wall_s": result.wall_s}
    if args.trace:
        progress(f"writing {args.trace}")
        result.trace.save(args.trace)
    if args.timeline:
        progress(f"drawing {args.timeline}")
        timeline.render(result.trace, args.timeline)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_table(("quantity", "value"), readable(summary)))
    return 0


def readable(summary: dict) -> list[tuple[str, str]]:
    """The summary's rows for people: times in ms (or us) with 4 significant digits, bytes in MB."""
    rows = []
    for k, v in summary.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            rows.append((k, v))
        elif k.endswith("_ns") and k[:-3] + "_ms" in summary:
            continue  # the same figure in ms follows
        elif k.startswith("bytes."):
            rows.append((k.replace("bytes.", "MB."), f"{v / 1e6:,.1f}"))
        elif isinstance(v, float):
            rows.append((k, f"{v:.4g}"))
        else:
            rows.append((k, v))
    return rows


def _sweep(args) -> int:
    from . import sweeps

    progress = Progress(not args.quiet)
    runs = []  # (config, simulations of it) of the sweeps asked for
    if args.sweep in ("fused", "all"):
        runs += [(c, 2) for points in presets.SWEEPS.values() for c in points]  # fused and baseline
    if args.sweep in ("nodes", "all"):
        runs += [(sweeps.with_nodes(sweeps.COMM_BOUND.replace(ranks=n * sweeps.GPUS_PER_NODE,
                                                              gpus_per_node=sweeps.GPUS_PER_NODE), n),
                  len(TRANSPORTS)) for n in sweeps.NODES]
    count, workers = sum(k for _, k in runs), os.cpu_count() or 1  # sweeps run a process per core
    seconds = sum(budget.simulation(c).seconds * k for c, k in runs) / min(workers, count)
    progress(f"sweep {args.sweep}: {count} simulations on {min(workers, count)} processes, "
             f"about {budget.format_seconds(seconds)}")
    out = {}
    if args.sweep in ("fused", "all"):
        out["fused_vs_baseline"] = sweeps.fused_vs_baseline(hardware=args.hardware, progress=progress)
    if args.sweep in ("nodes", "all"):
        rows = sweeps.multinode(sweeps.COMM_BOUND, sweeps.NODES, sweeps.GPUS_PER_NODE, hardware=args.hardware,
                                progress=progress)
        fence_nodes = 8 if 8 in sweeps.NODES else max(sweeps.NODES)
        out["latency_vs_nodes"] = sweeps.latency_table(rows)
        out["fences"] = sweeps.fence_table(rows, fence_nodes)
        out["multinode"] = rows
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    titles = {"fused_vs_baseline": "FlashMoE: fused kernel vs bulk-synchronous baseline (latency in ms)",
              "latency_vs_nodes": f"Perseus: layer latency (ms) vs nodes of {sweeps.GPUS_PER_NODE} GPUs, "
                                  f"{sweeps.COMM_BOUND.name}",
              "fences": "Perseus: fences, signals and proxy stalls per layer at "
                        f"{8 if 8 in sweeps.NODES else max(sweeps.NODES)} nodes"}
    for key, title in titles.items():
        if out.get(key):
            rows = out[key]
            head = list(dict.fromkeys(k for r in rows for k in r))
            print(f"\n{title}\n" + format_table(head, [[r.get(k, "") for k in head] for r in rows]))
    return 0


def register(sub) -> None:
    p = sub.add_parser("sim", help="simulate a layer call (fused kernel or baseline), or the papers' sweeps",
                       description="Simulate one MoE layer call with the discrete-event model of FlashMoE's "
                                   "persistent kernel and the NIC/proxy path (or the bulk-synchronous "
                                   "baseline), and print its metrics; --sweep prints the papers' tables. The "
                                   "memory and time it needs are estimated first: past the free memory it stops, "
                                   "past a few minutes it asks for --long.",
                       epilog="exit status: 0 done, 2 a bad option, config, hardware file or output path.")
    add_config_args(p)
    p.add_argument("--nodes", type=int, metavar="N", help="spread the GPUs over N nodes (N divides the GPUs)")
    p.add_argument("--hardware", default=DEFAULT,
                   help=f"a hardware preset ({', '.join(PRESETS)}) or a calibration .json (default: {DEFAULT})")
    p.add_argument("--transport", default="ibgda", choices=TRANSPORTS,
                   help="how tiles cross nodes (default: ibgda)")
    p.add_argument("--dispatch", choices=DISPATCH_PATHS,
                   help="how the fused kernel moves dispatched rows where a block can reach the owner's memory: "
                        f"staged (the peers' chunks stored by {STAGED_BLOCKS} blocks one after another, local expert "
                        "by local expert, this GPU's own by the rest), store (every chunk shared by up to 4 blocks "
                        "at once), or put (each chunk packed and put by one block, the kernel's path where a peer "
                        f"is not reachable); default: as the kernel does, {DEFAULT_DISPATCH}")
    p.add_argument("--staged-blocks", type=positive_int, default=STAGED_BLOCKS, metavar="N",
                   help=f"the processors that send the peers' chunks on the staged dispatch, 1 to the hardware's "
                        f"processor blocks but one (default: the kernel's {STAGED_BLOCKS})")
    p.add_argument("--queue", choices=QUEUE_POLICIES,
                   help="when a tile's GEMM tasks are queued: GEMM0's with the rest of its expert's tiles once the "
                        "last has landed and GEMM1's once every tile's GEMM0 is done (expert-both), GEMM0's so and "
                        "GEMM1's as the tile's GEMM0 ends (expert, the older bf16 kernel), or each as the tile "
                        "lands and as its GEMM0 ends (tile); default: as the kernel build of the config's precision "
                        "does (bf16: expert-both, float32 and tf32: tile)")
    p.add_argument("--baseline", action="store_true", help="simulate the bulk-synchronous baseline instead")
    p.add_argument("--long", action="store_true",
                   help=f"go on with a config estimated to take over {budget.LONG_S:.0f} s (e.g. perseus-comm)")
    p.add_argument("--trace", metavar="FILE", type=path_ending(".json", ".npz"),
                   help="write the trace: .json (Perfetto) or .npz")
    p.add_argument("--timeline", metavar="FILE", type=path_ending(".png", ".html"),
                   help="draw the timeline: .png or .html (self-contained)")
    p.add_argument("--sweep", nargs="?", const="all", choices=SWEEPS,
                   help="print the papers' sweep tables instead (fused: FlashMoE vs baseline; nodes: "
                        "transports vs nodes and fences; default all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_sim)
    from . import calibrate, compare_cli

    calibrate.register(sub)
    compare_cli.register(sub)
