"""Routing: which experts each token goes to, with which weight, and which assignments are dropped.

The rules, fixed so that the simulator and the kernel can reproduce them exactly:
- Gate logits are computed in float64 from the path's operands (x, Wg and the router bias rounded
  to bf16 on the bf16 path), so float32 accumulation order never changes a routing decision. With
  router_bias the gate projection's bias b (E,) is added (z = x Wg + b, gpt-oss). A config with skew > 0 adds
  -skew * ln(1 + e) to expert e's logit (a Zipf-like prior: load imbalance).
- Selection score per expert: the logit z, except sigmoid_bias: sigmoid(z) + bias[e] (bias: the
  gate's selection-only bias, DeepSeek-V3's e_score_correction_bias). Softmax keeps the logits'
  order, so the softmax gates select by logit.
- Group limit (n_group > 1): experts e are in n_group equal groups of consecutive indices
  (group e // (E / n_group)); a group's score is its best selection score, or for sigmoid_bias
  the sum of its two best (one where a group has one expert); only the topk_group best groups
  stay selectable (the others are excluded: Hugging Face masks them with a score of 0.0, the same
  choice while the kept groups hold k experts of positive score, as softmax and sigmoid scores do).
- Top-k: the k best selection scores, best first (choice 0 the best). Every tie, between experts
  or between groups, goes to the lower index (a stable sort).
- Weights, then multiplied by routed_scaling (1: unchanged), per gate:
    softmax_topk         softmax(z)[e], over all E logits, not renormalized
                         (Qwen3-MoE with norm_topk_prob false; DeepSeek-V2 / V2-Lite, "greedy" and
                         "group_limited_greedy": HF scales these by routed_scaling_factor)
    softmax_topk_renorm  softmax(z)[e] / sum of the k selected softmax(z)  (Mixtral; Qwen3-MoE
                         with norm_topk_prob true, Qwen3-30B-A3B and Qwen3-235B-A22B)
    topk_softmax         softmax over the k selected logits only (gpt-oss, with router_bias)
    sigmoid_bias         sigmoid(z)[e] / (sum of the k selected sigmoid(z) + 1e-20): the unbiased
                         sigmoids, renormalized as HF's norm_topk_prob (DeepSeek-V3 "noaux_tc",
                         with n_group 8, topk_group 4, routed_scaling 2.5)
    sigmoid_topk         sigmoid(z)[e] of each selected logit (Llama 4: top-1; with
                         scale_before_expert the token row is multiplied by it before the expert,
                         whose output then enters the sum with weight 1, see golden.py)
- Capacity: each source rank may send C = ceil(capacity_factor * T * k / E) rows to each expert.
  Assignments claim slots in priority order: every token's 1st choice before any 2nd choice
  (choice index j first), then lower token index first. An assignment whose position is >= C is
  dropped: it contributes nothing to the token's output. capacity_factor None: nothing dropped.
- Shared experts take every token with weight 1 and are never dropped; they are not in `Routing`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .config import Config
from .numerics import sigmoid, softmax, softmax_at, to_path


@dataclass(frozen=True)
class Routing:
    """expert, weight, slot: (P, T, k) arrays in choice order; slot = row in the (source rank,
    expert) buffer, or -1 where the assignment was dropped."""

    expert: np.ndarray
    weight: np.ndarray
    slot: np.ndarray

    @cached_property
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


def logits(cfg: Config, x: np.ndarray, wg: np.ndarray, wg_bias: np.ndarray | None = None) -> np.ndarray:
    """Gate logits in float64 of the path's operands; x is (..., H); `wg_bias` (E,) is added with
    router_bias (and must then be given)."""
    path = _path(cfg)
    return _offset(cfg, to_path(x, path).astype(np.float64) @ to_path(wg, path).astype(np.float64), wg_bias)


def sampled(cfg: Config) -> bool:
    """Whether reference.route_config draws cfg's logits from their law (sampled_logits): across
    nodes, where only the simulator goes; on one node it routes the golden's tokens."""
    return cfg.nodes > 1


def gate_factor(cfg: Config, wg: np.ndarray) -> np.ndarray:
    """R of Wg = Q R (Q: H x K orthonormal columns, R: K x E, K = min(H, E)) for the path's Wg."""
    return np.linalg.qr(to_path(wg, _path(cfg)).astype(np.float64), mode="r")


def sampled_logits(cfg: Config, y: np.ndarray, r: np.ndarray, wg_bias: np.ndarray | None = None) -> np.ndarray:
    """Gate logits of fresh tokens drawn from their distribution, not through the tokens: for tokens x
    of N(0, 1) entries, x Wg = (x Q) R and x Q has N(0, 1) entries again, so `y` (T, K) of N(0, 1)
    entries times R (gate_factor) are distributed as x Wg (the bf16 path's rounding of x aside): K
    products a logit, not H, in float32 (no other path's routing to agree with; selection at half
    the cost). Bias and skew as logits()."""
    return _offset(cfg, _times_upper(y, r.astype(np.float32)), wg_bias)


def _times_upper(y: np.ndarray, r: np.ndarray, blocks: int = 8) -> np.ndarray:
    """y @ r for r upper triangular (r[i, j] = 0 for i > j), column block by column block: block b
    of the product reads only the rows of r above its last column (a little over half the flops in 8 blocks)."""
    out = np.empty((y.shape[0], r.shape[1]), np.result_type(y, r))
    edges = np.linspace(0, r.shape[1], blocks + 1).astype(int)
    for lo, hi in zip(edges[:-1], edges[1:]):
        depth = min(hi, r.shape[0])
        np.matmul(y[:, :depth], r[:depth, lo:hi], out=out[:, lo:hi])
    return out


