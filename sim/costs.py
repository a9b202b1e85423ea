"""The cost model: how long a block spends on a task, the gate or packing a tile, from the preset.

A block's share of the chip is 1 / (SMs x blocks per SM) of its matrix rate (peak x efficiency)
and of its HBM bandwidth. A task takes its FLOPs over the block's rate or its HBM bytes over the
block's bandwidth, whichever dominates, plus the per-task overhead. GEMM operands are reread by
many tasks, so only (1 - L2 hit fraction) of a GEMM task's bytes reach HBM; a combine streams.
Times in ns; flops per ns = TFLOP/s x 1e3, bytes per ns = GB/s.
"""

from __future__ import annotations

import numpy as np

from reference import Config
from reference.plan import COMBINE

from .hardware import Hardware


def blocks(hw: Hardware) -> int:
    return hw.sms * hw.blocks_per_sm


def chip_flops_per_ns(hw: Hardware, dtype: str) -> float:
    return hw.tflops(dtype) * 1e3 * hw.matrix_efficiency


def block_flops_per_ns(hw: Hardware, dtype: str) -> float:
    return chip_flops_per_ns(hw, dtype) / blocks(hw)


def block_bytes_per_ns(hw: Hardware) -> float:
    return hw.hbm_gbps / blocks(hw)


def task_ns(hw: Hardware, cfg: Config, kind: np.ndarray, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Duration of each task (arrays of the tile plan's task_kind, task_flops, task_bytes)."""
    hbm_bytes = np.where(kind == COMBINE, nbytes, nbytes * (1.0 - hw.l2_hit_fraction))
    compute = flops / block_flops_per_ns(hw, cfg.dtype)
    memory = hbm_bytes / block_bytes_per_ns(hw)
    return np.maximum(compute, memory) + hw.task_overhead_ns


def gate_ns(hw: Hardware, cfg: Config) -> float:
    """The gate on the whole chip: logits x Wg over T tokens, reading the tokens and Wg."""
    flops = 2.0 * cfg.tokens * cfg.hidden * cfg.experts
    nbytes = cfg.dtype_bytes * (cfg.tokens * cfg.hidden + cfg.hidden * cfg.experts)
    return max(flops / chip_flops_per_ns(hw, cfg.dtype), nbytes / hw.hbm_gbps)


def pack_ns(hw: Hardware, nbytes: float) -> float:
    """One block gathers a tile's token rows into the send buffer: read and write its bytes."""
    return 2.0 * nbytes / block_bytes_per_ns(hw) + hw.task_overhead_ns


def kernel_ns(hw: Hardware, cfg: Config, flops: float, nbytes: float, gemm: bool) -> float:
    """A whole-chip kernel of the bulk-synchronous baseline (launch gap not included)."""
    hbm_bytes = nbytes * (1.0 - hw.l2_hit_fraction) if gemm else nbytes
    return max(flops / chip_flops_per_ns(hw, cfg.dtype), hbm_bytes / hw.hbm_gbps)
