"""The cost model: how long a block spends on a task, the gate or moving a tile, from the preset.

A block's share of the chip is 1 / (SMs x blocks per SM) of its matrix rate (peak x efficiency; the
expert GEMMs at the rate of the config's GEMM precision, so a tf32 config's at the TF32 tensor-core
rate) and of its HBM bandwidth. A task takes its FLOPs over the block's rate or its HBM bytes over the
block's bandwidth, whichever dominates, plus the per-task overhead. GEMM operands are reread by
many tasks, so only (1 - L2 hit fraction) of a GEMM task's bytes reach HBM; a combine streams.

Beyond that roofline, the megakernel's own mechanisms (0 in the presets, measured and set by
calibration): the gate runs in float64 work items of 32 tokens x 64 experts (FP64 tensor cores) on
every block (an item's H split over up to 8 blocks when the items are fewer than the blocks), each
item's tokens pick their top k in k passes over their logits (4 lanes a token; from shared memory up
to 64 experts, else from global memory), then one block per expert scans its row counts per (choice,
item) for its slots; a tile GEMM task costs `gemm_fixed_ns` beyond its FLOPs however few its rows
(its prologue and epilogue), and a load of its weight slice: `weight_stream_ns_per_byte` per byte of
the whole slice (every task streams it from the L2, k-step by k-step, beside the other blocks' tasks,
so a deeper GEMM's task takes longer whatever its rows) and `weight_load_ns_per_byte` per byte of it
over the tiles of its expert that share the slice at once (a slice one tile uses alone comes from
HBM), the multiply and that load added, or where measured overlapped as the p-norm of the two
(`gemm_overlap_power`: a slice streamed from HBM hides most of a short tile's multiply), its rows
computed in whole groups of `gemm_row_group` (where measured; the tensor-core builds' whole 64-row
blocks) and its columns a whole tile_n-wide slice (a ragged last column block multiplies the zero
fill past the matrix too, and loads its own columns); a block copies token rows at its own rate
alone, slower as the bytes all blocks copy at once outgrow the L2; a dispatched chunk's rows (a
tile's rows of one source) are gathered straight into the owner's inbox (its GPU, or an NVLink peer
at the block's copy rate on the whole rounds and passes its copy loop takes, copied_bytes, and the
port's share, then its fence: SHARE_FENCES), by one of STAGED_BLOCKS processors for a peer and by
one of the others for this GPU (the "staged" path, the kernel's default), or shared by up to 4 processors when the
dispatch slots are fewer than they (the "store" path, and the staged one on one GPU), or, across
nodes and on the kernel's "put" path, packed by one block and put by its threads, slowed the same
way by the bytes in flight; a GEMM1 task stores its output of each chunk straight into the chunk's
source GPU's memory (over NVLink at the block's store rate, and no sooner than its bytes have gone
through the GPU's port, shared equally by the flows in it: port_gbps; across nodes the tile's last
task puts it through the NIC); after its last task every processor sums its share of tokens in
choice order, a warp a token, paying for its own rounds of tokens (reduce_tokens): its kept rows
read and its sum written (reduce_bytes). The float32 kernel weights a chunk's returned rows in its
combine task (a copy); the bf16 kernel weights the bf16 rows in float32 in that final sum, its
combine task only marks the chunk's arrival (modeled, for a calibrated preset, at the mark's fixed
time timed in the layers). Times in ns; flops per ns = TFLOP/s x 1e3, bytes per ns = GB/s.
"""

from __future__ import annotations

import math

import numpy as np

from reference import Config
from reference.plan import COMBINE, GEMM0, GEMM1, LOCAL, NVLINK, chunk_slots, column_blocks, weight_columns

from .hardware import Hardware

