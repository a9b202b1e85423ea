"""`simulate`: one layer call of a config on simulated GPUs, as a trace and its metrics.

The fused run builds one `FusedKernel` per GPU on a `Fabric` (NVLink ports, NICs, proxies of the
chosen transport) and runs them together; the baseline run builds the bulk-synchronous layer.
The tile plan comes from `reference.plan_of`: the simulator never routes tokens its own way.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import reference
from reference import Config, ConfigError, TilePlan, budget

from . import costs, metrics
from .baseline import Baseline
from .clock import Clock
from .hardware import Hardware
from .hardware import get as get_hardware
from .kernel import FusedKernel, TilePhases
from .network import TRANSPORTS, Fabric
from .ports import move_times
from .trace import META_VERSION, Trace, TraceBuilder
from .variant import Variant


class SimError(ValueError):
    """A simulator option that is not allowed."""

    def __init__(self, name: str, value, allowed: str):
        self.field, self.value, self.allowed = name, value, allowed
        super().__init__(f"simulator option '{name}' = {value!r} is not allowed: {allowed}")


@dataclass(frozen=True, eq=False)
class Result:
    trace: Trace
    metrics: dict
    events: int  # SimPy events processed
    wall_s: float


def with_nodes(cfg: Config, nodes: int) -> Config:
    """`cfg` spread over `nodes` nodes of ranks / nodes GPUs each."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or cfg.ranks % nodes:
        raise ConfigError("nodes", nodes, f"a positive divisor of the number of GPUs ({cfg.ranks})")
    return cfg.replace(gpus_per_node=cfg.ranks // nodes)


def simulate(cfg: Config, hardware: str | Hardware = "h100-sxm", transport: str = "ibgda",
             baseline: bool = False, progress: Callable[[str], None] | None = None,
             plan: TilePlan | None = None, dispatch: str | None = None, queue: str | None = None,
             staged_blocks: int = costs.STAGED_BLOCKS, deal: str = "chunks", share_fences: int = 1,
             select: str = "lists") -> Result:
    """Simulate one layer call of `cfg`; `plan` may pass `reference.plan_of(cfg)` when known;
    `dispatch` is how the fused kernel moves dispatched rows (trace.DISPATCH_PATHS: "staged" or
    "store", both into the owner's memory where a block can reach it, or "put" every chunk; by
    default as the kernel does for cfg, costs.dispatch_path), `staged_blocks` the processors that
    send the peers' chunks on the staged path;
    `queue` when it queues a tile's GEMM tasks (costs.QUEUE_POLICIES: "expert-both", each phase's
    with the rest of its expert's tiles; "expert", GEMM0's so; "tile", as it lands and as its
    GEMM0 tasks end), by default as cfg's kernel build does (costs.queue_policy); `deal` how it deals
    the dispatch's shares to blocks (costs.DISPATCH_DEALS); `share_fences` how many fences a chunk
    stored into a peer as one share takes before its signal (costs.SHARE_FENCES); `select` how the
    gate selects top-k (costs.GATE_SELECTS); together the kernel's variant (sim.variant.Variant)."""
    if transport not in TRANSPORTS:
        raise SimError("transport", transport, "one of " + ", ".join(TRANSPORTS))
    if not isinstance(baseline, bool):
        raise SimError("baseline", baseline, "true or false")
    hw = get_hardware(hardware).for_config(cfg)  # the figures of the cfg's kernel build
    variant = Variant(costs.DEFAULT_DISPATCH if dispatch is None else dispatch,
                      costs.queue_policy(cfg) if queue is None else queue, staged_blocks, deal, share_fences, select)
    bad = variant.invalid(hw)
    if bad:
        raise SimError(*bad)
    say = progress or (lambda _: None)
    t0 = time.perf_counter()
    if plan is None:
        say(f"routing and tile plan of {cfg.name} ({cfg.ranks} GPUs on {cfg.nodes} node(s)): "
            f"{budget.estimate(cfg, 'route').text()}")
        plan = reference.plan_of(cfg)
    # the run makes millions of short-lived objects and few cycles: the collector's passes over them
    # cost a fifth of the run and free nothing, so it waits for the end
    collecting = gc.isenabled()
    gc.disable()
    try:
        env, rec = _run(cfg, plan, hw, transport, baseline, say, variant)
    finally:
        if collecting:
            gc.enable()
    meta = {"meta_version": META_VERSION, "source": "sim", "config": cfg.to_dict(), "hardware": hw.name,
            "hardware_figures": hw.to_dict(),
            "transport": transport, **variant.fields(), "baseline": baseline,
            "processors": hw.sms if baseline else hw.processors}
    trace = rec.build(meta).sorted()
    m = metrics.compute(trace, cfg)
    return Result(trace, m, env.events, time.perf_counter() - t0)


def _run(cfg: Config, plan: TilePlan, hw: Hardware, transport: str, baseline: bool, say,
         variant: Variant) -> tuple[Clock, TraceBuilder]:
    """Run the layer's simulation to its end: its environment and its rows."""
    rec = TraceBuilder()
    env = Clock(say, rec.pack_full)
    what = "bulk-synchronous baseline" if baseline else f"fused kernel, {transport}"
    say(f"simulating {plan.tile_expert.size} tiles ({plan.chunk_src.size} chunks), {plan.task_kind.size} tasks "
        f"({what}, {hw.name})")
    if baseline:
        Baseline(env, cfg, plan, hw, rec).start()
        left = [0]
    else:
        left = _run_fused(env, cfg, plan, hw, transport, rec, variant)
    env.run()
    if left[0]:
        raise RuntimeError(f"simulation of {cfg.name} stalled with {left[0]} chunks not combined")
    say(f"{env.events:,} events; building the trace")
    return env, rec


def _run_fused(env, cfg: Config, plan: TilePlan, hw: Hardware, transport: str, rec: TraceBuilder,
               variant: Variant) -> list[int]:
    """Set up every GPU's kernel on the fabric; returns [chunks not yet combined]."""
    phases = TilePhases(plan)
    durations = costs.task_ns(hw, cfg, plan.task_kind, costs.multiply_flops(cfg, plan),
                              plan.task_bytes.astype(np.float64),
                              costs.weight_bytes_alone(cfg, plan, hw.processors, variant.queue),
                              costs.flops_per_row(cfg, plan),
                              costs.weight_slice_bytes(cfg, plan)).tolist()
    left = [plan.chunk_src.size]

    def chunk_done(_chunk: int) -> None:
        left[0] -= 1

    kernels: list[FusedKernel] = []
    fabric = Fabric(env, cfg, plan, hw, transport, rec, lambda dst, xs: [kernels[dst].arrive(x) for x in xs], phases)
    kernels.extend(FusedKernel(env, cfg, plan, hw, r, phases, durations, rec, fabric.send, chunk_done, variant,
                               fabric.nvlink[r]) for r in range(cfg.ranks))
    # every GPU's blocks dispatch at once: the stores into NVLink peers share the ports on their way
    planned = [k.dispatch_moves() for k in kernels]
    lanes: list[list] = [[] for _ in range(cfg.ranks * hw.processors)]
    for r, (shares, moves, _) in enumerate(planned):
        for (lane, _, _), move in zip(shares, moves):
            lanes[r * hw.processors + lane].append(move)
    times = move_times(lanes, [k.gate_ns for k in kernels for _ in range(hw.processors)], hw.nvlink_gbps)
    for r, (k, (shares, _, tails)) in enumerate(zip(kernels, planned)):
        taken = [0] * hw.processors
        when = []
        for lane, _, _ in shares:
            when.append(times[r * hw.processors + lane][taken[lane]])
            taken[lane] += 1
        k.start(shares, when, tails)
    return left
