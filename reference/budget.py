"""What a job on a config will cost before it starts: an estimate of its memory and time.

`estimate(cfg, job)` sizes the arrays the job holds at once and counts its work ("route": the
inputs, gate and tile plan; "golden": that and the dense forward on every precision path plus the
tile walk; "sim": `moelab sim`'s simulation, its SimPy events counted by the chunks it moves, and
the 2-GPU run beside it; `simulation` is one run alone). `check` refuses a job past the memory
this machine has free, and one past `LONG_S` seconds unless the user said to go on, so a huge
size is one clear line, not a MemoryError after a minute. The rates are a 2-core cloud VM's
(NumPy's BLAS, SimPy); a faster machine finishes sooner, so the figures are "about", within a
factor of a few.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .config import Config
from .numerics import PATHS
from .routing import sampled
from .weights import draw_bytes, ffn_in_width

JOBS = ("route", "golden", "sim")
LONG_S = 120.0  # past this, a job asks to be let go on (a few minutes with a factor-2 estimate)
NORMALS_PER_S = 1e8  # seeded float32 draws (reference.weights): 1.1e8 on one core
GATE_FLOPS_PER_S = 1.5e10  # the float64 gate projection (a skinny GEMM: E columns)
SAMPLED_GATE_FLOPS_PER_S = 6e10  # across nodes: the float32 product of the sampled gate inputs
GEMM_FLOPS_PER_S = 2e10  # an expert's float64/float32 GEMMs of a dense path
ROUTE_NS_PER_SCORE = 10.0  # softmax, top-k (a partition) and slot assignment, per (token, expert) score: 6.5
ROUTE_S_PER_RANK = 0.03  # each rank's gate call: 3 ms at 128 ranks alone, 33 ms on a busy 2-core VM (BLAS threads)
# SimPy events of a fused run, per chunk moved: 9-18 on one node (the GEMM1 tasks' stores through
# the NVLink port), 20-28 across nodes (proxies, fences), measured on tiny at 2, 16 and 64 GPUs,
# flashmoe on 2 and 4 GPUs, and the node sweep at 4 and 16 nodes; across nodes the proxy and the
# NIC are callbacks, not processes: 14.4 an actual chunk at 64 nodes (9.6 an estimated one)
SIM_EVENTS_PER_CHUNK = 15.0
SIM_EVENTS_PER_NETWORK_CHUNK = 15.0
# CPU per event, the tasks' scheduling included: 14.5 us on a quiet core at 64 nodes (perseus-comm,
# ibrc), more when other processes share the cores
SIM_US_PER_EVENT = 14.0
# SimPy's live events and processes, trace rows packed into columns, per event: a bound, about twice
# the peak measured on perseus-comm (353 MB at 8 nodes, 2.2 GB at 64 against 0.68 and 6.5 GB estimated)
SIM_BYTES_PER_EVENT = 700
SIM_BYTES_PER_TASK = 200  # the kernel model's tables


class BudgetError(ValueError):
    """A job too large for this machine, or too long to start without being told to."""


@dataclass(frozen=True)
class Estimate:
    job: str
    bytes: float  # the most memory held at once
    seconds: float

    def text(self) -> str:
        return f"about {format_bytes(self.bytes)} of memory and {format_seconds(self.seconds)}"


def format_bytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.3g} MB"


def format_seconds(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{max(s, 0.1):.1f} s"


def _work(cfg: Config) -> tuple[float, float]:
    """Upper bounds on the tile plan's tasks (every kept row's tiles, their column blocks and
    combines) and chunks."""
    n_tok = cfg.ranks * cfg.tokens
    rows = min(n_tok * cfg.top_k, cfg.experts * cfg.ranks * cfg.slots)
    blocks = cfg.ranks if not cfg.merge_sources else 1
    tiles = rows / cfg.tile_m + min(cfg.experts * blocks, rows) + cfg.shared_experts * cfg.ranks * \
        math.ceil(cfg.tokens / cfg.tile_m)
    # a combine per chunk: a tile's rows of one source; at most one more per (source, expert) block
    chunks = min(tiles + cfg.ranks * cfg.experts, rows + tiles)
    return tiles * (math.ceil(cfg.ffn / cfg.tile_n) + math.ceil(cfg.hidden / cfg.tile_n)) + chunks, chunks


def estimate(cfg: Config, job: str) -> Estimate:
    """Memory and time of `job` (one of JOBS) on `cfg`."""
    if job not in JOBS:
        raise ValueError(f"job {job!r} is not one of {', '.join(JOBS)}")
    n_tok, h, e = cfg.ranks * cfg.tokens, cfg.hidden, cfg.experts
    scores = n_tok * e
    # routing, one rank at a time (reference.route_config): its float32 tokens (across nodes drawn in
    # Wg's column space, min(H, E) wide) and their float64 copy, a few float64 (token, expert) tables;
    # every rank's choices; the plan
    width, gate_rate = (min(h, e), SAMPLED_GATE_FLOPS_PER_S) if sampled(cfg) else (h, GATE_FLOPS_PER_S)
    route_bytes = cfg.tokens * width * 12 + cfg.tokens * e * 8 * 4 + n_tok * cfg.top_k * 48
    route_s = (n_tok * width / NORMALS_PER_S + 2 * n_tok * width * e / gate_rate
               + scores * ROUTE_NS_PER_SCORE * 1e-9 + cfg.ranks * ROUTE_S_PER_RANK)
    tasks, _ = _work(cfg)
    if job == "route":
        return Estimate(job, route_bytes + tasks * 64, route_s)
    n_exp = e + cfg.shared_experts
    w_in = ffn_in_width(cfg)
    if job == "golden":
        rows = n_tok * (cfg.top_k + cfg.shared_experts)
        flops = 2 * rows * (h * w_in + cfg.ffn * h) * (len(PATHS) + 1)
        # the drawn arrays; on a float64 path the tokens, a row per (token, choice) and an expert's
        # operands; the outputs of every path; the gate's tables
        held = (draw_bytes(cfg) + 8 * (n_tok * h * (2 + cfg.top_k + cfg.shared_experts) + h * (2 * w_in + cfg.ffn))
                + n_tok * h * 4 * (len(PATHS) + 1) + scores * 8 * 4)
        return Estimate(job, held, route_s + n_exp * h * (w_in + cfg.ffn) / NORMALS_PER_S + flops / GEMM_FLOPS_PER_S)
    one = simulation(cfg)
    if cfg.ranks > 2 and cfg.experts % 2 == 0:  # `moelab sim` adds the 2-GPU run of the layer
        two = simulation(cfg.replace(ranks=2, gpus_per_node=2))
        return Estimate(job, max(one.bytes, two.bytes), one.seconds + two.seconds)
    return one


def simulation(cfg: Config) -> Estimate:
    """One simulated layer call of `cfg`, its routing and tile plan included."""
    route, (tasks, chunks) = estimate(cfg, "route"), _work(cfg)
    events = chunks * (SIM_EVENTS_PER_NETWORK_CHUNK if cfg.nodes > 1 else SIM_EVENTS_PER_CHUNK)
    return Estimate("sim", route.bytes + tasks * SIM_BYTES_PER_TASK + events * SIM_BYTES_PER_EVENT,
                    route.seconds + events * SIM_US_PER_EVENT * 1e-6)


def available_bytes() -> float | None:
    """The memory this machine can still give (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check(cfg: Config, job: str, go_on: bool = False, flag: str | None = "--long") -> Estimate:
    """Refuse `job` on `cfg` past the free memory, or past LONG_S seconds unless `go_on` (`flag`
    names the option that sets it; None where there is none, as in the app)."""
    est = estimate(cfg, job)
    free = available_bytes()
    if free is not None and est.bytes > free:
        raise BudgetError(f"config {cfg.name!r} is too large for this machine: {job} needs {est.text()}, "
                          f"{format_bytes(free)} is free; reduce tokens, ranks, experts, hidden or ffn")
    if est.seconds > LONG_S and not go_on:
        go = f"pass {flag} to go on, or " if flag else ""
        raise BudgetError(f"config {cfg.name!r}: {job} would take {est.text()} on a 2-core machine; "
                          f"{go}reduce tokens, ranks, experts, hidden or ffn")
    return est
