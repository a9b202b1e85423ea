"""Calibration microbenchmarks on the GPUs of one host: one process per GPU, like gpu.worker.

    python -m gpu.microbench JOB.json OUT_DIR     (started by `collect`, one process per GPU)

Runs the kernels of kernels/microbench.cu (the megakernel's own device code, piece by piece),
built for the job's dtype (float32, or the bf16 kernel at the bench's bf16 tile shape from
gpu/cases.py), and writes OUT_DIR/results.json from rank 0 after every section, so a section that
fails or a job cut short still leaves the others:

- occupancy: the megakernel's grid and processors (blocks per SM) and the microbenchmarks' own;
- gemm: time per tile GEMM task (GEMM0 with bias + ReLU, GEMM1 with bias) at 1 block and at the
  megakernel's grid, for full and short tiles;
- copy: copy_rows gathers of one tile (128 rows of H elements) per block, 1 block to the full grid;
- put: put-with-signal per block vs message size and issuing blocks, to this GPU and to the peer;
- copy_nvlink: copy_rows of one tile per block straight into the peer's memory (the staged dispatch's
  senders' stores, before their fence), 1 to 2 x STAGED_BLOCKS blocks (two or more GPUs);
- pingpong: put-with-signal and bare-signal round trips between two GPUs vs message size
  (put and pingpong move bytes whatever the dtype: the bf16 job leaves them to the float32 one);
- gate: the gate phase (gate items, barrier, slots, barrier) over tokens and experts, and at GATE_TOPK_POINTS
  over top_k too (the selection's k passes over the logits, from shared and from global memory), and at
  GATE_ROUTER_POINTS with the zoo's other routers;
- dispatch / combine: dispatch_tile over the routed tiles of the gate's 64-expert layers (1K to
  16K tokens: less or more than the L2 in flight; each share's world, since on two GPUs the
  local shares run beside the NVLink ones), and the per-token ordered combine of the FlashMoE
  default, from the blocks' telemetry logs;
- scheduler: gaps between consecutive tasks of a processor (scheduler hand-off) and from a
  tile's arrival to its first task (subscriber), from the megakernel's telemetry on a layer
  that is not one of the measured layer runs (leave-one-out: 12K tokens per GPU); and under
  "idle", on a small layer no run measures either (1.5K tokens), the latencies around idle
  processors: the first task after its tile's signal, the spacing of the first round of tasks,
  the last task to the final combine;
- in_layer: the dispatch shares and the final ordered combine as the megakernel runs them (right
  after the gate, the scheduler and subscriber polling beside them; the combine right after the
  last GEMM1), from its telemetry on IN_LAYERS, none a measured run's size: each
  layer's share times and sizes, the shares and bytes its first round has in flight, the
  final-combine times of the processors with the most tokens, its per-tile combine tasks' times
  and bytes, its blocks' walks to their shares by the row counts their deal read (deal_walk), the
  subscriber's delay in seeing a landed tile by the entries it watches (signal_seen), its
  enqueues of an expert's GEMM0 tasks by their number (enqueues, the bf16 build),
  its megakernel gate phase (gate_ns) and its GEMM tasks' times by kind, tile height and tiles per
  expert; on more GPUs, IN_LAYER_RETURN's GEMM tasks by their tiles' source, its staged
  senders' walks to their shares into the peer (peer_deal_walk) and its enqueues, each expert's
  tiles from both sources.

Job: {"cases": [{"name", "config"}], "sections": [names] (optional: only these)}; the cases'
configs size NVSHMEM's heap and give the dtype.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from reference import Config, presets
from reference.plan import source_stride
from sim.trace import KIND

from . import build, cases, layout, spawn, tma
from .runtime import Inputs, Layer, Session, allow_dynamic_smem

DTYPES = ("float32", "bfloat16", "tf32x3")  # the builds (gpu.cases.PRECISIONS): tf32x3 is float32 data
SECTIONS = ("layer_pieces", "gemm", "copy", "put", "pingpong", "scheduler", "in_layer",
            "copy_nvlink")  # in the order they run
BYTE_SECTIONS = ("put", "pingpong")  # the same NVSHMEM byte moves in both builds: measured by the float32 job
KERNELS = ("mb_gemm", "mb_copy", "mb_put", "mb_pingpong", "mb_gate", "mb_dispatch", "mb_combine")
H = I = 2048  # noqa: E741  (the FlashMoE default's widths: the GEMM microbenchmark's tasks)
SHARING = (1, 2, 8)  # tiles per expert that share each weight slice, in the GEMM microbenchmark
GATE_POINTS = ((8192, 64), (1024, 64), (4096, 64), (16384, 64), (8192, 8), (8192, 128))
# (tokens, experts, top_k): the gate alone at other top_k, logits in shared memory (64 experts) and in
# global memory (128), one or two items a unit: the selection's time per logit (costs.gate_select_reads);
# and at fewer items than units (1-2K tokens, each item's H split), k 2 to 8: the cost of each choice
GATE_TOPK_POINTS = ((8192, 64, 8), (4096, 64, 6), (6144, 128, 8), (12288, 128, 4),
                    (1152, 32, 2), (1152, 32, 8), (1664, 64, 6), (2176, 48, 4))
# (tokens, experts, top_k, router): the gate alone with the zoo's other routers (reference.config
# GATES), each next to a softmax point of the same (tokens, experts, top_k) above where there is one:
# no softmax over E (gpt-oss), a sigmoid of every expert scored (DeepSeek-V3's selection bias), and the
# group-limited routers, whose groups score every expert once more (DeepSeek-V2's and V3's)
GATE_ROUTER_POINTS = ((8192, 64, 2, dict(gate="topk_softmax")), (8192, 64, 2, dict(gate="sigmoid_bias")),
                      (6144, 128, 8, dict(gate="sigmoid_bias")), (4096, 64, 6, dict(n_group=8, topk_group=3)),
                      (6144, 256, 8, dict(gate="sigmoid_bias", n_group=8, topk_group=4)),
                      (3072, 128, 8, dict(gate="sigmoid_bias", n_group=8, topk_group=4)))
ROUTER_FIELDS = ("gate", "n_group", "topk_group")  # what a gate point records of its router
PUT_SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20)
# blocks copying rows into the peer at once: one alone (a sender's own rate) to twice the staged senders
COPY_NVLINK_BLOCKS = tuple(sorted({1, 2, 4, 8, layout.STAGED_BLOCKS, 2 * layout.STAGED_BLOCKS}))
# blocks x bytes in flight from 16 KiB to the full grid's 264 MiB, densest around the L2 (50 MiB)
PUT_BLOCKS = (1, 8, 16, 32, 64, 128)  # and the full grid
PING_SIZES = (0, 4 << 10, 64 << 10, 1 << 20)
GEMM_ROWS = (128, 96, 64, 32)
SHORT_ALONE = (64, 32)  # short tiles at 1 tile per expert: what 1K-2K tokens over 64 experts make
EV_DISPATCH, EV_COMBINE = KIND["dispatch"], KIND["combine"]  # the kernel's codes (layout.kernel_constants)
# the FlashMoE default's task shape at a token count no measured run uses (3 full tiles per block)
SCHED_CONFIG = dict(tokens=12288)
# a small layer (a tile or less per expert) no measured run uses either: its first round of tasks
# is the scheduler's pace, not the subscriber's, and its processors idle before the final combine
SCHED_SMALL = dict(tokens=1536)
# FlashMoE-default layers at token counts no measured run uses (those are powers of two): shares
# of 6 to 128 rows with 11 to 187 MiB of float32 dispatch in flight (half that in bf16), across
# the L2 (50 MiB), and 1 to 6 tiles per expert sharing each weight slice (the 16K-token run has
# 4: with 3 at most, the bf16 128 x 256 build's fit missed its tasks there by 15%)
IN_LAYER_TOKENS = (768, 1280, 1536, 2560, 3072, 6144, 12288, 24576)
# and one layer of 8 experts at 7168 tokens, 14 tiles per expert: where sharing a weight slice stops
# paying (the 8-expert run has 16, and its tasks ran above a fit on 1 to 6 tiles by 10%)
IN_LAYER_SHARING = dict(tokens=7168, experts=8)
# and layers of other widths: GEMMs 512 to 7168 deep (a task streams its whole weight slice, so its
# time grows with the depth, which layers of one width cannot tell from its fixed time; the shallow
# ones, 512 to 1408 deep, are where the fixed time is most of a task)
IN_LAYER_DEPTHS = (dict(tokens=5120, hidden=4096, ffn=1024), dict(tokens=6656, hidden=1536, ffn=7168),
                   dict(tokens=7936, hidden=1024, ffn=768), dict(tokens=9728, hidden=1280, ffn=512),
                   dict(tokens=4608, hidden=768, ffn=1408))
# and layers of other top_k at the usual widths: the final combine reads k rows a token and the
# dispatch sends k copies, where every other in-layer layer has k = 2; the fits made at k = 2
# predict them as checks (a cost a token against one a row, the dispatch's reads of a token's row
# k times), their GEMM tasks are fitted
IN_LAYER_TOPK = (dict(tokens=6912, top_k=1), dict(tokens=3584, top_k=4), dict(tokens=1792, top_k=8))
IN_LAYERS = tuple(dict(tokens=t) for t in IN_LAYER_TOKENS) + (IN_LAYER_SHARING, *IN_LAYER_DEPTHS, *IN_LAYER_TOPK)
# on two GPUs, a layer whose GEMM1 tasks store half their tiles' rows into the peer (the tiles it
# sent) and half into their own GPU: 6144 tokens a GPU, a size no measured run uses
IN_LAYER_RETURN = dict(tokens=6144)


def flashmoe(world: int, dtype: str, **changes) -> Config:
    if dtype not in DTYPES:
        raise ValueError(f"dtype = {dtype!r} is not allowed: one of {', '.join(DTYPES)}")
    return cases.in_dtype(presets.get("flashmoe").replace(ranks=world, **changes), dtype)


def tile_options(dtype: str, world: int) -> dict[str, int]:
    """The compile-time options (tile shape, dtype) of `dtype`'s microbenchmark build."""
    return layout.compile_options(flashmoe(world, dtype))


