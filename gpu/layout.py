"""What the megakernel supports (float32; bfloat16 on tensor cores), its buffers' sizes, its arguments.

All sizes derive from the `Config` (never ad hoc): the capacity C per (source rank, expert)
block is `cfg.capacity` (or T when nothing is dropped; a token picks an expert at most once, so
no block exceeds T rows), tiles per block TM = ceil(C / tile_m), one task queue slot per task
the layer call can make. The argument block's field order is read from kernels/params.cuh, the
one place it is defined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reference import Config, ConfigError

KERNEL_DIR = Path(__file__).parent / "kernels"
GATES = ("softmax_topk", "softmax_topk_renorm", "topk_softmax", "sigmoid_bias")  # params.cuh order
ACTIVATIONS = ("relu", "gelu_tanh", "gelu", "silu")  # params.cuh order
BLOCK_THREADS = 128
OS_WARPS = 4  # the OS block's logs: scheduler warp, then 3 subscriber warps
MAX_TOP_K = 16
TLOG_CAP = 1024  # events per telemetry log; more are counted and reported, not stored
DTYPES = ("float32", "bfloat16")
ELEM_BYTES = {"float32": 4, "bfloat16": 2}  # tokens, expert weights and the rows moved
MIN_BLOCKS_PER_SM = 2  # __launch_bounds__ minimum (gpu/build.py passes it to nvcc): 2 blocks of 4 warps per SM
SMEM_SYMBOL = "moelab_smem_bytes"  # the kernel's dynamic shared memory per block, a constant in the cubin
BF16_STAGES = 3  # cp.async stages of the tensor-core tile GEMM (TcTileGemm::STAGES)
STATIC_SMEM_BYTES = 48 * 1024  # a block's static shared memory limit


class UnsupportedConfig(ConfigError):
    """A valid config the kernel cannot run (yet)."""


def check_supported(cfg: Config) -> None:
    """Raise UnsupportedConfig naming the first field the kernel does not support."""
    if cfg.dtype not in DTYPES:
        raise UnsupportedConfig("dtype", cfg.dtype, "one of " + ", ".join(DTYPES))
    if cfg.activation not in ACTIVATIONS:
        raise UnsupportedConfig("activation", cfg.activation, "one of " + ", ".join(ACTIVATIONS)
                                + " (swiglu is not in the kernel yet)")
    if cfg.shared_experts:
        raise UnsupportedConfig("shared_experts", cfg.shared_experts, "0 (shared experts are not in the kernel yet)")
    if cfg.gate not in GATES:
        raise UnsupportedConfig("gate", cfg.gate, "one of " + ", ".join(GATES))
    if cfg.top_k > MAX_TOP_K:
        raise UnsupportedConfig("top_k", cfg.top_k, f"at most {MAX_TOP_K}")
    if cfg.dtype == "bfloat16":
        _check_tensor_core_tiles(cfg)
    elif cfg.tile_m % 16 or cfg.tile_m > 1024:
        raise UnsupportedConfig("tile_m", cfg.tile_m, "a multiple of 16, at most 1024 (16 row groups of threads)")
    if cfg.tile_n % 8:
        raise UnsupportedConfig("tile_n", cfg.tile_n, "a multiple of 8 (8 column groups of threads)")
    if cfg.tile_k % 4:
        raise UnsupportedConfig("tile_k", cfg.tile_k, "a multiple of 4 (16-byte loads)")
    if cfg.experts > 0xFFFF:
        raise UnsupportedConfig("experts", cfg.experts, "at most 65535 (telemetry packs 16 bits)")


def _check_tensor_core_tiles(cfg: Config) -> None:
    """The bf16 tile GEMM's shape: 4 warps stacked along M, each a multiple of 16 rows (mma
    m16n8k16), columns in pairs of 8-wide mma tiles, K in steps of 16, and its cp.async stages
    within a block's static shared memory. (hidden and ffn are multiples of tile_n, so every bf16
    row and column block starts on 16 bytes, as the 16-byte copies need.)"""
    if cfg.tile_m % 64:
        raise UnsupportedConfig("tile_m", cfg.tile_m, "a multiple of 64 for bfloat16 (4 warps of 16-row mma tiles)")
    if cfg.tile_n % 16:
        raise UnsupportedConfig("tile_n", cfg.tile_n, "a multiple of 16 for bfloat16 (pairs of 8-column mma tiles)")
    if cfg.tile_k % 16:
        raise UnsupportedConfig("tile_k", cfg.tile_k, "a multiple of 16 for bfloat16 (the mma's k of 16), e.g. 32")
    smem = BF16_STAGES * 2 * (cfg.tile_m * (cfg.tile_k + 8) + cfg.tile_k * (cfg.tile_n + 8))
    if smem > STATIC_SMEM_BYTES - 1024:
        raise UnsupportedConfig("tile_k", cfg.tile_k, f"for bfloat16, small enough that {BF16_STAGES} stages "
                                f"of {cfg.tile_m} x {cfg.tile_n} tiles fit 47 KiB of shared memory (need {smem} B)")


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
    TM: int
    n0: int  # GEMM0 tasks per tile
    n1: int  # GEMM1 tasks per tile
    queue_cap: int
    elem_bytes: int  # of tokens, expert weights and the moved rows

    @classmethod
    def of(cls, cfg: Config) -> Sizes:
        c = cfg.tokens if cfg.capacity is None else min(cfg.capacity, cfg.tokens)
        tm = -(-c // cfg.tile_m)
        n0, n1 = cfg.ffn // cfg.tile_n, cfg.hidden // cfg.tile_n
        e = cfg.experts
        return cls(T=cfg.tokens, H=cfg.hidden, I=cfg.ffn, E=e, K=cfg.top_k, P=cfg.ranks, L=cfg.local_experts,
                   C=c, TM=tm, n0=n0, n1=n1, queue_cap=e * tm * (n0 + n1) + e * tm,
                   elem_bytes=ELEM_BYTES.get(cfg.dtype, 4))

    @property
    def symmetric_bytes(self) -> int:
        """NVSHMEM heap one layer takes on each rank: four E x C x H buffers of elements (P * L = E
        blocks of rows arrive, E blocks are sent) and the signals."""
        return 4 * (self.elem_bytes * self.E * self.C * self.H) + 8 * self.signal_words

    @property
    def signal_words(self) -> int:
        """sig_count (E), sig_tile (E x TM), sig_comb (E x TM), sig_start (P)."""
        return self.E + 2 * self.E * self.TM + self.P


def compile_options(cfg: Config) -> dict[str, int]:
    """The compile-time part of a config: the tile shape and the dtype (one cubin per pair)."""
    opts = {"TILE_M": cfg.tile_m, "TILE_N": cfg.tile_n, "TILE_K": cfg.tile_k}
    return {**opts, "MOE_BF16": 1} if cfg.dtype == "bfloat16" else opts


def kernel_name(cfg: Config) -> str:
    return "moelab_moe_bf16" if cfg.dtype == "bfloat16" else "moelab_moe_fp32"


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