GATE_TOKENS, GATE_EXPERTS = 32, 64  # the gate's work item (the kernel's too: gpu/layout.py kernel_constants)
GATE_DEPTH, GATE_MAX_SPLITS = 64, 8  # its slice of H, and the most blocks one item's H is split over
# the top-k selection (gate.cuh gate_select): lanes that share one token's experts, and the most
# experts whose logits it reads from shared memory (more: from global memory)
SELECT_LANES, GATE_SMEM_LOGITS = 4, 64
# how the gate selects top-k (gate.cuh gate_select): "lists", each lane keeping its best experts in
# a sorted list of 2, 4 or 8 places as it reads them once, 8 choices a round (the kernel's); "passes",
# one pass over a lane's experts per choice, as an earlier kernel did (committed runs and gate
# microbenchmarks that record no "select" measured it)
GATE_SELECTS = ("lists", "passes")
UNRECORDED_SELECT = GATE_SELECTS[1]  # what a run or gate point that records no "select" measured
# the places a lane's list may have, the shortest that holds k taken; the longest is a round's choices
# (the kernel's too: gpu/layout.py kernel_constants)
SELECT_LISTS = (2, 4, 8)
SELECT_ROUND = SELECT_LISTS[-1]
# "staged" (sim.trace.DISPATCH_PATHS): the peers' chunks sent by STAGED_BLOCKS processors one after
# another, local expert by local expert, the other processors storing their own GPU's chunks
# (the host hands the kernel this count: gpu/layout.py)
STAGED_BLOCKS = 16
# the dispatch path the kernel takes unless told another (sim.trace.DISPATCH_PATHS; on one GPU the staged
# path is the flat one): on four H200s it beat the flat "store" path by 7-27% on the top-8 zoo layers
# (docs/notes/dispatch.md)
DEFAULT_DISPATCH = "staged"
# when a tile's GEMM tasks are queued (queue_policy): "expert-both", its GEMM0 tasks with the rest of
# its expert's tiles, from every source, once the last has landed, and its GEMM1 tasks with theirs
# once every tile's GEMM0 tasks are done (os.cuh enqueue_expert); "expert", its GEMM0 tasks so and
# its GEMM1 tasks as its own GEMM0 tasks are done (the older bf16 build); "tile", each
# phase's tasks as the tile lands and as its GEMM0 tasks are done
QUEUE_POLICIES = ("expert-both", "expert", "tile")
# how the kernel deals its dispatch shares to blocks (processor.cuh deal_chunks): "chunks", the
# non-empty chunks numbered one after another (the kernel's); "slots", every chunk slot numbered, empty
# or not, as an earlier kernel did (committed runs that record no "deal" in their meta measured it)
DISPATCH_DEALS = ("chunks", "slots")
# system-scope fences before the signal of a chunk stored into a peer as one share (processor.cuh
# dispatch_chunk): 1, the kernel's; 2, an earlier kernel's, which fenced again before the count
# (committed runs that record no "share_fences" in their meta measured it)
SHARE_FENCES = (1, 2)
BY_EXPERT = ("expert-both", "expert")  # the policies that queue an expert's tiles' GEMM0 tasks together
DISPATCH_MAX_PARTS = 4  # the most processors that share one stored tile (the kernel's too: gpu/layout.py)
REDUCE_WARPS = 4  # the final combine spreads tokens over the processors' 4 warps (processor.cuh)
Y_BYTES = 4  # the layer's output y is float32 in both kernels (params.cuh)
REDUCE_BATCH = 4  # 16-byte loads a lane has in flight per returned row in the final combine (the kernel's too)
# a block's copy loop (processor.cuh copy_rows): each warp copies COPY_ROW_GROUP rows at once, each lane
# COPY_ROW_BATCH 16-byte vectors of each per pass, every load in flight before its stores (the kernel's too)
COPY_ROW_GROUP, COPY_ROW_BATCH = 4, 2
WEIGHTED_IN_TASK = {"float32": True, "bfloat16": False}  # processor.cuh: TASK_COMBINE weights rows (fp32 only)


def blocks(hw: Hardware) -> int:
    return hw.sms * hw.blocks_per_sm


def gate_units(hw: Hardware) -> int:
    """The gate phase's workers: every resident block's 128-thread units (gate.cuh unit_count)."""
    return blocks(hw) * hw.warpgroups_per_block


def chip_flops_per_ns(hw: Hardware, dtype: str) -> float:
    return hw.tflops(dtype) * 1e3 * hw.matrix_efficiency


def block_flops_per_ns(hw: Hardware, dtype: str) -> float:
    return chip_flops_per_ns(hw, dtype) / blocks(hw)


def block_bytes_per_ns(hw: Hardware) -> float:
    return hw.hbm_gbps / blocks(hw)


def queue_policy(cfg: Config) -> str:
    """The queue policy of cfg's kernel build (os.cuh QUEUE_BY_EXPERT): the bf16 build queues an
    expert's tiles' tasks together, both GEMM phases (its older traces say "expert": GEMM0
    only; the oldest carry no "queue", each tile as it landed), the float32 and tf32
    builds each tile's."""
    return "expert-both" if cfg.dtype == "bfloat16" else "tile"