def fit_layers(world: int, dtype: str) -> list[Config]:
    """The fit set: every layer whose in-kernel pieces the calibration measures and fits (the gate points,
    the scheduler's layers, the in-layer layers and the return layer), none of which the validation
    set (reference/validation_set.py) may hold."""
    changes = [dict(tokens=t, experts=e) for t, e in GATE_POINTS] + [SCHED_CONFIG, SCHED_SMALL, *IN_LAYERS]
    changes += [dict(tokens=t, experts=e, top_k=k) for t, e, k in GATE_TOPK_POINTS]
    changes += [dict(tokens=t, experts=e, top_k=k, **router) for t, e, k, router in GATE_ROUTER_POINTS]
    return [flashmoe(world, dtype, **c) for c in changes + ([IN_LAYER_RETURN] if world > 1 else [])]


def job_cases(world: int, dtype: str = "float32") -> list[dict]:
    """The layer configs this job allocates (gpu.spawn sizes NVSHMEM's heap from them)."""
    cfgs = [flashmoe(world, dtype, tokens=t, experts=e) for t, e in GATE_POINTS]
    cfgs += [flashmoe(world, dtype, tokens=t, experts=e, top_k=k) for t, e, k in GATE_TOPK_POINTS]
    cfgs += [flashmoe(world, dtype, **SCHED_CONFIG), flashmoe(world, dtype, **SCHED_SMALL),
             flashmoe(world, dtype, tokens=max(IN_LAYER_TOKENS)), flashmoe(world, dtype, **IN_LAYER_SHARING),
             *(flashmoe(world, dtype, **c) for c in IN_LAYER_DEPTHS)]
    return [{"name": f"layer-{i}", "config": c.to_dict()} for i, c in enumerate(cfgs)]