def _path(cfg: Config) -> str:
    return "bfloat16" if cfg.dtype == "bfloat16" else "float32"


def _offset(cfg: Config, z: np.ndarray, wg_bias: np.ndarray | None) -> np.ndarray:
    """Logits z with the router's bias (router_bias) and the skew's prior added."""
    if cfg.router_bias:
        if wg_bias is None:
            raise ValueError(f"config {cfg.name!r} has router_bias = true: the gate's bias vector is needed")
        z += to_path(wg_bias, _path(cfg)).astype(np.float64)
    if cfg.skew:
        z -= cfg.skew * np.log1p(np.arange(cfg.experts, dtype=np.float64))
    return z


def _top(score: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, best first, ties to the lower index."""
    # the first k of a stable sort of -score (equal scores keep ascending index order), found from
    # each row's k-th best value (a partition of the values, not of their indices): the entries at
    # most it are the row's k best, in index order, then stably sorted. A row where the k-th best
    # ties an entry left out (or is NaN) holds other than k such entries and takes the whole sort.
    neg = -score
    if neg.ndim != 2 or k >= neg.shape[-1]:
        return np.argsort(neg, axis=-1, kind="stable")[..., :k]
    inside = neg <= np.partition(neg, k - 1, axis=-1)[:, k - 1:k]
    settled = np.count_nonzero(inside, axis=-1) == k
    if settled.all():
        return _sorted_best(neg, inside, k)
    top = np.empty((neg.shape[0], k), np.intp)
    top[settled] = _sorted_best(neg[settled], inside[settled], k)
    top[~settled] = np.argsort(neg[~settled], axis=-1, kind="stable")[:, :k]
    return top


def _sorted_best(neg: np.ndarray, inside: np.ndarray, k: int) -> np.ndarray:
    """Each row's k entries marked `inside`, best (least `neg`) first, ties in index order."""
    best = (np.flatnonzero(inside) % neg.shape[-1]).reshape(-1, k)
    vals = np.take_along_axis(neg, best, axis=-1)
    return np.take_along_axis(best, np.argsort(vals, axis=-1, kind="stable"), axis=-1)


def group_limit(cfg: Config, score: np.ndarray) -> np.ndarray:
    """Selection scores (T, E) with every expert outside each token's topk_group best groups set
    to -inf (n_group 1: unchanged). A group's score is its best expert's, for sigmoid_bias the sum
    of its two best (DeepSeek-V3)."""
    if cfg.n_group == 1:
        return score
    t, size = score.shape[0], cfg.experts // cfg.n_group
    grouped = score.reshape(t, cfg.n_group, size)
    if cfg.gate == "sigmoid_bias":
        best = -np.sort(-grouped, axis=-1)[..., :2]
        group_score = best[..., 0] + best[..., 1] if size > 1 else best[..., 0]
    else:
        group_score = grouped.max(axis=-1)
    keep = np.zeros((t, cfg.n_group), bool)
    np.put_along_axis(keep, _top(group_score, cfg.topk_group), True, axis=-1)
    return np.where(np.repeat(keep, size, axis=-1), score, -np.inf)


def select(cfg: Config, z: np.ndarray, gate_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-k experts (T, k) and their weights (T, k) from logits z (T, E), computed in z's float
    type (float64 but for sampled_logits')."""
    s = sigmoid(z) if cfg.gate in ("sigmoid_bias", "sigmoid_topk") else None
    score = s + gate_bias.astype(z.dtype) if cfg.gate == "sigmoid_bias" else z
    top = _top(group_limit(cfg, score), cfg.top_k).astype(np.int32)
    if cfg.gate == "softmax_topk":
        w = softmax_at(z, top)
    elif cfg.gate == "softmax_topk_renorm":
        w = softmax_at(z, top)
        w = w / w.sum(-1, keepdims=True)
    elif cfg.gate == "topk_softmax":
        w = softmax(np.take_along_axis(z, top, axis=-1))
    elif cfg.gate == "sigmoid_bias":
        w = np.take_along_axis(s, top, axis=-1)
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    else:  # sigmoid_topk
        w = np.take_along_axis(s, top, axis=-1)
    return top, w * cfg.routed_scaling


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


def route(cfg: Config, x: Iterable[np.ndarray], wg: np.ndarray, gate_bias: np.ndarray,
          wg_bias: np.ndarray | None = None) -> Routing:
    """Route the (P, T, H) tokens of every rank, an array or the ranks' (T, H) one after another
    (`wg_bias`: the gate's bias, needed with router_bias)."""
    return route_logits(cfg, (logits(cfg, xr, wg, wg_bias) for xr in x), gate_bias)


def route_logits(cfg: Config, z: Iterable[np.ndarray], gate_bias: np.ndarray) -> Routing:
    """Route every rank's (T, E) gate logits (logits()' float64, or sampled_logits'), one rank after another."""
    experts, weights, slots = [], [], []
    for zr in z:
        top, w = select(cfg, zr, gate_bias)
        experts.append(top)
        weights.append(w)
        slots.append(assign_slots(cfg, top))
    return Routing(np.stack(experts), np.stack(weights), np.stack(slots))
