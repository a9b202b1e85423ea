"""Routing: which experts each token goes to, with which weight, and which assignments are dropped.

The rules, fixed so that the simulator and the kernel can reproduce them exactly:
- Gate logits are computed in float64 from the path's operands (x and Wg rounded to bf16 on the
  bf16 path), so float32 accumulation order never changes a routing decision. A config with
  skew > 0 adds -skew * ln(1 + e) to expert e's logit (a Zipf-like prior: load imbalance).
- Selection: the k largest scores, best first; a tie goes to the lower expert index. For the
  softmax gates the scores are the logits (softmax keeps their order).
  softmax_topk: weight = softmax(logits)[e];  softmax_topk_renorm: those k weights renormalized
  to sum 1;  topk_softmax: softmax over the k selected logits;  sigmoid_bias (DeepSeek-V3): select
  by sigmoid(logit) + bias[e], weight = sigmoid(logit) over the sum of the k selected sigmoids.
- Capacity: each source rank may send C = ceil(capacity_factor * T * k / E) rows to each expert.
  Assignments claim slots in priority order: every token's 1st choice before any 2nd choice
  (choice index j first), then lower token index first. An assignment whose position is >= C is
  dropped: it contributes nothing to the token's output. capacity_factor None: nothing dropped.
- Shared experts take every token with weight 1 and are never dropped; they are not in `Routing`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .config import Config
from .numerics import sigmoid, softmax, to_path


@dataclass(frozen=True)
class Routing:
    """expert, weight, slot: (P, T, k) arrays in choice order; slot = row in the (source rank,
    expert) buffer, or -1 where the assignment was dropped."""

    expert: np.ndarray
    weight: np.ndarray
    slot: np.ndarray

    @property
    def kept(self) -> np.ndarray:
        return self.slot >= 0

    @property
    def dropped(self) -> int:
        return int((self.slot < 0).sum())

    def counts(self, experts: int) -> np.ndarray:
        """(P, E) rows each source rank sends to each expert."""
        p = self.expert.shape[0]
        out = np.zeros((p, experts), np.int64)
        for r in range(p):
            out[r] = np.bincount(self.expert[r][self.kept[r]], minlength=experts)
        return out


def logits(cfg: Config, x: np.ndarray, wg: np.ndarray) -> np.ndarray:
    """Gate logits in float64 of the path's operands; x is (..., H)."""
    path = "bfloat16" if cfg.dtype == "bfloat16" else "float32"
    z = to_path(x, path).astype(np.float64) @ to_path(wg, path).astype(np.float64)
    if cfg.skew:
        z -= cfg.skew * np.log1p(np.arange(cfg.experts, dtype=np.float64))
    return z


def select(cfg: Config, z: np.ndarray, gate_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-k experts (T, k) and their weights (T, k) from float64 logits z (T, E)."""
    k = cfg.top_k
    if cfg.gate == "sigmoid_bias":
        s = sigmoid(z)
        score = s + gate_bias.astype(np.float64)
    else:
        score = z
    # stable sort of -score: equal scores keep ascending expert order, so ties go to the lower index
    top = np.argsort(-score, axis=-1, kind="stable")[:, :k].astype(np.int32)
    picked = np.take_along_axis(z, top, axis=-1)
    if cfg.gate == "softmax_topk":
        w = np.take_along_axis(softmax(z), top, axis=-1)
    elif cfg.gate == "softmax_topk_renorm":
        w = np.take_along_axis(softmax(z), top, axis=-1)
        w = w / w.sum(-1, keepdims=True)
    elif cfg.gate == "topk_softmax":
        w = softmax(picked)
    else:
        sp = sigmoid(picked)
        w = sp / sp.sum(-1, keepdims=True)
    return top, w


def assign_slots(cfg: Config, top: np.ndarray) -> np.ndarray:
    """Slot of each (token, choice) of one source rank in its expert's buffer, -1 if dropped."""
    t, k = top.shape
    order_expert = top.T.reshape(-1)  # priority order: choice j major, token minor
    idx = np.argsort(order_expert, kind="stable")
    sorted_e = order_expert[idx]
    first = np.searchsorted(sorted_e, sorted_e, side="left")
    position = np.empty(t * k, np.int64)
    position[idx] = np.arange(t * k) - first
    cap = cfg.capacity
    if cap is not None:
        position[position >= cap] = -1
    return position.reshape(k, t).T.astype(np.int32)


def route(cfg: Config, x: Iterable[np.ndarray], wg: np.ndarray, gate_bias: np.ndarray) -> Routing:
    """Route the (P, T, H) tokens of every rank: an array, or the ranks' (T, H) one after another."""
    experts, weights, slots = [], [], []
    for xr in x:
        top, w = select(cfg, logits(cfg, xr, wg), gate_bias)
        experts.append(top)
        weights.append(w)
        slots.append(assign_slots(cfg, top))
    return Routing(np.stack(experts), np.stack(weights), np.stack(slots))