class Bench:
    """This rank's session, the microbenchmark kernels and the launch helpers."""

    def __init__(self, session: Session, dtype: str):
        import nvshmem.core as nvshmem
        import torch
        from cuda.core import ObjectCode
        from nvshmem.core import NvshmemKernelObject

        self.s, self.torch = session, torch
        self.dev = torch.device("cuda", session.local_rank)
        self.dtype, self.tile = dtype, tile_options(dtype, session.world)
        self.elem = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.elem_bytes = self.elem.itemsize
        built = build.build(self.tile, unit="microbench.cu")
        self.obj = ObjectCode.from_cubin(built.cubin.read_bytes())
        nvshmem.library_init(NvshmemKernelObject.from_obj(self.obj))
        self.k = {name: self.obj.get_kernel(name) for name in KERNELS}
        # every kernel gets the megakernel's dynamic shared memory, so all reach its occupancy
        self.smem_bytes = build.cubin_constant(built.cubin, layout.SMEM_SYMBOL)
        for k in self.k.values():
            allow_dynamic_smem(k, self.smem_bytes, session.device.device_id)
        threads = layout.block_threads(self.tile)
        self.per_sm = {name: k.occupancy.max_active_blocks_per_multiprocessor(threads, self.smem_bytes)
                       for name, k in self.k.items()}
        self.base = 0  # ping-pong signal values grow across launches

    def launch(self, name: str, grid: int, *args, cooperative: bool = False) -> None:
        from cuda.core import LaunchConfig, launch

        cfg = LaunchConfig(grid=grid, block=layout.block_threads(self.tile), shmem_size=self.smem_bytes,
                           is_cooperative=cooperative)
        launch(self.s.stream, cfg, self.k[name], *args)
        self.s.sync()

    def tensor_maps(self, a, w):
        """The warpgroup GEMM's TMA tensor maps (gpu/tma.py; bf16 and tf32x3 builds) with `a` as
        inbox, hidden and x and `w` as both w1 and w2, on the device (keep it while launches use it); None
        for the float32 build."""
        if self.dtype not in layout.WGMMA_PRECISIONS:
            return None
        block = tma.maps_block(tma.operand_specs(dict(inbox=a, hidden=a, w1=w, w2=w, x=a), self.tile["TILE_N"]))
        with self.torch.cuda.stream(self.s.torch_stream):
            return self.torch.from_numpy(block).to(self.dev)

    def zeros(self, *shape, dtype=None):
        with self.torch.cuda.stream(self.s.torch_stream):
            return self.torch.zeros(*shape, dtype=dtype or self.torch.int64, device=self.dev)

    def randn(self, *shape, scale=1.0, dtype=None):
        with self.torch.cuda.stream(self.s.torch_stream):
            return (self.torch.randn(*shape, device=self.dev) * scale).to(dtype or self.torch.float32)

    def clocks(self, t) -> np.ndarray:
        self.s.sync()
        return t.cpu().numpy().astype(np.float64)


def ptr(t) -> np.uint64:
    return np.uint64(t.data_ptr())


def stats(x: np.ndarray) -> dict:
    x = np.asarray(x, np.float64)
    return {"median": float(np.median(x)), "p10": float(np.percentile(x, 10)), "p90": float(np.percentile(x, 90)),
            "min": float(x.min()), "max": float(x.max()), "n": int(x.size)}


def sec_gemm(b: Bench, grid: int) -> list[dict]:
    """Tile GEMM tasks at 1 block and at the megakernel's grid; ns per task per block. Operands
    and output in the build's element type, biases float32 (as the megakernel takes them). Full
    tiles also at 1 and 8 tiles per expert (SHARING): the tiles of an expert share its weight
    slices, so the fewer there are, the more weight bytes each task loads from HBM."""
    experts, a_tiles, tm, tn = 64, 64, b.tile["TILE_M"], b.tile["TILE_N"]
    A = b.randn(a_tiles, tm, H, dtype=b.elem)
    W = b.randn(experts, H, I, scale=H ** -0.5, dtype=b.elem)
    bias = b.randn(experts, I, scale=0.1)
    out = b.zeros(a_tiles, tm, I, dtype=b.elem)
    ns = b.zeros(grid)
    maps = b.tensor_maps(A, W)
    maps_at = np.uint64(0 if maps is None else maps.data_ptr())
    rows_ = []
    points = [(1, tm, 2, 16), (1, 32, 2, 16)] + [(grid, r, 2, 4) for r in GEMM_ROWS] + \
        [(grid, tm, n, 4) for n in SHARING if n != 2] + [(grid, r, 1, 4) for r in SHORT_ALONE]
    for kind in (0, 1):
        b.launch("mb_gemm", grid, np.int32(kind), np.int32(0), ptr(A), np.int32(a_tiles), np.int32(tm), ptr(W),
                 ptr(bias), np.int32(experts), np.int32(2), np.int32(H), np.int32(I), ptr(out), np.int32(1),
                 maps_at, ptr(ns))  # warm-up
        for blocks, rows, sharing, reps in points:
            b.launch("mb_gemm", blocks, np.int32(kind), np.int32(0), ptr(A), np.int32(a_tiles), np.int32(rows),
                     ptr(W), ptr(bias), np.int32(experts), np.int32(sharing), np.int32(H), np.int32(I), ptr(out),
                     np.int32(reps), maps_at, ptr(ns))
            per_task = b.clocks(ns)[:blocks] / reps
            rows_.append({"task": ("gemm0", "gemm1")[kind], "blocks": blocks, "rows": rows, "k": H, "n": tn,
                          "flops": 2 * rows * H * tn, "tiles_per_expert": sharing,
                          "weight_bytes": H * tn * b.elem_bytes, "ns_per_task": stats(per_task)})
    return rows_


