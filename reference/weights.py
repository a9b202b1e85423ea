"""Inputs and weights of a layer, drawn reproducibly from the config's seed.

Every array has its own random stream keyed by (seed, array, index), so one rank can draw its own
tokens, or the experts it owns, without drawing anything else; the values are float32 (exact in
float64, so the float64 truth and the float32 path see the same numbers). Scales keep activations
O(1): x ~ N(0, 1), W1 ~ N(0, 1/H), W2 ~ N(0, 1/I), Wg ~ N(0, 1/H), biases ~ N(0, 0.1^2).
Shared experts are experts E .. E+S-1 of the weight arrays. A gated activation's W1 holds the
gate's I columns, then the up's I ([gate | up]); its b1 likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Config

_X, _WG, _GATE_BIAS, _W1, _B1, _W2, _B2, _WG_BIAS, _X_GATE = range(9)


def _stream(cfg: Config, stream: int, index: int) -> np.random.Generator:
    """The random stream of one array: keyed by (seed, array, index)."""
    return np.random.default_rng([cfg.seed, stream, index])


def _normal(cfg: Config, stream: int, index: int, shape, scale: float) -> np.ndarray:
    return _stream(cfg, stream, index).standard_normal(shape, dtype=np.float32) * np.float32(scale)


def ffn_in_width(cfg: Config) -> int:
    """Columns of W1: I, or 2I for a gated activation ([gate | up])."""
    return 2 * cfg.ffn if cfg.gated else cfg.ffn


@dataclass(frozen=True)
class Weights:
    """x: (P, T, H); wg: (H, E); gate_bias: (E,); w1: (E+S, H, I'); b1: (E+S, I'); w2: (E+S, I, H);
    b2: (E+S, H); wg_bias: (E,). Expert biases are zeros when the config has bias = false, wg_bias
    (added to the gate's logits) when it has router_bias = false."""

    x: np.ndarray
    wg: np.ndarray
    gate_bias: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    wg_bias: np.ndarray


def tokens(cfg: Config, rank: int) -> np.ndarray:
    """The T x H tokens that live on `rank`."""
    return _normal(cfg, _X, rank, (cfg.tokens, cfg.hidden), 1.0)


def gate_inputs(cfg: Config, rank: int) -> np.ndarray:
    """`rank`'s T tokens as the gate sees them, in Wg's column space: (T, min(H, E)) entries N(0, 1)
    (x Q for tokens x of N(0, 1) entries and Wg = Q R, which are N(0, 1) again: routing.sampled_logits),
    drawn as Box-Muller pairs of float32 uniforms: half the time of the ziggurat's normals, where a
    512-GPU run draws a billion (the tails stop at 5.8 sigma, float32's least uniform past 0)."""
    rng = _stream(cfg, _X_GATE, rank)
    shape = (cfg.tokens, min(cfg.hidden, cfg.experts))
    n = shape[0] * shape[1]
    half = (n + 1) // 2
    u = rng.random((2, half), dtype=np.float32)
    radius = np.sqrt(np.float32(-2) * np.log1p(-u[0]))
    angle = np.float32(2 * np.pi) * u[1]
    out = np.empty(2 * half, np.float32)  # the cosines, then the sines
    np.multiply(radius, np.cos(angle), out=out[:half])
    np.multiply(radius, np.sin(angle), out=out[half:])
    return out[:n].reshape(shape)


def gate(cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """Gate weights Wg (H, E) and the selection-only expert bias (E,) of the sigmoid_bias gate."""
    wg = _normal(cfg, _WG, 0, (cfg.hidden, cfg.experts), cfg.hidden ** -0.5)
    bias = _normal(cfg, _GATE_BIAS, 0, (cfg.experts,), 0.1)
    return wg, bias


def router_bias(cfg: Config) -> np.ndarray:
    """The gate projection's bias (E,), added to the logits with router_bias (gpt-oss); zeros without."""
    if not cfg.router_bias:
        return np.zeros(cfg.experts, np.float32)
    return _normal(cfg, _WG_BIAS, 0, (cfg.experts,), 0.1)


def expert(cfg: Config, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(W1, b1, W2, b2) of expert `e` (e >= E: shared expert e - E)."""
    n_in = ffn_in_width(cfg)
    w1 = _normal(cfg, _W1, e, (cfg.hidden, n_in), cfg.hidden ** -0.5)
    w2 = _normal(cfg, _W2, e, (cfg.ffn, cfg.hidden), cfg.ffn ** -0.5)
    if cfg.bias:
        b1 = _normal(cfg, _B1, e, (n_in,), 0.1)
        b2 = _normal(cfg, _B2, e, (cfg.hidden,), 0.1)
    else:
        b1 = np.zeros(n_in, np.float32)
        b2 = np.zeros(cfg.hidden, np.float32)
    return w1, b1, w2, b2


def draw_bytes(cfg: Config) -> int:
    """Bytes `draw` allocates: every rank's tokens and every expert's weights, float32."""
    n, n_in = cfg.experts + cfg.shared_experts, ffn_in_width(cfg)
    values = (cfg.ranks * cfg.tokens * cfg.hidden + cfg.hidden * cfg.experts + 2 * cfg.experts
              + n * (cfg.hidden * n_in + n_in + cfg.ffn * cfg.hidden + cfg.hidden))
    return 4 * values


def draw(cfg: Config) -> Weights:
    """All inputs and weights of the layer."""
    x = np.stack([tokens(cfg, r) for r in range(cfg.ranks)])
    wg, gate_bias = gate(cfg)
    n, n_in = cfg.experts + cfg.shared_experts, ffn_in_width(cfg)
    # filled in place: np.stack of the parts would hold every weight twice at the paper's sizes
    w1 = np.empty((n, cfg.hidden, n_in), np.float32)
    b1 = np.empty((n, n_in), np.float32)
    w2 = np.empty((n, cfg.ffn, cfg.hidden), np.float32)
    b2 = np.empty((n, cfg.hidden), np.float32)
    for e in range(n):
        w1[e], b1[e], w2[e], b2[e] = expert(cfg, e)
    return Weights(x, wg, gate_bias, w1, b1, w2, b2, router_bias(cfg))