def weight_bytes_alone(cfg: Config, plan, processors: int, queue: str) -> np.ndarray:
    """Per task: its weight slice's bytes over the tiles that share the slice at once: all of its
    expert's, from every source, where the subscriber queues them together (`queue` in BY_EXPERT,
    QUEUE_POLICIES); only those of the same source where each tile was queued as it landed
    ("tile": a peer's tiles ran 170-390 us after the GPU's own, two H100s, when the slice had
    left the L2), a tile counting as the source of its last chunk (it lands with it); the slice:
    weight_slice_bytes (the last column block may be narrower); the tiles queued together
    are queued column block by column block (os.cuh enqueue_expert: the tasks of one slice side by
    side), so up to the processors run a slice's tasks at once, while of tiles queued one by one, with
    their tasks together (and the GEMM1 tasks of "expert"), at most processors / the tile's tasks of
    that kind do; 0 for a combine task."""
    kind, tile = plan.task_kind, plan.task_tile
    experts = cfg.experts + cfg.shared_experts
    src = 0 if queue in BY_EXPERT else plan.chunk_src[plan.chunk_lo[1:] - 1]  # each tile's last chunk
    key = (plan.tile_owner.astype(np.int64) * cfg.ranks + src) * experts + plan.tile_expert
    _, group, size = np.unique(key, return_inverse=True, return_counts=True)  # tiles sharing each key
    tiles_of = size[group][tile]
    tasks_per_tile = np.where(kind == GEMM0, column_blocks(cfg, GEMM0), column_blocks(cfg, GEMM1))
    by_column = (kind == GEMM0) if queue == "expert" else queue in BY_EXPERT  # "expert": GEMM1 tile by tile
    at_once = np.where(by_column, processors, np.maximum(processors // tasks_per_tile, 1))
    return weight_slice_bytes(cfg, plan) / np.minimum(tiles_of, at_once)


def weight_slice_bytes(cfg: Config, plan) -> np.ndarray:
    """Per task: the bytes of its whole weight slice (its GEMM's depth x its weight columns, a gated
    GEMM0 task's gate and up ones), which it streams through the L2 whatever the tiles sharing it; 0
    for a combine."""
    kind = plan.task_kind
    depth = np.where(kind == GEMM0, cfg.hidden, cfg.ffn)
    cols = weight_columns(cfg, kind, plan.task_cols)
    return np.where(kind == COMBINE, 0.0, depth * cols * float(cfg.dtype_bytes))


def flops_per_row(cfg: Config, plan) -> np.ndarray:
    """Per task: the FLOPs its multiply spends on one of its tile's rows, 2 x its GEMM's depth x
    tile_n weight columns (a gated GEMM0 task's gate and up ones): every build multiplies a whole
    tile_n-wide weight slice, so a ragged last column block's columns past the matrix (the TMA's
    zero fill, or a row's next columns) cost as much as its own; 0 for a combine."""
    depth = np.where(plan.task_kind == GEMM0, cfg.hidden, cfg.ffn)
    return np.where(plan.task_kind == COMBINE, 0.0, 2.0 * depth * cfg.tile_n)


def multiply_flops(cfg: Config, plan) -> np.ndarray:
    """Per task: the FLOPs its multiply spends (its tile's rows x flops_per_row; plan.task_flops
    counts a ragged block's own columns only); a combine's, the plan's (its weighting)."""
    rows = plan.tile_rows[plan.task_tile].astype(np.float64)
    return np.where(plan.task_kind == COMBINE, plan.task_flops.astype(np.float64), rows * flops_per_row(cfg, plan))


def task_ns(hw: Hardware, cfg: Config, kind: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
            weight_alone: np.ndarray | float = 0.0, row_flops: np.ndarray | float = 0.0,
            weight_slice: np.ndarray | float = 0.0) -> np.ndarray:
    """Duration of each task (arrays of the tile plan's task_kind, task_flops, task_bytes,
    `weight_alone` from weight_bytes_alone where the preset measures the weights' loads, `row_flops`
    from flops_per_row where it measures a row group, and `weight_slice` from weight_slice_bytes
    where it measures the slices' stream)."""
    combine = kind == COMBINE
    if hw.weight_stream_ns_per_byte and not np.any(weight_slice):
        raise ValueError(f"weight_slice = {weight_slice!r}: {hw.name} streams every GEMM task's weight slice at "
                         f"{hw.weight_stream_ns_per_byte:g} ns per byte, so task_ns needs each task's slice bytes "
                         "(weight_slice_bytes)")
    if hw.gemm_row_group > 1:
        if not np.any(row_flops):
            raise ValueError(f"row_flops = {row_flops!r}: {hw.name} computes tile rows in groups of "
                             f"{hw.gemm_row_group:g}, so task_ns needs each task's FLOPs per row (flops_per_row)")
        rows = np.divide(flops, row_flops, out=np.zeros_like(flops, dtype=float), where=np.asarray(row_flops) > 0)
        whole = cfg.precision in WHOLE_ROW_BLOCKS
        flops = np.where(combine, flops, grouped_rows(rows, hw.gemm_row_group, whole) * row_flops)
    if hw.copy_ns_per_byte and not WEIGHTED_IN_TASK[cfg.dtype]:
        # moelab's measured bf16 kernel: the combine task only marks the arrival (the roofline
        # presets keep FlashMoE's weighting task)
        flops, nbytes = np.where(combine, 0.0, flops), np.where(combine, 0.0, nbytes)
    hbm_bytes = np.where(combine, nbytes, nbytes * (1.0 - hw.l2_hit_fraction))
    # the GEMM tasks multiply in the GEMM precision; a combine's few flops (its weighting) in dtype
    compute = flops / np.where(combine, block_flops_per_ns(hw, cfg.dtype), block_flops_per_ns(hw, cfg.precision))
    memory = hbm_bytes / block_bytes_per_ns(hw)
    combine_fixed = 0.0
    if hw.copy_ns_per_byte:
        # a measured rate replaces the even HBM share for the combine (it weights its rows in
        # place: rows x H values of the plan's (nb + 4) bytes each): the task's own, timed in the
        # layers, where the preset has it, else copy_rows' alone
        rate = hw.copy_ns_per_byte
        if not WEIGHTED_IN_TASK[cfg.dtype]:
            combine_fixed = hw.tile_combine_fixed_ns  # the bf16 task's mark alone, as timed in the layers
        elif hw.tile_combine_ns_per_byte:
            returned = returned_bytes(cfg.tokens, cfg.top_k + cfg.shared_experts, cfg.hidden, cfg.dtype_bytes)
            rate, combine_fixed = tile_combine_ns_per_byte_at(hw, returned), hw.tile_combine_fixed_ns
        memory = np.where(combine, nbytes / (cfg.dtype_bytes + 4) * cfg.dtype_bytes * rate, memory)
    busy = np.maximum(compute, memory)
    load = (hw.weight_stream_ns_per_byte * np.asarray(weight_slice)
            + hw.weight_load_ns_per_byte * np.asarray(weight_alone))
    gemm = hw.gemm_fixed_ns + overlapped(busy, load, hw.gemm_overlap_power)
    return np.where(combine, busy + combine_fixed, gemm) + hw.task_overhead_ns


def overlapped(multiply, load, power: float):
    """A GEMM task's multiply and its weight slice's load together: added where `power` is 0 or 1,
    else their p-norm, (multiply^p + load^p)^(1/p): a task whose slice streams from HBM alone takes
    about the load's time whatever its rows, one whose slice is in L2 the multiply's, and between
    them the two overlap in part (one H200's bf16 tasks of 13-128 rows at 1 tile per expert 38-44 us,
    of 128 rows at 2, 4 and 16 tiles 34, 31 and 30 us)."""
    multiply, load = np.asarray(multiply, np.float64), np.asarray(load, np.float64)
    if power <= 1:
        return multiply + load
    return (multiply ** power + load ** power) ** (1.0 / power)


# the warps of a tile GEMM block that share one row group's rows (the float32 SIMT GEMM: 4 warps)
GROUP_WARPS = 4
# the tensor-core builds' rows: tile_gemm_wgmma.cuh copies and multiplies only the 64-row blocks of
# A that hold a row, each whole (wgmma's M); their gemm_row_group is this block, not a fitted one
WGMMA_ROW_BLOCK = 64
WHOLE_ROW_BLOCKS = ("bfloat16", "tf32x3")  # the GEMM precisions of the wgmma builds


def grouped_rows(rows, group: float, whole: bool = False):
    """A tile's rows as its multiply computes them: in whole groups of `group` (1: each row), and
    (not `whole`: the float32 SIMT GEMM) a tile of one group or less in whole warps' shares of it
    (a warp whose rows all lie past the tile's skips the multiply: one H100's float32 tasks of
    13-15, 17-48, 49-64 and 65-128 rows took 103, 133-137, 166-170 and 208-222 us in the layers)."""
    rows = np.asarray(rows, np.float64)
    step = group if whole else np.where(rows <= group, group / GROUP_WARPS, group)
    return np.ceil(np.round(rows / step, 9)) * step if group > 1 else rows


def returned_bytes(tokens: int, rows: int, hidden: int, dtype_bytes: int) -> int:
    """The bytes of the rows `tokens` tokens get back from their experts (`rows` per token)."""
    return tokens * rows * hidden * dtype_bytes


def tile_combine_ns_per_byte_at(hw: Hardware, total: float) -> float:
    """The per-tile combine's time per byte of its tile while the layer returns `total` bytes: the
    L2's rate for the share of them it holds (tile_combine_knee_bytes), HBM's for the rest."""
    return held_ns_per_byte(hw.tile_combine_l2_ns_per_byte, hw.tile_combine_ns_per_byte, hw.tile_combine_knee_bytes,
                            total)


def gate_roofline_ns(hw: Hardware, cfg: Config) -> float:
    """The gate at the chip's rates: logits x Wg over T tokens, reading the tokens and Wg."""
    flops = 2.0 * cfg.tokens * cfg.hidden * cfg.experts
    nbytes = cfg.dtype_bytes * (cfg.tokens * cfg.hidden + cfg.hidden * cfg.experts)
    return max(flops / chip_flops_per_ns(hw, cfg.dtype), nbytes / hw.hbm_gbps)


def gate_splits(tokens: int, hidden: int, grid: int) -> int:
    """Units sharing one gate item's H (gate.cuh gate_splits), `grid` units in all: as many as
    leave every unit a share when the items are fewer than the units, each whole slices of H,
    none empty."""
    items, slices = math.ceil(tokens / GATE_TOKENS), math.ceil(hidden / GATE_DEPTH)
    want = max(1, min(grid // items, slices, GATE_MAX_SPLITS))
    return math.ceil(slices / math.ceil(slices / want))


def gate_work(tokens: int, hidden: int, experts: int, grid: int) -> int:
    """The hidden elements one unit's gate items span, one after another (`grid` units): its share
    of the (item, split) pieces, each GATE_EXPERTS experts per pass over its range of H."""
    splits = gate_splits(tokens, hidden, grid)
    pieces = math.ceil(tokens / GATE_TOKENS) * splits
    depth = math.ceil(math.ceil(hidden / GATE_DEPTH) / splits) * GATE_DEPTH
    return math.ceil(pieces / grid) * math.ceil(experts / GATE_EXPERTS) * min(depth, hidden)


def slot_scan(tokens: int, top_k: int, experts: int, grid: int) -> int:
    """The capacity phase's scan on one unit of `grid` (gate.cuh capacity_phase): its experts' row
    counts, one per (choice, gate item)."""
    return math.ceil(experts / grid) * top_k * math.ceil(tokens / GATE_TOKENS)


def gate_items_per_unit(tokens: int, grid: int) -> int:
    """The gate items the busiest of `grid` units selects (an item's H may be split over several,
    its selection is one unit's)."""
    return math.ceil(math.ceil(tokens / GATE_TOKENS) / grid)


def gate_select_reads(tokens: int, top_k: int, experts: int, grid: int) -> tuple[int, int]:
    """The logits one lane of the busiest of `grid` units considers in the passes selection (one pass
    per choice): for each gate item it selects, top_k passes over its every SELECT_LANES-th expert,
    one after another (each pass needs the last one's choice); (from shared memory, from global
    memory): the logits of more than GATE_SMEM_LOGITS experts are read from global memory on every pass."""
    reads = gate_items_per_unit(tokens, grid) * top_k * math.ceil(experts / SELECT_LANES)
    return (reads, 0) if experts <= GATE_SMEM_LOGITS else (0, reads)


def select_list(top_k: int) -> int:
    """The places of a lane's list in the lists selection: the shortest of SELECT_LISTS that holds
    top_k, the longest past it (a round each SELECT_ROUND choices)."""
    return next(n for n in SELECT_LISTS if top_k <= n or n == SELECT_ROUND)


def gate_list_steps(tokens: int, top_k: int, experts: int, grid: int) -> int:
    """The lists selection's work on one lane of the busiest of `grid` units: for each gate item it
    selects, each round reads the lane's every SELECT_LANES-th expert once and compares it at each
    place of its list."""
    rounds = math.ceil(top_k / SELECT_ROUND)
    return gate_items_per_unit(tokens, grid) * rounds * math.ceil(experts / SELECT_LANES) * select_list(top_k)


def gate_weighs(tokens: int, top_k: int, grid: int) -> int:
    """The choices the first lane of a token weighs, one after another, on the busiest of `grid`
    units (gate.cuh gate_select_top): top_k for each gate item it selects."""
    return gate_items_per_unit(tokens, grid) * top_k


def gate_logit_reads(tokens: int, experts: int, grid: int) -> int:
    """The logits one lane of the busiest of `grid` units handles for each gate item it selects, past
    its selection's list: its every SELECT_LANES-th expert's, which the item's epilogue stored and
    the lane reads back (for the softmax's max and sum where the gate takes one), whatever top_k."""
    return gate_items_per_unit(tokens, grid) * math.ceil(experts / SELECT_LANES)


def gate_kernel_ns(hw: Hardware, cfg: Config, select: str = "lists") -> float:
    """The gate's code alone, as the microbenchmark times it (gate.cuh gate_phase and capacity_phase):
    the roofline or the kernel's work items, top-k selections (by `select`, GATE_SELECTS), the
    items' logits, the choices' weights and slot scans, whichever is longer, and the phase's fixed
    cost."""
    roofline = gate_roofline_ns(hw, cfg)
    units = gate_units(hw)
    slots = slot_scan(cfg.tokens, cfg.top_k, cfg.experts, units)
    if select == "lists":
        choose = gate_list_steps(cfg.tokens, cfg.top_k, cfg.experts, units) * hw.gate_list_ns
    else:
        smem, glob = gate_select_reads(cfg.tokens, cfg.top_k, cfg.experts, units)
        choose = smem * hw.gate_select_smem_ns + glob * hw.gate_select_global_ns
    kernel = (gate_work(cfg.tokens, cfg.hidden, cfg.experts, units) * hw.gate_item_ns_per_h + slots * hw.gate_slot_ns
              + gate_weighs(cfg.tokens, cfg.top_k, units) * hw.gate_weigh_ns
              + gate_logit_reads(cfg.tokens, cfg.experts, units) * hw.gate_logit_ns)
    split = hw.gate_split_ns if gate_splits(cfg.tokens, cfg.hidden, units) > 1 else 0.0
    return max(roofline, kernel + choose) + hw.gate_fixed_ns + split


def gate_ns(hw: Hardware, cfg: Config, select: str = "lists") -> float:
    """The megakernel's gate phase: the gate's code and what the megakernel's gate event holds
    beyond it (hw.gate_layer_ns)."""
    return gate_kernel_ns(hw, cfg, select) + hw.gate_layer_ns


def contended_ns_per_byte(alone: float, extra: float, half: float, inflight: float, knee: float = 0.0) -> float:
    """A block's time per byte while all blocks have `inflight` bytes of copies or puts going:
    `alone` while they fit in the L2 (up to `knee` bytes), slower as the bytes beyond it grow."""
    beyond = max(inflight - knee, 0.0)
    return alone + (extra * beyond / (beyond + half) if extra else 0.0)


def put_ns(hw: Hardware, link: int, nbytes: float, inflight: float | None = None, over_link: int = 1) -> float:
    """The issuing block's time to put a tile to its own GPU or over NVLink while all blocks have
    `inflight` bytes of puts going (default: this one), `over_link` puts over this link: the
    block's threads store the bytes, loading the GPU's memory as local puts do; over NVLink at
    the block's own rate or the port's share, whichever is slower (the GPU's memory, ten times
    the port's bandwidth, does not slow them: on two H100s 16 to 32 blocks put 1 MiB each in the
    time one does, 106-110 us, where the local puts' contention made it 128-224). (The network
    path hands the put to a NIC or a proxy: no block time here.)"""
    if link == NVLINK:
        # a preset without the block's own rate (0) still shares the port
        return nbytes * port_ns_per_byte(hw.put_nvlink_ns_per_byte, over_link, hw.nvlink_gbps)
    if link != LOCAL:
        return 0.0
    return nbytes * contended_ns_per_byte(hw.put_local_ns_per_byte, hw.put_local_extra_ns_per_byte,
                                          hw.put_local_half_bytes, nbytes if inflight is None else inflight,
                                          hw.l2_knee_bytes)


def store_ns(hw: Hardware, link: int, nbytes: float) -> float:
    """A GEMM1 task's extra time to store its `nbytes` of output into the source GPU's memory: none
    on its own GPU (the measured task stores its output there); over NVLink its bytes at the rate
    measured for such stores in the layer (return_store_ns_per_byte), then its system-scope fence,
    which waits for them to land before it signals the source (return_fence_ns); none across nodes
    (the tile's last task hands its put to the NIC or proxy, as put_ns says)."""
    if link != NVLINK or nbytes <= 0:
        return 0.0
    return nbytes * hw.return_store_ns_per_byte + return_fence_ns(hw)


def return_fence_ns(hw: Hardware) -> float:
    """A GEMM1 task's fence after storing rows into an NVLink peer: one NVLink round trip, once a
    task however many of its chunks went there (processor.cuh; a peer's tile's tasks 2.2-3.6 us
    longer than the GPU's own tiles' in the two- and four-H200 layers, a round trip 2.2)."""
    return 2 * hw.nvlink_latency_ns


def port_ns_per_byte(alone: float, concurrent: int, gbps: float) -> float:
    """A block's time per byte with `concurrent` blocks sharing a port of `gbps`, `alone` without."""
    return max(alone, concurrent / gbps)


def gather_ns(hw: Hardware, nbytes: float, inflight: float) -> float:
    """One block gathers `nbytes` of token rows (reads and writes them) while all blocks copy
    `inflight` bytes at once."""
    if hw.copy_ns_per_byte:  # a measured copy rate replaces the even HBM share
        return nbytes * contended_ns_per_byte(hw.copy_ns_per_byte, hw.copy_extra_ns_per_byte, hw.copy_half_bytes,
                                              inflight, hw.l2_knee_bytes)
    return 2.0 * nbytes / block_bytes_per_ns(hw)


def pack_ns(hw: Hardware, nbytes: float, link: int, inflight: float | None = None, over_link: int = 1) -> float:
    """One block gathers a tile's token rows into the send buffer (reads and writes its bytes),
    then puts it; all blocks pack and put `inflight` bytes at once, `over_link` tiles over this link."""
    inflight = nbytes if inflight is None else inflight
    return gather_ns(hw, nbytes, inflight) + put_ns(hw, link, nbytes, inflight, over_link) + hw.task_overhead_ns


def stores_dispatch(path: str, link: int) -> bool:
    """Whether the kernel stores a dispatched tile's rows straight into the owner's inbox (path
    "store" or "staged", to this GPU or an NVLink peer: nvshmem_ptr reaches it) rather than packing
    and putting it."""
    return path in ("store", "staged") and link in (LOCAL, NVLINK)


def dispatch_parts(cfg: Config, processors: int, path: str) -> int:
    """Processors sharing each stored chunk (processor.cuh dispatch_parts): as many as leave every
    processor a share when the dispatch slots (dispatch_slots) are fewer, at most
    DISPATCH_MAX_PARTS; 1 on the put path, and on the staged one where there are peers (on one GPU
    the kernel's staged dispatch is its flat store)."""
    if path == "put" or (path == "staged" and cfg.ranks > 1):
        return 1
    return max(1, min(processors // dispatch_slots(cfg), DISPATCH_MAX_PARTS))


def watched_entries(cfg: Config, plan, rank: int) -> int:
    """The entries GPU `rank`'s subscriber watches (os.cuh subscriber, its lanes splitting them):
    its tiles that wait for dispatched chunks and its own routed chunks that come back."""
    landing = plan.tile_expert[plan.tile_owner == rank] < cfg.experts
    returning = plan.tile_expert[plan.chunk_tile[plan.chunk_src == rank]] < cfg.experts
    return int(np.count_nonzero(landing) + np.count_nonzero(returning))


def signal_seen_ns(hw: Hardware, cfg: Config, plan, rank: int) -> float:
    """From a chunk's signal to the subscriber's seeing it: its lane's pass over its entries."""
    return hw.signal_seen_ns + hw.signal_seen_ns_per_entry * watched_entries(cfg, plan, rank)


def enqueue_ns(hw: Hardware, cfg: Config, tasks: int) -> float:
    """One thread queueing an expert's `tasks` together (os.cuh enqueue_expert): it reads every source
    rank's row count for the expert, then writes and flags each task."""
    return hw.enqueue_ns + hw.enqueue_source_ns * cfg.ranks + hw.enqueue_task_ns * tasks


def dispatch_slots(cfg: Config) -> int:
    """Dispatch slots per (source, expert) block times the experts: the kernel's one slot per
    chunk a block can be cut into (plan.chunk_slots, from C = Config.slots)."""
    return (cfg.experts + cfg.shared_experts) * chunk_slots(cfg)


def dispatch_ns(hw: Hardware, nbytes: float, link: int, path: str, inflight: float | None = None,
                over: dict[int, int] | None = None, tokens: float | None = None) -> float:
    """A processor's time on its `nbytes` share of a dispatched tile while all dispatching blocks
    move `inflight` bytes at once, `over` shares over each link, gathered from this GPU's `tokens`
    bytes of tokens (default, for a share with no layer around it: the bytes in flight stored into
    this GPU): stored into this GPU's inbox, the
    measured store dispatch (a gather where the preset has none), and no sooner than a share of
    its size to an NVLink peer while any goes there where another block shares its SM (measured:
    a GPU's local shares as slow as its NVLink ones at 2 blocks per SM, float32 on two H100s and
    H200s, bf16 on two H200s; at 1, the H100's bf16 build, its local 128-row shares take 42 us and
    its NVLink ones 89); into an NVLink peer's, the block's loads and remote stores (a put's rate
    and the port's share); otherwise packed and put (pack_ns).

    The measured store dispatch charges every share the mean share of the bytes in flight, not
    its own: a share's fence waits for the stores queued ahead of its own, so in the megakernel a
    layer's shares of half and of full size take the same time."""
    inflight = nbytes if inflight is None else inflight
    over = over or {}
    if not stores_dispatch(path, link):
        return pack_ns(hw, nbytes, link, inflight, over.get(link, 1))
    if link == NVLINK:
        return nvlink_share_ns(hw, nbytes, inflight, over) + hw.task_overhead_ns
    if hw.dispatch_store_ns_per_byte:  # measured at the layer's concurrency, one GPU alone
        # its stores contend with the round's bytes stored into this GPU, not those going to the
        # peer (two H100s, bf16: local shares 28 us median beside NVLink ones, 37 on one GPU alone)
        shares = sum(over.values())
        local = inflight * over.get(LOCAL, 0) / shares if over else inflight
        # the staged path stores this GPU's chunks with a few of the processors (the rate is fitted
        # with all of them storing, as the flat one does)
        blocks = shares if over and path == "staged" else None
        own = store_dispatch_ns(hw, inflight / shares if over else nbytes, local if tokens is None else tokens,
                                blocks)
    else:
        own = gather_ns(hw, nbytes, inflight)
    # a block on the SM storing into the peer; the staged senders are the first processors and this
    # GPU's chunks go to the next ones (four H200s, float32: 52.7 us a MiB there, 90.6 to a peer)
    beside = over.get(NVLINK) and hw.blocks_per_sm > 1 and path != "staged"
    queued = nvlink_share_ns(hw, nbytes, inflight, over) if beside else 0.0
    return max(own, queued) + hw.task_overhead_ns


def nvlink_store_rate(hw: Hardware, parts: int = 1, share_fences: int = 1) -> tuple[float, float]:
    """A block storing a dispatch share of a chunk cut in `parts` into an NVLink peer: its time per
    byte alone (its copy loop into a peer, copy_nvlink_ns_per_byte, where measured, else copy_rows'
    or a put's) and its fences', each waiting for the peer to acknowledge the last of them (a round
    trip): the share's own, `share_fences` of them where the chunk is one share (SHARE_FENCES)."""
    fences = share_fences if parts == 1 else 1
    return (hw.copy_nvlink_ns_per_byte or hw.copy_ns_per_byte or hw.put_nvlink_ns_per_byte,
            fences * 2 * hw.nvlink_latency_ns)


def copied_bytes(hw: Hardware, nbytes: float, row_bytes: float) -> float:
    """The bytes a block's copy loop pays for when it copies `nbytes` of rows `row_bytes` wide: its
    passes wait for their loads, so it takes whole rounds of rows (COPY_ROW_GROUP a warp) and whole
    passes of a row (COPY_ROW_BATCH vectors a lane): a 2-row share of H 7168 costs a round of 32 rows
    (bf16's 8 warps), 14 passes each."""
    if nbytes <= 0 or row_bytes <= 0:
        return nbytes
    rows_a_round = COPY_ROW_GROUP * 4 * hw.warpgroups_per_block  # 4 warps a warpgroup
    pass_bytes = 32 * COPY_ROW_BATCH * 16
    rows = math.ceil(nbytes / row_bytes - 1e-9)
    return math.ceil(rows / rows_a_round) * rows_a_round * math.ceil(row_bytes / pass_bytes) * pass_bytes


def nvlink_share_ns(hw: Hardware, nbytes: float, inflight: float, over: dict[int, int]) -> float:
    """A dispatch share stored into the NVLink peer beside this GPU's other shares of its round
    (`over`): its bytes at the block's copy rate or its equal part of this GPU's port, then its
    fence (nvlink_store_rate). The simulator shares every GPU's ways out and in among all their
    flows at once (sim.ports); this count is one GPU's blocks storing together, as the calibration
    measures them. The block's copy loop, not a put's: on four H200s 32 staged senders stored
    11.3 GB/s each, the port's share, where one block's put moves 9.7; with 16 senders 16 GB/s
    each, under their port share (23) and copy_rows' local rate."""
    rate, fence = nvlink_store_rate(hw)
    return nbytes * port_ns_per_byte(rate, over.get(NVLINK, 1), hw.nvlink_gbps) + fence


def store_dispatch_ns(hw: Hardware, nbytes: float, tokens: float, blocks: int | None = None) -> float:
    """A share of `nbytes` gathered from this GPU's `tokens` bytes of tokens and stored into its
    inbox: fixed + bytes x per byte, the L2's rate for the share of the tokens it holds
    (dispatch_store_knee_bytes of them: the gate has just read them all), HBM's for the rest. A
    token row is read once per kept choice, so the tokens' bytes, not the dispatched ones, say
    whether the reads hit the L2 (one-GPU validation layers at k 6-7: shares at the L2's rate with
    99 MB dispatched from 14 MB of tokens). Those rates are fitted with every
    processor storing; with `blocks` of them moving rows at once each has that many's share of
    the memory, down to a block's own copy rate (the staged dispatch stores a GPU's own chunks
    with 32-64 blocks: on four H200s 52.7 us a float32 MiB, where every processor's share is 111)."""
    per_byte = held_ns_per_byte(hw.dispatch_store_l2_ns_per_byte, hw.dispatch_store_ns_per_byte,
                                hw.dispatch_store_knee_bytes, tokens)
    if blocks is not None and blocks < hw.processors:
        per_byte = max(per_byte * blocks / hw.processors, hw.copy_ns_per_byte)
    return hw.dispatch_store_fixed_ns + nbytes * per_byte


def reduce_read_width(hidden: int, dtype_bytes: int) -> int:
    """The values of a returned row the final combine pays for: it reads a row in rounds of 32 lanes x
    REDUCE_BATCH 16-byte loads, each round one load's latency whatever share of it lies in H (the
    validation layers' final combine at H 1280-2368 ran 20-43% over a price by H's bytes, at H a
    multiple of a round within 7%)."""
    per_round = 32 * REDUCE_BATCH * 16 // dtype_bytes
    return -(-hidden // per_round) * per_round


def reduce_bytes(tokens: int, rows: float, hidden: int, dtype_bytes: int) -> float:
    """Bytes the final combine moves for `tokens` tokens of `rows` returned rows each (kept ones: a
    dropped choice is skipped, so a mean where some were): the rows' `dtype_bytes` values read, in
    whole rounds (reduce_read_width), and the float32 row of y written, one as dear as the other (the
    ordered combine microbenchmark, 8K tokens on one H200: float32 rows 1.494 times bf16's, where
    these bytes give 1.5 and the rows read alone 2)."""
    return tokens * (rows * dtype_bytes * reduce_read_width(hidden, dtype_bytes) + Y_BYTES * hidden)


def reduce_tokens(tokens: int, processors: int) -> np.ndarray:
    """Per processor, the tokens the final combine charges it: its warps take token t in rounds of
    processors x REDUCE_WARPS (t to processor t // REDUCE_WARPS mod processors, processor.cuh
    combine_tokens), side by side, so a processor pays for its rounds, a whole round for its share of
    the last partial one (one H200's layers: the processors of the extra round 1.2-1.5 times as long)."""
    whole, rest = divmod(tokens, processors * REDUCE_WARPS)
    return (whole + (np.arange(processors) * REDUCE_WARPS < rest)) * REDUCE_WARPS


def reduce_block_ns(hw: Hardware, cfg: Config, processors: int, rows: float | None = None) -> np.ndarray:
    """Per processor, its share of the final ordered combine: its tokens (reduce_tokens), `rows`
    returned rows each (kept ones; default all k and the shared experts') read and the sums written
    (0 when the preset does not model it), a fixed time + its bytes (reduce_bytes) at
    reduce_ns_per_byte_at the bytes of all processors."""
    if not hw.reduce_ns_per_byte:
        return np.zeros(processors)
    rows = cfg.top_k + cfg.shared_experts if rows is None else rows
    total = reduce_bytes(cfg.tokens, rows, cfg.hidden, cfg.dtype_bytes)
    moved = reduce_bytes(reduce_tokens(cfg.tokens, processors), rows, cfg.hidden, cfg.dtype_bytes)
    return hw.reduce_fixed_ns + moved * reduce_ns_per_byte_at(hw, total)


def reduce_ns(hw: Hardware, cfg: Config, processors: int, rows: float | None = None) -> float:
    """The busiest processor's share of the final combine (reduce_block_ns): what the microbenchmark
    and the layers' busiest blocks time."""
    return float(reduce_block_ns(hw, cfg, processors, rows).max())


def reduce_ns_per_byte_at(hw: Hardware, total: float) -> float:
    """The final combine's time per byte when all processors move `total` bytes: the share of
    them the L2 holds (reduce_knee_bytes of the rows GEMM1 just wrote) at reduce_l2_ns_per_byte,
    the rest from HBM at reduce_ns_per_byte (one rate where the preset measured one size)."""
    if not hw.reduce_l2_ns_per_byte:
        return hw.reduce_ns_per_byte
    return held_ns_per_byte(hw.reduce_l2_ns_per_byte, hw.reduce_ns_per_byte, hw.reduce_knee_bytes, total)


def l2_held(knee_bytes: float, total: float) -> float:
    """The share of `total` bytes just written that the L2 still holds (`knee_bytes` of them)."""
    return min(1.0, knee_bytes / total) if total > 0 else 1.0


def held_ns_per_byte(l2_rate: float, hbm_rate: float, knee_bytes: float, total: float) -> float:
    """Time per byte of a move among `total` bytes: the L2's rate for the share of them it holds
    (`knee_bytes`), HBM's for the rest."""
    held = l2_held(knee_bytes, total)
    return l2_rate * held + hbm_rate * (1.0 - held)


def kernel_ns(hw: Hardware, cfg: Config, flops: float, nbytes: float, gemm: bool) -> float:
    """A whole-chip kernel of the bulk-synchronous baseline (launch gap not included); its expert
    GEMMs multiply in the config's GEMM precision (torch with TF32 allowed for a tf32 config)."""
    hbm_bytes = nbytes * (1.0 - hw.l2_hit_fraction) if gemm else nbytes
    return max(flops / chip_flops_per_ns(hw, cfg.precision if gemm else cfg.dtype), hbm_bytes / hw.hbm_gbps)
