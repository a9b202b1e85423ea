"""What the float32 megakernel supports, the sizes of its buffers, and its argument block.

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


class UnsupportedConfig(ConfigError):
    """A valid config the float32 kernel cannot run (yet)."""


def check_supported(cfg: Config) -> None:
    """Raise UnsupportedConfig naming the first field the kernel does not support."""
    if cfg.dtype != "float32":
        raise UnsupportedConfig("dtype", cfg.dtype, "float32 (the bf16 kernel is part 2)")
    if cfg.activation not in ACTIVATIONS:
        raise UnsupportedConfig("activation", cfg.activation, "one of " + ", ".join(ACTIVATIONS)
                                + " (swiglu is not in the kernel yet)")
    if cfg.shared_experts:
        raise UnsupportedConfig("shared_experts", cfg.shared_experts, "0 (shared experts are not in the kernel yet)")
    if cfg.gate not in GATES:
        raise UnsupportedConfig("gate", cfg.gate, "one of " + ", ".join(GATES))
    if cfg.top_k > MAX_TOP_K:
        raise UnsupportedConfig("top_k", cfg.top_k, f"at most {MAX_TOP_K}")
    if cfg.tile_m % 16 or cfg.tile_m > 1024:
        raise UnsupportedConfig("tile_m", cfg.tile_m, "a multiple of 16, at most 1024 (16 row groups of threads)")
    if cfg.tile_n % 8:
        raise UnsupportedConfig("tile_n", cfg.tile_n, "a multiple of 8 (8 column groups of threads)")
    if cfg.tile_k % 4:
        raise UnsupportedConfig("tile_k", cfg.tile_k, "a multiple of 4 (16-byte loads)")
    if cfg.experts > 0xFFFF:
        raise UnsupportedConfig("experts", cfg.experts, "at most 65535 (telemetry packs 16 bits)")


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

    @classmethod
    def of(cls, cfg: Config) -> Sizes:
        c = cfg.tokens if cfg.capacity is None else min(cfg.capacity, cfg.tokens)
        tm = -(-c // cfg.tile_m)
        n0, n1 = cfg.ffn // cfg.tile_n, cfg.hidden // cfg.tile_n
        e = cfg.experts
        return cls(T=cfg.tokens, H=cfg.hidden, I=cfg.ffn, E=e, K=cfg.top_k, P=cfg.ranks, L=cfg.local_experts,
                   C=c, TM=tm, n0=n0, n1=n1, queue_cap=e * tm * (n0 + n1) + e * tm)

    @property
    def symmetric_bytes(self) -> int:
        """NVSHMEM heap one layer takes on each rank: four E x C x H float buffers (P * L = E
        blocks of rows arrive, E blocks are sent) and the signals."""
        return 4 * (4 * self.E * self.C * self.H) + 8 * self.signal_words

    @property
    def signal_words(self) -> int:
        """sig_count (E), sig_tile (E x TM), sig_comb (E x TM), sig_start (P)."""
        return self.E + 2 * self.E * self.TM + self.P


def compile_options(cfg: Config) -> dict[str, int]:
    """The compile-time part of a config: the tile shape (one cubin per tile shape)."""
    return {"TILE_M": cfg.tile_m, "TILE_N": cfg.tile_n, "TILE_K": cfg.tile_k}


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