def sec_copy(b: Bench, grid: int) -> list[dict]:
    """copy_rows of one 128-row tile per block; bytes = rows x H x element bytes read and as many
    written; weighted (combine) copies only in float32, the only kernel that weights rows."""
    src_rows, rows, reps = 16384, 128, 4
    src = b.randn(src_rows, H, dtype=b.elem)
    dst = b.zeros(grid * rows * H, dtype=b.elem)
    scales = b.randn(grid * rows * reps)
    ns = b.zeros(grid)
    out = []
    for blocks in sorted({1, 4, 8, 16, 24, 32, 48, 64, 96, 128, grid}):  # 1 MiB each: across the L2
        for scaled in (False, True) if b.elem_bytes == 4 else (False,):  # float32 rows are weighted in a task
            b.launch("mb_copy", blocks, ptr(src), np.int32(src_rows), ptr(dst), np.int32(rows), np.int32(H),
                     ptr(scales) if scaled else np.uint64(0), np.int32(reps), ptr(ns))
            per = b.clocks(ns)[:blocks] / reps
            out.append({"blocks": blocks, "rows": rows, "bytes": rows * H * b.elem_bytes, "scaled": scaled,
                        "ns_per_copy": stats(per)})
    return out


def sec_copy_nvlink(b: Bench) -> list[dict] | None:
    """Rank 0's blocks gather 128-row tiles (copy_rows, as a dispatch share) straight into rank 1's
    memory through its NVSHMEM mapping; time per copy, without the fence that ends a share (its
    round trip, pingpong's). None on one GPU."""
    import nvshmem.core as nvshmem
    import nvshmem.core.interop.torch as symmetric

    s = b.s
    if s.world < 2:
        return None
    src_rows, rows, reps, most = 16384, 128, 4, max(COPY_NVLINK_BLOCKS)
    src = b.randn(src_rows, H, dtype=b.elem)
    ns = b.zeros(most)
    out = []
    with b.torch.cuda.stream(s.torch_stream):
        buf = symmetric.tensor((most * rows * H * b.elem_bytes // 4,), dtype=b.torch.float32)
    try:
        s.barrier()
        s.sync()
        if s.rank == 0:
            there = symmetric.get_peer_tensor(buf, 1)
            for blocks in COPY_NVLINK_BLOCKS:
                b.launch("mb_copy", blocks, ptr(src), np.int32(src_rows), ptr(there), np.int32(rows), np.int32(H),
                         np.uint64(0), np.int32(reps), ptr(ns))
                out.append({"peer": "nvlink", "blocks": blocks, "rows": rows, "bytes": rows * H * b.elem_bytes,
                            "ns_per_copy": stats(b.clocks(ns)[:blocks] / reps)})
        s.barrier()
        s.sync()
    finally:
        nvshmem.free_tensor(buf)
    return out


@contextlib.contextmanager
def symmetric_pair(b: Bench, shape: tuple[int, ...], signals: int):
    """A float32 symmetric buffer of `shape` and `signals` zeroed int64 signal words, freed on exit."""
    import nvshmem.core as nvshmem
    import nvshmem.core.interop.torch as symmetric

    with b.torch.cuda.stream(b.s.torch_stream):
        buf = symmetric.tensor(shape, dtype=b.torch.float32)
        sig = symmetric.tensor((signals,), dtype=b.torch.int64)
        sig.zero_()
    try:
        yield buf, sig
    finally:
        nvshmem.free_tensor(buf)
        nvshmem.free_tensor(sig)


def sec_put(b: Bench, grid: int) -> list[dict]:
    """Rank 0 puts (with signal) from every one of `blocks` blocks to itself and to rank 1."""
    s = b.s
    top = max(PUT_SIZES)
    ns = b.zeros(2 * grid)
    out = []
    peers = [0] + ([1] if s.world > 1 else [])
    with symmetric_pair(b, (2, grid * top // 4), grid) as (buf, sig):
        with b.torch.cuda.stream(s.torch_stream):
            buf.normal_()
        s.barrier()
        s.sync()
        if s.rank == 0:
            for peer in peers:
                for blocks in sorted({*PUT_BLOCKS, grid}):
                    for size in PUT_SIZES:
                        reps = 8
                        b.launch("mb_put", blocks, ptr(buf[1]), ptr(buf[0]), np.int64(size), ptr(sig), np.int32(reps),
                                 np.int32(peer), np.uint64(1), ptr(ns))
                        t = b.clocks(ns)[: 2 * blocks].reshape(blocks, 2)
                        out.append({"peer": "self" if peer == 0 else "nvlink", "blocks": blocks, "bytes": size,
                                    "reps": reps, "ns_per_put": stats(t[:, 1] / reps),
                                    "issue_ns_per_put": stats(t[:, 0] / reps),
                                    "aggregate_gbps": blocks * reps * size / float(t[:, 1].max())})
        s.barrier()
        s.sync()
    return out


def sec_pingpong(b: Bench) -> list[dict]:
    """Round trips between ranks 0 and 1: a bare signal (bytes 0) or a put with its signal."""
    s = b.s
    if s.world < 2:
        return []
    res = b.zeros(2)
    out = []
    with symmetric_pair(b, (max(PING_SIZES) // 4,), 1) as (buf, sig):
        for size in PING_SIZES:
            iters = 200 if size <= (64 << 10) else 50
            s.barrier()
            s.sync()
            b.launch("mb_pingpong", 1, ptr(buf), np.int64(size), ptr(sig), np.int32(iters), np.int32(s.rank),
                     np.int32(1 - s.rank), np.int32(0), np.uint64(b.base), np.int64(2_000_000_000), ptr(res))
            b.base += iters
            total, failed = b.clocks(res)
            out.append({"bytes": size, "iters": iters, "round_trip_ns": total / (iters - 1), "failed": bool(failed)})
        s.barrier()
        s.sync()
    return out


def gate_time(b: Bench, layer: Layer) -> tuple[float, int]:
    """Median over 3 launches of the gate phase's span (first block start to last block end),
    each after a 256 MiB write that evicts the tokens from L2, as a layer's other phases do."""
    grid = min(layer.grid, b.per_sm["mb_gate"] * b.s.sms)
    ns = b.zeros(2 * grid)
    flush = b.zeros(64 << 20, dtype=b.torch.float32)
    spans = []
    for i in range(4):
        with b.torch.cuda.stream(b.s.torch_stream):
            flush.fill_(float(i))
            layer._work32.zero_()  # the grid barrier's counter
            layer._work64.zero_()
        b.launch("mb_gate", grid, ptr(layer._params), ptr(ns), cooperative=True)
        t = b.clocks(ns).reshape(grid, 2)
        spans.append(t[:, 1].max() - t[:, 0].min())
    return float(np.median(spans[1:])), grid


def tlog_events(layer: Layer, kind: int) -> list[tuple[int, float, int, int]]:
    """(log, duration ns, peer, rows) of every logged event of `kind`."""
    tlog, counts = layer.telemetry_logs()
    out = []
    for log in range(len(counts)):
        for w0, w1, w2, _ in tlog[log, : min(int(counts[log]), tlog.shape[1])].tolist():
            if w2 & 0xFF == kind:
                out.append((log, float(w1 - w0), (w2 >> 24) & 0xFFFF, (w2 >> 40) & 0xFFFF))
    return out


def sec_layer_pieces(b: Bench, results: dict, save) -> None:
    """Gate over GATE_POINTS, GATE_TOPK_POINTS and GATE_ROUTER_POINTS; dispatch and combine on
    GATE_POINTS' 64-expert layers."""
    s = b.s
    results["gate"], results["dispatch"], results["combine"] = [], [], []
    points = ([(t, e, None, {}) for t, e in GATE_POINTS] + [(t, e, k, {}) for t, e, k in GATE_TOPK_POINTS]
              + list(GATE_ROUTER_POINTS))
    for tokens, experts, top_k, router in points:
        cfg = flashmoe(s.world, b.dtype, tokens=tokens, experts=experts, **({"top_k": top_k} if top_k else {}),
                       **router)
        pieces = top_k is None and experts == 64  # the dispatch and the combine at the FlashMoE default's k
        # the dispatch timed share by share, every chunk shared by the processors at once: the rate
        # the simulator's cost of a stored share is fitted to, whichever order a path gives them
        layer = Layer(s, cfg, Inputs.random(cfg, s.rank, seed=1), dispatch="store")
        try:
            results.setdefault("occupancy", {}).update(megakernel_grid=layer.grid, n_proc=layer.n_proc, sms=s.sms)
            ns, grid = gate_time(b, layer)
            results["gate"].append({"tokens": tokens, "experts": experts, "hidden": H, "top_k": cfg.top_k,
                                    "grid": grid, "ns": ns, "select": layout.GATE_SELECT,
                                    **{f: getattr(cfg, f) for f in ROUTER_FIELDS if f in router}})
            if pieces:
                layer.run()  # routing, counts and rows in place for dispatch and combine
                for _ in range(2):
                    with b.torch.cuda.stream(s.torch_stream):
                        layer._work32.zero_()  # telemetry counts
                    s.barrier()
                    s.sync()
                    b.launch("mb_dispatch", layer.n_proc, ptr(layer._params), np.int32(layer.n_proc))
                    s.barrier()
                    s.sync()
                    with b.torch.cuda.stream(s.torch_stream):
                        layer.buffers["sig_tile"].zero_()  # the chunks' counts (no subscriber reset them)
                    s.sync()
                    s.barrier()
                ev = tlog_events(layer, EV_DISPATCH)
                for where, sel in (("self", [e for e in ev if e[2] == s.rank]),
                                   ("nvlink", [e for e in ev if e[2] != s.rank])):
                    if sel:
                        results["dispatch"].append({
                            "tokens": tokens, "world": s.world, "peer": where,
                            "path": layer.dispatch,
                            "shares": len(sel),
                            "concurrent_blocks": min(len(ev), layer.n_proc),
                            "rows": stats([e[3] for e in sel]), "bytes_per_row": H * b.elem_bytes,
                            "ns_per_tile": stats([e[1] for e in sel]),
                            "ns_per_row": stats([e[1] / max(e[3], 1) for e in sel])})
            if pieces:  # the ordered combine at four layer sizes, the FlashMoE default's first
                with b.torch.cuda.stream(s.torch_stream):
                    layer._work32.zero_()
                b.launch("mb_combine", layer.grid, ptr(layer._params))
                ev = tlog_events(layer, EV_COMBINE)
                results["combine"].append({"tokens": tokens, "top_k": cfg.top_k, "hidden": H, "n_proc": layer.n_proc,
                                           "bytes_per_value": b.elem_bytes, "ns_per_block": stats([e[1] for e in ev])})
        finally:
            layer.close()
            b.torch.cuda.empty_cache()
        save()


def traced(b: Bench, changes: dict):
    """The megakernel's telemetry trace of the FlashMoE default with `changes`, and its processors."""
    s = b.s
    cfg = flashmoe(s.world, b.dtype, **changes)
    layer = Layer(s, cfg, Inputs.random(cfg, s.rank, seed=2))
    try:
        layer.run()
        s.line_up()  # the ranks start together: a late rank's count signals would delay every first task
        layer.run(telemetry=True)
        tb, _ = layer.trace_builder(layer.kernel_start_ns(), None)
        return cfg, tb.build(), layer.n_proc
    finally:
        layer.close()


def sec_scheduler(b: Bench) -> dict:
    """Hand-off gaps from the megakernel's own telemetry on a layer that no measured run uses, and
    the latencies around idle processors on a small one (start_and_stop)."""
    cfg, tr, n_proc = traced(b, SCHED_CONFIG)
    small_cfg, small, small_proc = traced(b, SCHED_SMALL)
    from sim.trace import KIND, ROLE

    proc = (tr["role"] == ROLE["processor"]) & np.isin(tr["kind"], [KIND["gemm0"], KIND["gemm1"]])
    gaps = []
    for lane in np.unique(tr["lane"][proc]):
        m = proc & (tr["lane"] == lane)
        order = np.argsort(tr["start"][m])
        st, en = tr["start"][m][order], tr["end"][m][order]
        gaps.extend((st[1:] - en[:-1]).tolist())
    sig = (tr["role"] == ROLE["subscriber"]) & (tr["kind"] == KIND["signal"])
    g0 = proc & (tr["kind"] == KIND["gemm0"])
    delays = []
    for t_sig, e, tile, peer in zip(tr["start"][sig], tr["expert"][sig], tr["tile"][sig], tr["peer"][sig]):
        m = g0 & (tr["expert"] == e) & (tr["tile"] == tile) & (tr["peer"] == peer)
        after = tr["start"][m] >= t_sig  # a returned tile's signal matches its own earlier GEMM0: not a delay
        if after.any():
            delays.append(float(tr["start"][m][after].min() - t_sig))
    dur = tr["end"][proc] - tr["start"][proc]
    return {"config": cfg.to_dict(), "tasks": int(proc.sum()), "n_proc": n_proc,
            "gap_ns": stats(gaps) if gaps else None, "arrival_to_first_task_ns": stats(delays) if delays else None,
            "task_ns": stats(dur) if dur.size else None,
            "idle": {"config": small_cfg.to_dict(), **start_and_stop(small, small_proc)}}


def sec_in_layer(b: Bench) -> list[dict]:
    """Rank 0's gate phase, dispatch shares, GEMM tasks, per-tile and final combines in the
    megakernel on each of IN_LAYERS (one GPU); on more GPUs, its GEMM tasks by their tiles' source
    and its staged senders' walks on IN_LAYER_RETURN (every rank runs the layer; rank 0's results
    are kept)."""
    from sim.trace import KIND, ROLE

    if b.s.world > 1:
        return [layer_returns(b)]
    out = []
    for changes in IN_LAYERS:
        cfg, tr, n_proc = traced(b, changes)
        tokens = cfg.tokens
        proc = (tr["rank"] == 0) & (tr["role"] == ROLE["processor"])
        disp = proc & (tr["kind"] == KIND["dispatch"])
        gate = proc & (tr["kind"] == KIND["gate"])  # the megakernel's gate phase, its start wait and barriers
        lanes, start, nbytes = tr["lane"][disp], tr["start"][disp], tr["bytes"][disp]
        dur = tr["end"][disp] - start
        # each processor's first share: the round that runs all at once
        first = [np.flatnonzero(lanes == q)[np.argmin(start[lanes == q])] for q in np.unique(lanes)]
        # the final combine of the blocks with the most tokens (warp w of block q takes tokens
        # q x warps + w, stepping by all processors' warps: processor.cuh combine_tokens)
        final = proc & (tr["kind"] == KIND["combine"]) & (tr["expert"] < 0)
        weighting = proc & (tr["kind"] == KIND["combine"]) & (tr["expert"] >= 0)
        warps = layout.block_threads(layout.compile_options(cfg)) // 32
        held = np.array([sum(len(range(q * warps + w, tokens, n_proc * warps)) for w in range(warps))
                         for q in tr["lane"][final]])
        most = held == held.max()
        out.append({"tokens": tokens, "experts": cfg.experts, "world": b.s.world, "n_proc": n_proc,
                    "top_k": cfg.top_k, "hidden": cfg.hidden, "ffn": cfg.ffn,
                    "bytes_per_value": b.elem_bytes, "gate_ns": stats(tr["end"][gate] - tr["start"][gate]),
                    "select": layout.GATE_SELECT,
                    "inflight_bytes": int(nbytes[first].sum()),
                    "first_round_shares": len(first), "share_bytes": stats(nbytes), "dispatch_ns": stats(dur),
                    "combine_tokens_per_block": int(held.max()),
                    "final_combine_ns": stats((tr["end"][final] - tr["start"][final])[most]),
                    "tile_combine_ns": stats(tr["end"][weighting] - tr["start"][weighting]),
                    "tile_combine_bytes": stats(tr["bytes"][weighting]),
                    "deal_walk": deal_walk(tr, proc, disp),
                    "signal_seen": signal_seen(cfg, tr, disp),
                    "enqueues": enqueues(tr, 0),
                    "gemm": layer_gemm_tasks(b, cfg, tr, proc, disp, n_proc)})
    return out


def enqueues(tr, rank: int) -> list[list[float]]:
    """[tasks, ns] of each expert's GEMM0 tasks queued together on `rank` by the subscriber lane that saw
    its last tile land (os.cuh enqueue_expert; the bf16 build queues by expert, the others log none)."""
    from sim.trace import KIND, ROLE

    m = (tr["rank"] == rank) & (tr["role"] == ROLE["subscriber"]) & (tr["kind"] == KIND["wait"])
    return [[int(n), float(e - s)] for n, s, e in zip(tr["tile"][m], tr["start"][m], tr["end"][m])]


def deal_walk(tr, proc: np.ndarray, disp: np.ndarray) -> dict:
    """Each block's turnaround before each of its dispatch shares, by the experts' row counts the
    kernel's deal read since (processor.cuh deal_chunks; one GPU deals every expert in order, one
    count each): before its first share ("first") from its gate's end, the counts of experts 0 ..
    its own; before each next ("next") from its share before, those after that share's expert up to
    its own. The medians for each number of counts read."""
    from sim.trace import KIND

    gate = proc & (tr["kind"] == KIND["gate"])
    loads, ns, first = [], [], []
    for q in np.unique(tr["lane"][disp]):
        mine = disp & (tr["lane"] == q)
        order = np.argsort(tr["start"][mine])
        start, end, expert = tr["start"][mine][order], tr["end"][mine][order], tr["expert"][mine][order]
        before = np.concatenate([[tr["end"][gate & (tr["lane"] == q)].max()], end[:-1]])
        loads.extend(np.diff(expert, prepend=-1).tolist())
        ns.extend((start - before).tolist())
        first.extend([True] + [False] * (len(start) - 1))
    loads, ns, first = np.array(loads), np.array(ns), np.array(first)

    def medians(m: np.ndarray) -> dict:
        counts = np.unique(loads[m])
        return {"loads": counts.tolist(), "ns": [float(np.median(ns[m & (loads == c)])) for c in counts],
                "n": [int((m & (loads == c)).sum()) for c in counts]}

    return {"first": medians(first), "next": medians(~first)}


def signal_seen(cfg: Config, tr, disp: np.ndarray) -> dict:
    """How long after a tile's last dispatch share ends the subscriber logs the tile's signal (one
    GPU: a tile and its chunk are an (expert, window); the first signal of each is its landing, a
    later one its return), and the entries its lanes watch (os.cuh subscriber: this GPU's tiles and
    its own returned chunks)."""
    from reference import plan_of
    from sim.costs import watched_entries
    from sim.trace import KIND, ROLE

    sig = (tr["rank"] == 0) & (tr["role"] == ROLE["subscriber"]) & (tr["kind"] == KIND["signal"])
    seen = {}
    for t, e, w in sorted(zip(tr["start"][sig], tr["expert"][sig], tr["tile"][sig])):
        seen.setdefault((int(e), int(w)), float(t))
    last = {}
    for t, e, w in zip(tr["end"][disp], tr["expert"][disp], tr["tile"][disp]):
        last[int(e), int(w)] = max(last.get((int(e), int(w)), -np.inf), float(t))
    waits = [seen[k] - t for k, t in last.items() if k in seen]
    return {"watched": watched_entries(cfg, plan_of(cfg), 0), "ns": stats(np.array(waits)) if waits else None}


def layer_returns(b: Bench) -> dict:
    """This rank's GEMM tasks on IN_LAYER_RETURN by their tile's source (returns_by_source), and the
    walks of its staged senders to their shares into the peers (deal_walk: on two GPUs a sender's
    list is the peer's experts in order, one count each, as one GPU's list is every expert)."""
    from sim.trace import KIND, ROLE

    cfg, tr, n_proc = traced(b, IN_LAYER_RETURN)
    proc = (tr["rank"] == b.s.rank) & (tr["role"] == ROLE["processor"])
    into_peers = proc & (tr["kind"] == KIND["dispatch"]) & (tr["peer"] != b.s.rank)
    return {"tokens": cfg.tokens, "experts": cfg.experts, "world": b.s.world, "n_proc": n_proc,
            **returns_by_source(cfg, tr, b.s.rank, b.elem_bytes), "peer_deal_walk": deal_walk(tr, proc, into_peers),
            "enqueues": enqueues(tr, b.s.rank)}


def returns_by_source(cfg: Config, tr, rank: int, elem_bytes: int) -> dict:
    """Rank `rank`'s GEMM tasks in trace `tr` by their tile's source (the trace's peer: its window's
    first), tiles of one source only: a GEMM1 task stores its output rows into the source's memory,
    over NVLink for the peer's tiles, while GEMM0 stores nothing away, so its two medians say how
    else the sources' tasks differ. A window reaching into the next source's slots (merged sources)
    may hold rows of both and is left out. The tiles' rows: those this rank dispatched (the peer's
    are alike: the same routing of random tokens)."""
    from sim.trace import KIND, ROLE

    one_source = (tr["tile"] + 1) * cfg.tile_m <= (tr["peer"] + 1) * source_stride(cfg)
    proc = (tr["rank"] == rank) & (tr["role"] == ROLE["processor"])
    rows = dispatched_rows(cfg, tr, proc & (tr["kind"] == KIND["dispatch"]), elem_bytes)
    if not rows:
        raise RuntimeError(f"rank {rank}: no dispatch shares in the {cfg.tokens}-token layer's trace")
    by_source = {}
    for task in ("gemm0", "gemm1"):
        sel = proc & (tr["kind"] == KIND[task]) & one_source
        d, far = tr["end"][sel] - tr["start"][sel], tr["peer"][sel] != rank
        if not far.any() or far.all():
            raise RuntimeError(f"rank {rank}: {task} tasks of {'no' if not far.any() else 'only'} peer tiles "
                               f"in the {cfg.tokens}-token layer's trace")
        by_source[task] = {"home": stats(d[~far]), "peer": stats(d[far])}
    return {"tile_n": cfg.tile_n, "bytes_per_value": elem_bytes, "tile_rows": stats(list(rows.values())),
            "gemm_by_source": by_source}


def dispatched_rows(cfg: Config, tr, disp: np.ndarray, elem_bytes: int) -> dict[tuple[int, int], int]:
    """Each tile's rows by (expert, tile), the sum of its dispatch shares (events `disp` of trace
    `tr`; traced() numbers tiles within their expert)."""
    rows: dict[tuple[int, int], int] = {}
    for t, e, nbytes in zip(tr["tile"][disp].tolist(), tr["expert"][disp].tolist(), tr["bytes"][disp].tolist()):
        rows[e, t] = rows.get((e, t), 0) + nbytes // (cfg.hidden * elem_bytes)
    return rows


def layer_gemm_tasks(b: Bench, cfg: Config, tr, proc: np.ndarray, disp: np.ndarray, n_proc: int) -> list[dict]:
    """A traced layer's GEMM tasks by (kind, tile rows, tiles of the expert), in sec_gemm's form: a
    tile's rows are its dispatch shares' rows, its expert's tiles the tiles its shares went to
    (rank 0's own tiles: on two GPUs the peer's arrive without rank 0's shares)."""
    from sim.trace import KIND

    rows_of = dispatched_rows(cfg, tr, disp, b.elem_bytes)
    tiles_of: dict[int, int] = {}
    for e, _ in rows_of:
        tiles_of[e] = tiles_of.get(e, 0) + 1
    out = []
    for task, k in (("gemm0", cfg.hidden), ("gemm1", cfg.ffn)):
        sel = proc & (tr["kind"] == KIND[task])
        groups: dict[tuple[int, int], list[float]] = {}
        for t, e, d in zip(tr["tile"][sel].tolist(), tr["expert"][sel].tolist(),
                           (tr["end"][sel] - tr["start"][sel]).tolist()):
            if (e, t) in rows_of:
                groups.setdefault((rows_of[e, t], tiles_of[e]), []).append(d)
        out += [{"tokens": cfg.tokens, "experts": cfg.experts, "task": task, "blocks": n_proc + 1, "rows": rows,
                 "k": k, "n": cfg.tile_n,
                 "flops": 2 * rows * k * cfg.tile_n, "tiles_per_expert": n,
                 "weight_bytes": k * cfg.tile_n * b.elem_bytes, "ns_per_task": stats(ds)}
                for (rows, n), ds in sorted(groups.items())]
    return out


def start_and_stop(tr, n_proc: int) -> dict:
    """Rank 0's latencies around its tasks with processors idle: from the first tile's signal (or
    its processor's last dispatch share, if later) to the first GEMM0 task; the spacing of the
    first n_proc GEMM0 starts once every processor has dispatched (the scheduler's turn per
    task handed out); from the last task's end to each processor's final combine."""
    from sim.trace import KIND, ROLE

    rank0 = tr["rank"] == 0
    proc = rank0 & (tr["role"] == ROLE["processor"])
    kind, lane, start, end = tr["kind"], tr["lane"], tr["start"], tr["end"]
    disp, g0 = proc & (kind == KIND["dispatch"]), proc & (kind == KIND["gemm0"])
    sig = rank0 & (tr["role"] == ROLE["subscriber"]) & (kind == KIND["signal"])
    out = {}
    if g0.any() and disp.any() and sig.any():
        first = np.flatnonzero(g0)[np.argmin(start[g0])]
        same = sig & (tr["expert"] == tr["expert"][first]) & (tr["tile"] == tr["tile"][first])
        ready = max(start[same].min() if same.any() else start[sig].min(),
                    end[disp & (lane == lane[first])].max(initial=0.0))
        out["first_task_ns"] = float(start[first] - ready)
        # the first round once every processor has dispatched: each start waits for the scheduler's turn
        after = np.sort(start[g0 & (start >= end[disp].max())])[:n_proc]
        if after.size >= n_proc // 2:
            out["assign_ns_per_task"] = float((after[-1] - after[0]) / (after.size - 1))
    comb = proc & (kind == KIND["combine"])
    finals = [np.flatnonzero(comb & (lane == q))[np.argmax(start[comb & (lane == q)])] for q in np.unique(lane[comb])]
    if finals:
        tasks = proc & ~np.isin(np.arange(kind.size), finals) & (kind != KIND["gate"]) & (kind != KIND["dispatch"])
        if tasks.any():
            out["stop_ns"] = stats(start[finals] - end[tasks].max())
    return out


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    job = json.loads(Path(argv[0]).read_text())
    # the build (DTYPES): the GEMM precision, so that a tf32x3 job runs its own build, not float32's
    dtype = Config.from_dict(job["cases"][0]["config"]).precision
    wanted = set(job.get("sections", SECTIONS))
    session = Session.start()
    results: dict = {"gpu": session.name, "sms": session.sms, "world": session.world, "dtype": dtype,
                     "tile": tile_options(dtype, session.world), "failed": {}}

    def save() -> None:
        if session.rank == 0:
            (out_dir / "results.json").write_text(json.dumps(results, separators=(",", ":")))

    bench = Bench(session, dtype)
    sections = [("layer_pieces", lambda: sec_layer_pieces(bench, results, save)),
                ("gemm", lambda: sec_gemm(bench, grid)), ("copy", lambda: sec_copy(bench, grid)),
                ("put", lambda: sec_put(bench, grid)), ("pingpong", lambda: sec_pingpong(bench)),
                ("scheduler", lambda: sec_scheduler(bench)), ("in_layer", lambda: sec_in_layer(bench)),
                ("copy_nvlink", lambda: sec_copy_nvlink(bench))]
    for name, run in sections:
        if name not in wanted or (dtype != "float32" and name in BYTE_SECTIONS):
            continue
        t0 = time.perf_counter()
        # the megakernel's grid where layer_pieces has run, else as many blocks as fit (sections run alone)
        grid = results.get("occupancy", {}).get("megakernel_grid") or bench.per_sm["mb_gemm"] * session.sms
        try:
            got = run()
            if got is not None:
                results[name] = got
        except Exception as e:  # recorded; the next sections still run
            results["failed"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
            print(f"[rank {session.rank}] section {name} failed: {e}", file=sys.stderr, flush=True)
        results.setdefault("occupancy", {})["microbench_blocks_per_sm"] = bench.per_sm
        results.setdefault("seconds", {})[name] = time.perf_counter() - t0
        print(f"[rank {session.rank}] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        save()
    session.close()
    return 0


def collect(gpus: int, out_dir: str | Path, timeout_s: float = 400.0, dtype: str = "float32",
            sections: tuple[str, ...] = SECTIONS) -> dict:
    """Run `dtype`'s microbenchmarks (those of `sections`) on `gpus` GPUs of this host; rank 0's results."""
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"sections = {unknown} are not allowed: names among {', '.join(SECTIONS)}")
    return spawn.run(job_cases(gpus, dtype), gpus, out_dir, timeout_s=timeout_s, module="gpu.microbench",
                     job_fields={"sections": list(sections)})


if __name__ == "__main__":
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    sys.exit(main(sys.argv[1:]))
