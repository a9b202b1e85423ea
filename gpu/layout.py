"""What the megakernel supports (float32 on CUDA cores or, with tf32, on TF32 tensor cores or, with
tf32x3, on TF32 tensor cores at float32's accuracy; bfloat16 on tensor cores), its buffers' sizes,
its arguments.

All sizes derive from the `Config` (never ad hoc): the slots C per (source rank, expert) block
are `cfg.slots`; a local expert's tiles are W windows over its P sources' slots and a block is cut
into at most CH chunks (reference/plan.py, kernels/tiles.cuh); one task queue slot per task the
layer call can make. The argument block's field order is read from kernels/params.cuh, the
one place it is defined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reference import Config, ConfigError, plan, weights
from reference.config import ACTIVATIONS as ALL_ACTIVATIONS
from reference.config import DTYPE_BYTES
from reference.config import GATES as ALL_GATES
from sim import costs
from sim.trace import KINDS

KERNEL_DIR = Path(__file__).parent / "kernels"
ACTIVATIONS = ("relu", "gelu_tanh", "gelu", "silu")  # those the kernel computes alone (act_kind)
GATED = ("swiglu", "swiglu_oai")  # the gated activations: the build's MOE_GATED, their code (params.cuh)
COMBINE_LANES = 32  # a token's routed choices and shared experts, one warp lane each (processor.cuh combine_tokens)
RAGGED_MULTIPLE = 64  # H and I need not be multiples of tile_n where they are of this (16-byte rows, 4-column stores)
WARPGROUP_THREADS = 128  # a block is one warpgroup, or two for the bf16 128 x 256 tile (warpgroups())
OS_WARPS = 4  # the OS block's logs: scheduler warp, then 3 subscriber warps
MAX_PROCESSORS = 32 * 12  # the scheduler warp keeps 12 processors per lane in registers (os.cuh SCHED_GROUPS)
MAILBOX_SLOTS = 2  # tasks a processor may hold, the running one and the next (os.cuh MAILBOX_SLOTS)
GATE_TOKENS, GATE_MAX_SPLITS = costs.GATE_TOKENS, costs.GATE_MAX_SPLITS  # tokens per gate item, most blocks on its H
MAX_TOP_K = 16  # top_k, at most (gate.cuh gate_select takes 8 choices a round)
# how the gate selects top-k (gate.cuh gate_select), as the simulator names it (sim.costs.GATE_SELECTS):
# recorded with every measured run and gate microbenchmark
GATE_SELECT = "lists"
MAX_GROUPS = 32  # n_group of group-limited top-k (gate.cuh GATE_MAX_GROUPS: a bit each in a mask)
MAX_TILE_SOURCES = 8  # sources one tile window may span: its GEMM1 tasks' destination table (processor.cuh)
STAGED_BLOCKS = costs.STAGED_BLOCKS  # processors that send the peers' chunks on the staged dispatch
TLOG_CAP = 1024  # events per telemetry log; more are counted and reported, not stored
ELEM_BYTES = DTYPE_BYTES  # tokens, expert weights and the rows moved, by Config.dtype
MIN_BLOCKS_PER_SM = 2  # __launch_bounds__ minimum of one-warpgroup blocks (the kernels' default): 2 per SM
CLOCK_SYNC = "moelab_clock_sync"  # the cubin's kernel that puts the ranks' clocks on one axis
SMEM_SYMBOL = "moelab_smem_bytes"  # the kernel's dynamic shared memory per block, a constant in the cubin
# H100/H200: 228 KiB of shared memory per SM, of which the driver keeps 1 KiB per resident block;
# 1 KiB more is left for the kernel's own __shared__ variables (24 B in the bf16 build, ptxas -v)
SMEM_PER_SM = 228 * 1024
WGMMA_PRECISIONS = ("bfloat16", "tf32x3")  # GEMM precisions of the warpgroup tile GEMM (tile_gemm_wgmma.cuh)
SLICE_BYTES = 128  # a wgmma slice row: the 128-byte swizzle line (64 bf16, 32 float32)
TF32X3_LO_BUFFERS = 2  # stage-sized copies the split TF32 GEMM writes its operands' lo parts into
TF32X3_TILE_N = (128, 256)  # two warpgroups of wgmma.m64nNk8 columns, N of 64 or 128
BF16_MAX_STAGES = 8  # TMA stages of the tensor-core tile GEMM, at most (seven slices copied ahead)
BF16_MIN_STAGES = 3  # two slices of copies in flight while the wgmmas of one finish and the next run
BF16_ALIGN_BYTES = 1024  # the swizzled stages start on a 1024-byte boundary of the dynamic shared memory
BF16_MAX_ACC = 128  # float32 accumulators per thread, tile_m x tile_n / block threads: the whole tile in registers
BF16_TILE_N = (32, 64, 128, 256)  # wgmma.m64nNk16 shapes the kernel spells out, N <= 128 per wgmma
BF16_WIDE_TILE_N = 256  # split over warpgroups (kernels/tile_gemm_wgmma.cuh), one block per SM
BF16_MAX_THREADS = 384  # 65536 registers over a block's threads: 168 each, 128 accumulators and the rest
TF32_STAGES = 3  # cp.async stages of the TF32 tile GEMM (Tf32TileGemm::STAGES)
TF32_MAX_TILE_M = 128  # 2 mma row tiles per warp: at 256 rows the TF32 kernel spills registers (ptxas -v)
TF32_MAX_ACC = 128  # accumulator floats per thread, tile_m x tile_n / 128 threads: more spill
STATIC_SMEM_BYTES = 48 * 1024  # the TF32 tile GEMM keeps its stages within what static memory could hold


def tile_sources(cfg: Config) -> int:
    """The most source ranks one tile window spans (reference/plan.py windows)."""
    return min(cfg.ranks, -(-cfg.tile_m // plan.source_stride(cfg)) + 1)


class UnsupportedConfig(ConfigError):
    """A valid config the kernel cannot run (yet)."""


def warpgroups(cfg: Config) -> int:
    """Warpgroups per block, sharing each slice in one block per SM, for the bf16 tile
    BF16_WIDE_TILE_N wide: two of half its columns up to 128 rows, else one per 64 rows (each
    all the columns: 192 x 256 as three of 64 x 256, kernels/tile_gemm_wgmma.cuh); two for every
    tf32x3 tile, whose stages and lo parts take most of an SM's shared memory and whose split
    wants the threads; else one (two blocks per SM)."""
    if cfg.precision == "tf32x3":
        return 2
    if cfg.dtype != "bfloat16" or cfg.tile_n != BF16_WIDE_TILE_N:
        return 1
    return 2 if cfg.tile_m <= 128 else cfg.tile_m // 64


def blocks_per_sm(cfg: Config) -> int:
    """The launch bounds' blocks per SM: MIN_BLOCKS_PER_SM of one warpgroup, one of several."""
    return max(1, MIN_BLOCKS_PER_SM // warpgroups(cfg))


def block_threads(options: dict[str, int]) -> int:
    """Threads per block of the kernels built with `options` (compile_options)."""
    return WARPGROUP_THREADS * options.get("BLOCK_WARPGROUPS", 1)


def smem_per_block(cfg: Config) -> int:
    """Dynamic shared memory a block may take: its share of the SM at the launch bounds' blocks
    per SM, less the 1 KiB the driver keeps and 1 KiB of the kernel's own __shared__ variables."""
    return SMEM_PER_SM // blocks_per_sm(cfg) - 2 * 1024


def check_supported(cfg: Config) -> None:
    """Raise UnsupportedConfig naming the first field the kernel does not support."""
    if cfg.activation not in ACTIVATIONS + GATED:
        raise UnsupportedConfig("activation", cfg.activation, "one of " + ", ".join(ACTIVATIONS + GATED))
    if cfg.top_k + cfg.shared_experts > COMBINE_LANES:
        raise UnsupportedConfig("shared_experts", cfg.shared_experts, f"at most {COMBINE_LANES} - top_k = "
                                f"{COMBINE_LANES - cfg.top_k} (the combine takes a token's choices one warp lane each)")
    for name in ("hidden", "ffn"):
        v = getattr(cfg, name)
        if v % cfg.tile_n and v % RAGGED_MULTIPLE:
            raise UnsupportedConfig(name, v, f"a multiple of tile_n = {cfg.tile_n} or of {RAGGED_MULTIPLE} (a ragged "
                                    "last column block stores whole 16-byte groups)")
    if cfg.gated and cfg.precision == "float32" and cfg.tile_n % 16:
        raise UnsupportedConfig("tile_n", cfg.tile_n, f"a multiple of 16 for float32 with activation = "
                                f"{cfg.activation!r} (each thread holds a gate column beside its up column)")
    if cfg.top_k > MAX_TOP_K:
        raise UnsupportedConfig("top_k", cfg.top_k, f"at most {MAX_TOP_K}")
    if cfg.n_group > MAX_GROUPS:
        raise UnsupportedConfig("n_group", cfg.n_group, f"at most {MAX_GROUPS}")
    if cfg.dtype == "bfloat16":
        _check_tensor_core_tiles(cfg)
    elif cfg.precision == "tf32x3":
        _check_tf32x3_tiles(cfg)
    elif cfg.precision == "tf32":
        _check_tf32_tiles(cfg)
    elif cfg.tile_m % 16 or cfg.tile_m > 1024:
        raise UnsupportedConfig("tile_m", cfg.tile_m, "a multiple of 16, at most 1024 (16 row groups of threads)")
    if cfg.tile_n % 8:
        raise UnsupportedConfig("tile_n", cfg.tile_n, "a multiple of 8 (8 column groups of threads)")
    if cfg.tile_k % 4:
        raise UnsupportedConfig("tile_k", cfg.tile_k, "a multiple of 4 (16-byte loads)")
    if cfg.ranks * plan.source_stride(cfg) + cfg.tile_m >= 2**30:
        raise UnsupportedConfig("tokens", cfg.tokens, f"fewer: a local expert's {cfg.ranks} x "
                                f"{plan.source_stride(cfg)} slot positions must stay below 2**30 (kernels/tiles.cuh)")
    s = Sizes.of(cfg)
    if (s.L * s.W + s.E * s.CH) * (MAX_TILE_SOURCES + 1) >= 2**31:
        raise UnsupportedConfig("tokens", cfg.tokens, f"fewer: the subscriber's {s.L * s.W} tile windows and "
                                f"{s.E * s.CH} chunk slots must stay below 2**31 / {MAX_TILE_SOURCES + 1} "
                                "(kernels/os.cuh)")
    if cfg.merge_sources and tile_sources(cfg) > MAX_TILE_SOURCES:
        raise UnsupportedConfig("merge_sources", cfg.merge_sources, f"false here: with {cfg.slots} slots per "
                                f"source, a tile of {cfg.tile_m} rows would span {tile_sources(cfg)} source ranks, "
                                f"more than the kernel's {MAX_TILE_SOURCES}")
    if cfg.experts > 0xFFFF:
        raise UnsupportedConfig("experts", cfg.experts, "at most 65535 (telemetry packs 16 bits)")


def _check_tensor_core_tiles(cfg: Config) -> None:
    """The bf16 tile GEMM's shape (kernels/tile_gemm_wgmma.cuh, WgmmaTileGemm): wgmma.m64nNk16 per 64
    rows and N <= 128 columns, the tile split over the block's warpgroups (warpgroups()), the whole
    tile's accumulators in registers (_bf16_registers_fit), slices of K
    64 deep (one 128-byte swizzled line per row), and at least BF16_MIN_STAGES TMA stages in a
    block's shared memory (less the 1 KiB the stages' 1024-byte alignment may take). (hidden and
    ffn are multiples of tile_n, so every bf16 row and column block starts on 16 bytes, as the
    16-byte copies need.)"""
    if cfg.tile_m % 64 or cfg.tile_m > 256:
        raise UnsupportedConfig("tile_m", cfg.tile_m, "64, 128, 192 or 256 for bfloat16 (64-row wgmma blocks)")
    if cfg.tile_n not in BF16_TILE_N:
        raise UnsupportedConfig("tile_n", cfg.tile_n, "32, 64, 128 or 256 for bfloat16 (the wgmma widths the kernel "
                                "has, 256 split over warpgroups)")
    if not _bf16_registers_fit(cfg):
        fits = [n for n in BF16_TILE_N if _bf16_registers_fit(cfg.replace(tile_n=n))]
        raise UnsupportedConfig("tile_n", cfg.tile_n, f"for bfloat16 with tile_m = {cfg.tile_m}, one of {fits} "
                                f"(at most {BF16_MAX_ACC} accumulators per thread, {BF16_MAX_THREADS} threads a block)")
    if cfg.tile_k != SLICE_BYTES // ELEM_BYTES["bfloat16"]:
        raise UnsupportedConfig("tile_k", cfg.tile_k, "64 for bfloat16 (a slice row is the 128 bytes of wgmma's "
                                "swizzled layout)")
    if wgmma_stages(cfg) < BF16_MIN_STAGES:
        need = BF16_MIN_STAGES * wgmma_stage_bytes(cfg) + BF16_ALIGN_BYTES
        raise UnsupportedConfig("tile_k", cfg.tile_k, f"for bfloat16, small enough that {BF16_MIN_STAGES} TMA "
                                f"stages of {cfg.tile_m} x {cfg.tile_n} x {cfg.tile_k} tiles fit "
                                f"{smem_per_block(cfg)} B of shared memory per block (need {need} B)")


def _check_tf32x3_tiles(cfg: Config) -> None:
    """The split TF32 tile GEMM's shape (kernels/tile_gemm_wgmma.cuh, Tf32x3Operands): the bf16
    GEMM's warpgroup tiling with two warpgroups of half the columns each (wgmma.m64nNk8, N of 64 or
    128), slices 32 floats deep, and BF16_MIN_STAGES stages with the lo parts' TF32X3_LO_BUFFERS
    copies in a block's shared memory (which leaves 128 x 256 out: its 128 accumulators a thread,
    and as many for a slice's own sum, would not fit the registers either)."""
    if cfg.tile_m not in (64, 128):
        raise UnsupportedConfig("tile_m", cfg.tile_m, "64 or 128 for tf32x3 (64-row wgmma blocks, two warpgroups "
                                "of half the columns each)")
    if cfg.tile_n not in TF32X3_TILE_N:
        raise UnsupportedConfig("tile_n", cfg.tile_n, "128 or 256 for tf32x3 (two warpgroups of 64 or 128 columns)")
    if cfg.tile_k != SLICE_BYTES // 4:
        raise UnsupportedConfig("tile_k", cfg.tile_k, "32 for tf32x3 (a slice row is the 128 bytes of wgmma's "
                                "swizzled layout)")
    if wgmma_stages(cfg) < BF16_MIN_STAGES:
        need = (BF16_MIN_STAGES + TF32X3_LO_BUFFERS) * wgmma_stage_bytes(cfg) + BF16_ALIGN_BYTES
        raise UnsupportedConfig("tile_n", cfg.tile_n, f"for tf32x3, small enough that {BF16_MIN_STAGES} TMA stages "
                                f"and {TF32X3_LO_BUFFERS} copies for the lo parts of {cfg.tile_m} x {cfg.tile_n} x "
                                f"{cfg.tile_k} float tiles fit {smem_per_block(cfg)} B of shared memory per block "
                                f"(need {need} B)")


def _bf16_registers_fit(cfg: Config) -> bool:
    """The tile's accumulators in its block's registers (BF16_MAX_ACC a thread, BF16_MAX_THREADS
    threads at most)."""
    threads = WARPGROUP_THREADS * warpgroups(cfg)
    return cfg.tile_m * cfg.tile_n <= BF16_MAX_ACC * threads and threads <= BF16_MAX_THREADS


def wgmma_stage_bytes(cfg: Config) -> int:
    """Shared memory of one TMA stage of the warpgroup tile GEMM (WgmmaTileGemm::STAGE_BYTES): the
    A slice (tile_m rows) and the B slice (tile_n rows of the K-major weights), tile_k deep, unpadded
    (wgmma's swizzled layout has no bank conflicts to pad away)."""
    return ELEM_BYTES[cfg.dtype] * (cfg.tile_m + cfg.tile_n) * cfg.tile_k


def _lo_buffers(cfg: Config) -> int:
    return TF32X3_LO_BUFFERS if cfg.precision == "tf32x3" else 0


def wgmma_stages(cfg: Config) -> int:
    """TMA stages of the warpgroup tile GEMM: as many as fit a block's shared memory beside the
    split GEMM's lo parts (tf32x3) and the stages' alignment room (BF16_ALIGN_BYTES), at most
    BF16_MAX_STAGES (passed to the build as GEMM_STAGES)."""
    fit = (smem_per_block(cfg) - BF16_ALIGN_BYTES) // wgmma_stage_bytes(cfg) - _lo_buffers(cfg)
    return min(BF16_MAX_STAGES, fit)


def wgmma_smem_bytes(cfg: Config) -> int:
    """The warpgroup tile GEMM's shared memory (WgmmaTileGemm::SMEM_BYTES): its stages, the lo
    parts' copies, and the room to start them on a 1024-byte boundary, where the swizzle pattern
    starts."""
    return (wgmma_stages(cfg) + _lo_buffers(cfg)) * wgmma_stage_bytes(cfg) + BF16_ALIGN_BYTES


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def _check_tf32_tiles(cfg: Config) -> None:
    """The TF32 tile GEMM's shape (gpu/kernels/tile_gemm_tf32.cuh): 4 warps stacked along M, each
    one or two 16-row mma tiles; 8-wide mma tiles along N and 8-deep steps along K, each thread
    copying the same 16-byte column of every slice (powers of two); its accumulators within the
    registers; its cp.async stages within a block's static shared memory; and a tile's rows times
    the row length within the 32-bit offsets the copies use."""
    if cfg.tile_m % 64 or cfg.tile_m > TF32_MAX_TILE_M:
        raise UnsupportedConfig("tile_m", cfg.tile_m, "64 or 128 for tf32 (4 warps of 16-row mma tiles; 256 rows "
                                "spill registers)")
    for name in ("tile_n", "tile_k"):
        v = getattr(cfg, name)
        if not 8 <= v <= 512 or not _power_of_two(v):
            raise UnsupportedConfig(name, v, "a power of two from 8 to 512 for tf32 (the mma's 8 columns and "
                                    "8-deep steps; every thread copies the same column of each slice)")
    if cfg.tile_m * cfg.tile_n > TF32_MAX_ACC * WARPGROUP_THREADS:
        raise UnsupportedConfig("tile_n", cfg.tile_n, f"at most {TF32_MAX_ACC * WARPGROUP_THREADS // cfg.tile_m} for "
                                f"tf32 with tile_m = {cfg.tile_m} ({TF32_MAX_ACC} accumulators per thread; more spill)")
    b_ld = cfg.tile_n if (cfg.tile_n // 8) % 2 else cfg.tile_n + 8  # Tf32TileGemm::A_LD, B_LD: bank padding
    smem = TF32_STAGES * 4 * (cfg.tile_m * (cfg.tile_k + 4) + cfg.tile_k * b_ld)
    if smem > STATIC_SMEM_BYTES - 1024:
        raise UnsupportedConfig("tile_k", cfg.tile_k, f"for tf32, small enough that {TF32_STAGES} stages of "
                                f"{cfg.tile_m} x {cfg.tile_n} float tiles fit 47 KiB of shared memory (need {smem} B)")
    if cfg.tile_m * max(cfg.hidden, cfg.ffn) >= 2**31:
        raise UnsupportedConfig("tile_m", cfg.tile_m, f"for tf32, below 2**31 / {max(cfg.hidden, cfg.ffn)} (the "
                                "tile GEMM's copies use 32-bit offsets into a tile's rows)")


@dataclass(frozen=True)
class Sizes:
    """Run-time sizes of one rank's buffers for `cfg`."""

    T: int
    H: int
    I: int  # noqa: E741  (the FFN dim's usual name)
    E: int
    K: int
    P: int
    L: int
    C: int
    W: int  # tile windows per local expert
    CH: int  # chunk slots per (source, expert) block
    stride: int  # positions between two sources' slots in a window
    n0: int  # GEMM0 tasks per tile
    n1: int  # GEMM1 tasks per tile
    queue_cap: int
    elem_bytes: int  # of tokens, expert weights and the moved rows
    S: int = 0  # shared experts
    WS: int = 0  # tile windows per shared expert, over the rank's T tokens

    @classmethod
    def of(cls, cfg: Config) -> Sizes:
        stride, ch = plan.source_stride(cfg), plan.chunk_slots(cfg)
        w = -(-cfg.ranks * stride // cfg.tile_m)
        # the plan's column blocks (a gated GEMM0 task: tile_n of W1's interleaved gate and up columns,
        # tile_n / 2 of I)
        n0, n1 = plan.column_blocks(cfg, plan.GEMM0), plan.column_blocks(cfg, plan.GEMM1)
        e, L, S = cfg.experts, cfg.local_experts, cfg.shared_experts
        ws = -(-cfg.tokens // cfg.tile_m)
        return cls(T=cfg.tokens, H=cfg.hidden, I=cfg.ffn, E=e, K=cfg.top_k, P=cfg.ranks, L=L, C=cfg.slots,
                   W=w, CH=ch, stride=stride, n0=n0, n1=n1, queue_cap=(L * w + S * ws) * (n0 + n1) + e * ch,
                   elem_bytes=ELEM_BYTES.get(cfg.dtype, 4), S=S, WS=ws)

    @property
    def owner_rows(self) -> int:
        """Rows of inbox and outbuf: a slot for every (local expert, source) block's C rows, L x P x C
        = E x C, so a source stores into its block with no handshake (kernels/tiles.cuh)."""
        return self.E * self.C

    @property
    def source_rows(self) -> int:
        """Rows of staging and combox: the rows this rank sends and gets back, one per kept (token,
        choice), packed expert by expert (params.cuh count_base): T k at most, E x C where fewer."""
        return min(self.T * self.K, self.E * self.C)

    @property
    def symmetric_bytes(self) -> int:
        """NVSHMEM heap one layer takes on each rank: inbox and outbuf (owner_rows of H elements),
        staging and combox (source_rows), and the signals."""
        return 2 * self.elem_bytes * self.H * (self.owner_rows + self.source_rows) + 8 * self.signal_words

    @property
    def working_bytes(self) -> int:
        """Device memory of the layer's own buffers beside the heap (runtime.Layer), at most: y and
        the gate's outputs per token, the slots' rows, GEMM0's output (hidden), the shared experts'
        output, the gate's partial logits at most splits, the task queue and the telemetry logs."""
        items = -(-self.T // GATE_TOKENS)
        per_token = self.H * 4 + self.E * 8 * (1 + GATE_MAX_SPLITS) + self.K * (4 + 8 + 4)
        rows = self.owner_rows * 12 + (self.owner_rows + self.S * self.T) * self.I * self.elem_bytes
        return (self.T * per_token + rows + self.S * self.T * self.H * self.elem_bytes
                + self.E * (4 + 4 + self.K * items * 4) + self.queue_cap * 20
                + (MAX_PROCESSORS + OS_WARPS) * TLOG_CAP * 32)

    @property
    def signal_slices(self) -> dict[str, tuple[int, int]]:
        """[start, end) of each signal array in the signal words (params.cuh order): sig_count (E),
        sig_tile (L x W), sig_comb (E x CH), sig_start (P), sig_base (E)."""
        sizes = {"sig_count": self.E, "sig_tile": self.L * self.W, "sig_comb": self.E * self.CH, "sig_start": self.P,
                 "sig_base": self.E}
        out, at = {}, 0
        for name, n in sizes.items():
            out[name] = (at, at + n)
            at += n
        return out

    @property
    def signal_words(self) -> int:
        """All of them: where the last array ends."""
        return self.signal_slices["sig_base"][1]


def weight_copy_bytes(cfg: Config) -> int:
    """The expert weights the layer copies for the kernel beside its inputs (runtime.kernel_weights):
    W1 and W2 K-major for the warpgroup GEMM; else W1 interleaved where gated and both with the shared
    experts' appended where there are some, and padded where ragged."""
    per_expert = cfg.hidden * (gemm0_cols(cfg) + cfg.ffn)
    n = cfg.local_experts + cfg.shared_experts
    copied = cfg.precision in WGMMA_PRECISIONS or cfg.gated or cfg.shared_experts or ragged(cfg)
    return n * per_expert * ELEM_BYTES[cfg.dtype] if copied else 0


def input_bytes(cfg: Config) -> int:
    """One rank's inputs (runtime.Inputs): its tokens, the gate's weights and biases, and its local and
    shared experts' weights and biases."""
    n, i1 = cfg.local_experts + cfg.shared_experts, gemm0_cols(cfg)
    experts = n * (cfg.hidden * (i1 + cfg.ffn) * ELEM_BYTES[cfg.dtype] + (i1 + cfg.hidden) * 4)
    return cfg.tokens * cfg.hidden * ELEM_BYTES[cfg.dtype] + cfg.experts * (cfg.hidden * 4 + 3 * 8) + experts


def layer_bytes(cfg: Config) -> int:
    """Device memory one rank's layer takes beside its inputs: the NVSHMEM heap, the working buffers
    and the weight copies."""
    s = Sizes.of(cfg)
    return s.symmetric_bytes + s.working_bytes + weight_copy_bytes(cfg)


KERNELS = {"float32": ("moelab_moe_fp32", {}), "bfloat16": ("moelab_moe_bf16", {"MOE_BF16": 1}),
           "tf32": ("moelab_moe_tf32", {"MOE_TF32": 1}),
           "tf32x3": ("moelab_moe_tf32x3", {"MOE_TF32X3": 1})}  # by Config.precision: name, -D flags


def gemm0_cols(cfg: Config) -> int:
    """GEMM0's output columns, W1's: 2I where gated (the kernel takes the gate and up columns
    interleaved, runtime.interleave_gated), else I."""
    return weights.ffn_in_width(cfg)


def ragged(cfg: Config) -> bool:
    """Whether a GEMM's last column block is narrower than tile_n."""
    return bool(cfg.hidden % cfg.tile_n or gemm0_cols(cfg) % cfg.tile_n)


def compile_options(cfg: Config) -> dict[str, int]:
    """The compile-time part of a config: the tile shape and the GEMM precision (one cubin per pair),
    the warpgroup tile GEMM's stages, and a block of several warpgroups (one per SM) where warpgroups() says;
    the layer's features that change a task (params.cuh MOE_GATED, MOE_SHARED, MOE_SCALE_BEFORE, MOE_RAGGED),
    each only where the layer has it, so the others build as before."""
    opts = {"TILE_M": cfg.tile_m, "TILE_N": cfg.tile_n, "TILE_K": cfg.tile_k, **KERNELS[cfg.precision][1]}
    features = {"MOE_GATED": ALL_ACTIVATIONS.index(cfg.activation) if cfg.activation in GATED else 0,
                "MOE_SHARED": int(cfg.shared_experts > 0),
                "MOE_SCALE_BEFORE": int(cfg.scale_before_expert), "MOE_RAGGED": int(ragged(cfg))}
    opts.update({k: v for k, v in features.items() if v})
    if cfg.precision in WGMMA_PRECISIONS:
        opts["GEMM_STAGES"] = wgmma_stages(cfg)
    if warpgroups(cfg) > 1:
        opts.update(BLOCK_WARPGROUPS=warpgroups(cfg), MIN_BLOCKS_PER_SM=blocks_per_sm(cfg))
    return opts


def kernel_constants() -> dict[str, int]:
    """The numbers Python owns and every kernel unit reads, passed to nvcc as -D flags (gpu/build.py):
    the telemetry event kinds (positions of sim.trace.KINDS), the gate and activation codes (positions
    in reference.config's lists), the gate's work item and selection (its lists' places), and the most blocks a stored
    chunk is shared by, the final combine's loads in flight and the copy loop's rows and vectors at
    once (sim.costs, which models them), the most sources a tile window spans, and the largest top_k
    and n_group the gate takes."""
    return {**{f"MOELAB_EV_{k.upper()}": i for i, k in enumerate(KINDS)},
            **{f"MOELAB_GATE_{g.upper()}": i for i, g in enumerate(ALL_GATES)},
            **{f"MOELAB_ACT_{a.upper()}": i for i, a in enumerate(ALL_ACTIVATIONS)},
            "MOELAB_GATE_TOKENS": costs.GATE_TOKENS, "MOELAB_GATE_EXPERTS": costs.GATE_EXPERTS,
            "MOELAB_GATE_DEPTH": costs.GATE_DEPTH, "MOELAB_GATE_MAX_SPLITS": costs.GATE_MAX_SPLITS,
            "MOELAB_GATE_SMEM_LOGITS": costs.GATE_SMEM_LOGITS, "MOELAB_SELECT_LANES": costs.SELECT_LANES,
            "MOELAB_DISPATCH_MAX_PARTS": costs.DISPATCH_MAX_PARTS, "MOELAB_MAX_TILE_SOURCES": MAX_TILE_SOURCES,
            "MOELAB_REDUCE_BATCH": costs.REDUCE_BATCH, "MOELAB_COPY_ROW_GROUP": costs.COPY_ROW_GROUP,
            "MOELAB_COPY_ROW_BATCH": costs.COPY_ROW_BATCH, "MOELAB_MAX_TOP_K": MAX_TOP_K,
            "MOELAB_MAX_GROUPS": MAX_GROUPS,
            **{f"MOELAB_SELECT_LIST_{i}": n for i, n in enumerate(costs.SELECT_LISTS)}}


def kernel_name(cfg: Config) -> str:
    return KERNELS[cfg.precision][0]


def param_fields() -> list[str]:
    """Field names of `struct Params` in kernels/params.cuh, in order (all 8 bytes each)."""
    text = (KERNEL_DIR / "params.cuh").read_text()
    body = text[text.index("struct Params {") + len("struct Params {"): text.index("};", text.index("struct Params {"))]
    names = []
    for line in body.splitlines():
        code = line.split("//")[0].strip()
        if not code:
            continue
        decl = code.rstrip(";")
        if decl.startswith("long long "):
            names += [n.strip() for n in decl[len("long long "):].split(",")]
        else:
            names.append(re.split(r"[\s*]+", decl)[-1])
    return names


def gate_split_capacity(tokens: int, units: int) -> int:
    """How many partial-logit copies the gate may need (gate.cuh gate_splits, which also keeps
    whole slices of H): at most one unit (a block's warpgroup, kernels/common.cuh) per item and
    split, so capacity x T x E stays within units x GATE_TOKENS x E float64s."""
    return max(1, min(GATE_MAX_SPLITS, units // -(-tokens // GATE_TOKENS)))
