"""Elementwise numerics shared by the golden paths: bfloat16 and TF32 rounding, activations, softmax.

The gated activations read h = [gate | up], the first half of the last axis the gate's columns
and the second the up's (W1's layout here; Hugging Face's Mixtral, Qwen3-MoE, DeepSeek and Llama 4
blocks concatenate them the same way, gpt-oss interleaves them, gate at even columns and up at odd
ones, so a loader of gpt-oss weights must de-interleave W1 and b1 into the two halves):
    swiglu      silu(gate) * up = gate * sigmoid(gate) * up
    swiglu_oai  gpt-oss: gate = min(gate, limit), up = clip(up, -limit, limit),
                (up + 1) * gate * sigmoid(1.702 * gate)   (limit: Config.swiglu_limit)

bfloat16 is emulated in NumPy: values are rounded to the nearest bfloat16 (ties to even) and held
in float32, which is what a tensor-core kernel with bf16 operands and fp32 accumulation sees.
TF32 is a way to multiply float32 data, not a storage type: on the "tf32" path everything is
float32 and only the operands of the expert GEMMs are rounded to TF32 as the kernel converts them
(cvt.rna.tf32.f32: 10 mantissa bits kept, nearest, ties away from zero).
"""

from __future__ import annotations

import numpy as np

PATHS = ("float64", "float32", "bfloat16", "tf32")
_COMPUTE = {"float64": np.float64, "float32": np.float32, "bfloat16": np.float32, "tf32": np.float32}
_TF32_DROPPED = 13  # float32 has 23 mantissa bits, TF32 keeps 10
OAI_ALPHA = 1.702  # swiglu_oai's sigmoid slope (gpt-oss' GptOssExperts.alpha)


def compute_dtype(path: str) -> type:
    """The NumPy dtype arithmetic runs in on a precision path."""
    return _COMPUTE[path]


def round_bf16(a: np.ndarray) -> np.ndarray:
    """Round to the nearest bfloat16 (ties to even); returns float32."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    bits = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (bits & np.uint32(0xFFFF0000)).view(np.float32)


def round_tf32(a: np.ndarray) -> np.ndarray:
    """Round to TF32 as PTX cvt.rna.tf32.f32 does: to nearest on the 13 dropped mantissa bits, ties
    away from zero (add half an ulp to the magnitude, then truncate; a carry moves into the
    exponent, up to infinity); returns float32 with those bits zero. Inf and NaN are kept as they are."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(1 << (_TF32_DROPPED - 1))) & np.uint32((0xFFFFFFFF << _TF32_DROPPED) & 0xFFFFFFFF)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, bits, rounded).view(np.float32)


def to_path(a: np.ndarray, path: str) -> np.ndarray:
    """An operand as the path stores it: float64, float32, or bf16-rounded float32 (the tf32
    path stores float32)."""
    if path == "bfloat16":
        return round_bf16(a)
    return np.asarray(a, dtype=_COMPUTE[path])


def gemm_operand(a: np.ndarray, path: str) -> np.ndarray:
    """A stored operand as the path's expert GEMM reads it: TF32-rounded on the tf32 path."""
    return round_tf32(a) if path == "tf32" else a


def _erf(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; math.erf per element is exact to float64 and slow, which a golden can afford.
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x)


def activate(name: str, h: np.ndarray, limit: float | None = None) -> np.ndarray:
    """Apply the activation. For the gated ones the last axis holds [gate | up] halves;
    swiglu_oai clamps at `limit`."""
    if name == "relu":
        return np.maximum(h, 0)
    if name == "gelu_tanh":
        c = h.dtype.type(np.sqrt(2 / np.pi))
        return 0.5 * h * (1 + np.tanh(c * (h + h.dtype.type(0.044715) * h ** 3)))
    if name == "gelu":
        return (0.5 * h * (1 + _erf(h / np.sqrt(2)))).astype(h.dtype)
    if name == "silu":
        return h / (1 + np.exp(-h))
    if name == "swiglu":
        g, u = np.split(h, 2, axis=-1)
        return g / (1 + np.exp(-g)) * u
    if name == "swiglu_oai":
        if limit is None:
            raise ValueError("activation 'swiglu_oai' needs its clamp limit")
        one, lim = h.dtype.type(1), h.dtype.type(limit)
        g, u = np.split(h, 2, axis=-1)
        g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
        return (u + one) * (g / (one + np.exp(-h.dtype.type(OAI_ALPHA) * g)))
    raise ValueError(f"activation {name!r} unknown")


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_at(z: np.ndarray, index: np.ndarray) -> np.ndarray:
    """softmax(z)'s entries at `index` along the last axis, the same figures bit for bit, dividing
    only the entries taken."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return np.take_along_axis(e, index, axis=-1) / e.sum(axis=-1, keepdims=True)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))
