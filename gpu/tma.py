"""TMA tensor maps of the warpgroup tile GEMM's operands (kernels/tile_gemm_wgmma.cuh).

The bf16 and tf32x3 kernels load each 128-byte-deep slice (64 bf16, 32 float32) of their A rows and
weight rows with the Hopper tensor memory accelerator: one thread asks for a box of rows and the
copy engine writes it into shared memory in wgmma's 128-byte-swizzled layout. A box is named by a
tensor map (CUtensorMap, 128 opaque bytes) that the CUDA driver encodes on the host from a buffer's
address and shape. The kernel finds
its five maps, in OPERANDS order, through Params.tmaps (kernels/params.cuh TMAP_*).

Every operand is a row-major bf16 (float32) matrix with K contiguous (the weights are kept K-major
for these kernels): rows of A (tokens in `inbox`, GEMM0's output in `hidden`, a rank's own tokens `x` for its shared
experts) are read 64 at a time, one
box per 64-row wgmma block; weight rows tile_n at a time (a column block of the output).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

MAP_BYTES = 128  # sizeof(CUtensorMap)
OPERANDS = ("inbox", "hidden", "w1", "w2", "x")  # kernels/params.cuh TMAP_INBOX.. TMAP_X
A_BOX_ROWS = 64  # one wgmma.m64 block of A rows per box
SLICE_BYTES = 128  # a slice's depth: the 128 bytes the 128-byte swizzle spans (64 bf16, 32 float32)
MAX_BOX_ROWS = 256  # the driver's limit on a box's extent in any dimension
# cuda.h enums
_FLOAT32, _BFLOAT16, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZERO = 7, 9, 0, 3, 3, 0
DATA_TYPES = {2: _BFLOAT16, 4: _FLOAT32}  # by element bytes


class TensorMapError(ValueError):
    """An operand the TMA cannot describe, or the driver refused to encode."""


@dataclass(frozen=True)
class MapSpec:
    """What cuTensorMapEncodeTiled is given for one operand: dims and box innermost (K) first."""

    address: int
    dims: tuple[int, int]  # (K, rows)
    row_stride_bytes: int
    box: tuple[int, int]  # (slice depth in elements, box rows)
    elem_bytes: int = 2


def spec(name: str, address: int, rows: int, k: int, box_rows: int, elem_bytes: int = 2) -> MapSpec:
    """The tensor map of a [rows][k] bf16 (elem_bytes 2) or float32 (4) matrix at `address`, read
    in boxes of box_rows x one 128-byte slice; raises TensorMapError naming the operand where the
    TMA's rules are not met."""
    if elem_bytes not in DATA_TYPES:
        raise TensorMapError(f"{name}: {elem_bytes}-byte elements are not allowed: 2 (bf16) or 4 (float32)")
    box_k = SLICE_BYTES // elem_bytes
    if address % 16:
        raise TensorMapError(f"{name}: address {address:#x} is not allowed: the TMA needs 16-byte alignment")
    if k % box_k:
        raise TensorMapError(f"{name}: K = {k} is not allowed: a multiple of {box_k} (whole 128-byte slices)")
    if not 0 < box_rows <= MAX_BOX_ROWS:
        raise TensorMapError(f"{name}: box of {box_rows} rows is not allowed: 1 to {MAX_BOX_ROWS}")
    if rows < 1:
        raise TensorMapError(f"{name}: {rows} rows is not allowed: at least 1")
    return MapSpec(address, (k, rows), elem_bytes * k, (box_k, box_rows), elem_bytes)


def encode(s: MapSpec) -> bytes:
    """The 128 bytes of s's tensor map, encoded by the driver of this machine's GPU."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise TensorMapError(f"the CUDA driver (libcuda.so.1) is needed to encode TMA tensor maps: {e}") from None
    out = (ctypes.c_uint8 * MAP_BYTES)()
    u64x2, u32x2 = ctypes.c_uint64 * 2, ctypes.c_uint32 * 2
    status = libcuda.cuTensorMapEncodeTiled(
        out, ctypes.c_int(DATA_TYPES[s.elem_bytes]), ctypes.c_uint32(2), ctypes.c_void_p(s.address), u64x2(*s.dims),
        (ctypes.c_uint64 * 1)(s.row_stride_bytes), u32x2(*s.box), u32x2(1, 1), ctypes.c_int(_INTERLEAVE_NONE),
        ctypes.c_int(_SWIZZLE_128B), ctypes.c_int(_L2_PROMOTION_256B), ctypes.c_int(_OOB_FILL_ZERO))
    if status != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled refused {s} with CUresult {status}")
    return bytes(out)


def operand_specs(tensors: dict, tile_n: int) -> list[MapSpec]:
    """The operands' specs (OPERANDS order) from torch tensors: inbox [rows][H], hidden
    [rows][I], w1 K-major [L+S][I'][H], w2 K-major [L+S][H][I], x [T][H]."""
    out = []
    for name in OPERANDS:
        t = tensors[name]
        k = t.shape[-1]
        rows = t.numel() // k
        out.append(spec(name, t.data_ptr(), rows, k, A_BOX_ROWS if name in ("inbox", "hidden", "x") else tile_n,
                        t.element_size()))
    return out


def maps_block(specs: list[MapSpec]) -> np.ndarray:
    """The maps of `specs` back to back (MAP_BYTES each), as uint8, for a device copy."""
    return np.frombuffer(b"".join(encode(s) for s in specs), np.uint8).copy()
