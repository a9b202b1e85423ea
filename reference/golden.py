"""The golden forward: the numbers every other part of moelab must reproduce.

Two computations of one layer call, which must agree:
- `dense`: y[t] = sum_j weight[t, j] * FFN_{e_j}(x[t]) over kept assignments, then + FFN_s(x[t])
  for each shared expert s with weight 1 (DeepSeek's S shared experts of width I, Llama 4's one),
  FFN(x) = act(x W1 + b1) W2 + b2, grouped by expert; the routing weights already carry
  routed_scaling (routing.py). With scale_before_expert (Llama 4) a routed term is instead
  FFN_{e_j}(weight[t, j] * x[t]) with weight 1: the token row is scaled, in the path's compute
  dtype, and stored as the path stores a GEMM operand (bf16-rounded on the bf16 path), before GEMM0;
- `tile_walk`: the same output reached by executing the tile plan rank by rank: dispatch each
  tile's chunks (the routed rows of one source rank each) to the expert's owner, run the tile's
  GEMM0 tasks (column blocks of W1, bias, activation; a gated activation's task its block's gate
  and up columns) and GEMM1 tasks (column blocks of W2) on their rows together, send each chunk's
  rows back and combine them at its home rank.
`contributions` gives the dense formula's terms of any tokens, asking for one expert's weights at a
time, so a full-size layer is checked on a sample of its tokens from only the experts they chose,
holding one expert at once (`dense` is it over every expert of every token).
`dense` and `tile_walk` accumulate a token's contributions in one fixed order (choice 0, 1, .., k-1, then shared
experts 0, .., S-1), as the kernel must, so results are deterministic. Precision paths: float64
(the truth), float32, bfloat16 (operands and the GEMM0 output rounded to bf16, float32
accumulation, float32 output), and tf32 (float32 throughout, the expert GEMMs' operands -- tokens,
W1, the activation, W2 -- rounded to TF32 as they are multiplied; biases stay float32).
"""

from __future__ import annotations

import numpy as np

from . import plan as tile_plan
from .config import Config
from .numerics import activate, compute_dtype, gemm_operand, round_bf16, to_path
from .routing import Routing
from .weights import Weights


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want|: the error measure used everywhere in moelab."""
    want = np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) or 1.0
    return float(np.abs(np.asarray(got, np.float64) - want).max() / scale)


def _columns(cols: np.ndarray, width: int):
    """`cols` as an index; all columns in order become a slice, so no weight copy is made."""
    return slice(None) if cols.size == width and np.array_equal(cols, np.arange(width)) else cols


def _matmul(rows, w):
    """rows @ w; a few rows (but one) as (w.T @ rows.T).T, the same products, which OpenBLAS runs
    several times faster (its gemm of a few rows packs all of w first): the sampled checks' case."""
    return (w.T @ rows.T).T if 1 < rows.shape[0] < 256 else rows @ w


def _gemm0(cfg: Config, rows, w1, b1, cols: np.ndarray, path: str):
    """act(rows W1[:, cols] + b1[cols]); for a gated activation the gate and up columns of `cols` together."""
    if cfg.gated:
        cols = np.concatenate([cols, cfg.ffn + cols])
    cols = _columns(cols, w1.shape[1])
    h = activate(cfg.activation, _matmul(rows, w1[:, cols]) + b1[cols], cfg.swiglu_limit)
    return round_bf16(h) if path == "bfloat16" else h


def _scaled(rows, weight, path: str):
    """Token rows (n, H) as stored on the path times their routing weights (n, 1), in the path's
    compute dtype, stored again as the path's GEMM operand (scale_before_expert)."""
    return gemm_operand(to_path(rows * weight, path), path)


def _expert_ffn(cfg: Config, rows, w1, b1, w2, b2, path: str):
    h = _gemm0(cfg, rows, w1, b1, np.arange(cfg.ffn), path)
    return _matmul(gemm_operand(h, path), w2) + b2


def ordered_sum(contrib: np.ndarray) -> np.ndarray:
    """Sum over the choice axis (-2) in choice order, the fixed order of the kernel's combine."""
    y = contrib[..., 0, :].copy()
    for j in range(1, contrib.shape[-2]):
        y += contrib[..., j, :]
    return y


def _operands(w1, b1, w2, b2, path: str):
    """One expert's w1, b1, w2, b2 as the path's GEMMs read the weights and stores the biases."""
    return (gemm_operand(to_path(w1, path), path), to_path(b1, path),
            gemm_operand(to_path(w2, path), path), to_path(b2, path))


def contributions(cfg: Config, x, expert, weight, kept, experts, paths=("float64",)) -> dict[str, np.ndarray]:
    """Per path, the (n, k + S, H) contributions of n tokens to their outputs, expert by expert:
    `experts` yields (e, w1, b1, w2, b2) one expert at a time (e >= E: shared expert e - E), so only
    one expert's weights need be held, and each is used for every path before the next is asked
    for. x (n, H): the tokens as drawn (each path stores them with to_path); expert, weight, kept
    (n, k): their routing. A routed expert fills the (token, choice) rows that chose it and were
    kept, weighted (scale_before_expert: its rows scaled before GEMM0 instead); a shared expert s
    fills row k + s of every token with weight 1; rows no yielded expert fills stay zero.
    `ordered_sum` of a path's array is its output (`dense` is this over every expert)."""
    n, k = expert.shape
    dts = {path: compute_dtype(path) for path in paths}
    stored = {path: to_path(x, path) for path in paths}
    rows_in = {path: gemm_operand(stored[path], path) for path in paths}  # the tokens as GEMM0 reads them
    out = {path: np.zeros((n, k + cfg.shared_experts, cfg.hidden), dt) for path, dt in dts.items()}
    for e, *ws in experts:
        if e < cfg.experts:
            tt, jj = np.nonzero((expert == e) & kept)
        else:
            tt = np.arange(n)
            jj = np.full(n, k + e - cfg.experts)
        if not tt.size:
            continue
        for path, dt in dts.items():
            operands = _operands(*ws, path)
            if e >= cfg.experts:
                out[path][tt, jj] = dt(1) * _expert_ffn(cfg, rows_in[path][tt], *operands, path)
                continue
            w = weight[tt, jj].astype(dt)[:, None]
            if cfg.scale_before_expert:
                out[path][tt, jj] = _expert_ffn(cfg, _scaled(stored[path][tt], w, path), *operands, path)
            else:
                out[path][tt, jj] = w * _expert_ffn(cfg, rows_in[path][tt], *operands, path)
    return out


def dense(cfg: Config, w: Weights, routing: Routing, path: str = "float64") -> np.ndarray:
    """(P, T, H) output by the dense formula, grouped by expert."""
    p, t, k = routing.expert.shape
    every = ((e, w.w1[e], w.b1[e], w.w2[e], w.b2[e]) for e in range(cfg.experts + cfg.shared_experts))
    contrib = contributions(cfg, w.x.reshape(p * t, cfg.hidden), routing.expert.reshape(p * t, k),
                            routing.weight.reshape(p * t, k), routing.kept.reshape(p * t, k), every, (path,))[path]
    return ordered_sum(contrib).reshape(p, t, cfg.hidden)


def _task_columns(plan, lo: int, hi: int, kind: int) -> np.ndarray:
    """Output columns covered by the tasks [lo, hi) of `kind` (the plan's column blocks)."""
    sel = np.nonzero(plan.task_kind[lo:hi] == kind)[0] + lo
    starts, widths = plan.task_col0[sel], plan.task_cols[sel]
    return np.concatenate([np.arange(s, s + n) for s, n in zip(starts, widths)])


def tile_walk(cfg: Config, w: Weights, plan, path: str = "float64") -> np.ndarray:
    """(P, T, H) output by executing the tile plan rank by rank."""
    dt = compute_dtype(path)
    stored = to_path(w.x, path)
    x = gemm_operand(stored, path)
    k_all = cfg.top_k + cfg.shared_experts
    # each home rank keeps one float32/64 row per (token, choice): the combine target
    combine_buf = np.zeros((cfg.ranks, cfg.tokens, k_all, cfg.hidden), dt)
    task_lo = np.searchsorted(plan.task_tile, np.arange(plan.tile_expert.size + 1))
    for owner in range(cfg.ranks):
        cache: dict[int, tuple] = {}
        for tile in np.nonzero(plan.tile_owner == owner)[0]:
            e = int(plan.tile_expert[tile])
            chunks = [(int(plan.chunk_src[c]), plan.chunk_row_slice(c)) for c in plan.tile_chunks(tile)]
            # dispatch: each chunk's token rows come from its source rank into the tile's rows
            # (scale_before_expert: a routed expert's rows scaled by their weights on the way)
            prescale = cfg.scale_before_expert and e < cfg.experts
            if prescale:
                a = np.concatenate([_scaled(stored[src, plan.row_token[rows]],
                                            plan.row_weight[rows].astype(dt)[:, None], path) for src, rows in chunks])
            else:
                a = np.concatenate([x[src, plan.row_token[rows]] for src, rows in chunks])
            if e not in cache:
                cache[e] = _operands(w.w1[e], w.b1[e], w.w2[e], w.b2[e], path)
            w1, b1, w2, b2 = cache[e]
            lo, hi = int(task_lo[tile]), int(task_lo[tile + 1])
            h = np.empty((a.shape[0], cfg.ffn), dt)
            cols0 = _task_columns(plan, lo, hi, tile_plan.GEMM0)
            h[:, _columns(cols0, cfg.ffn)] = _gemm0(cfg, a, w1, b1, cols0, path)
            out = np.empty((a.shape[0], cfg.hidden), dt)
            cols1 = _columns(_task_columns(plan, lo, hi, tile_plan.GEMM1), cfg.hidden)
            out[:, cols1] = _matmul(gemm_operand(h, path), w2[:, cols1]) + b2[cols1]
            # combine: each chunk's rows go back to its source rank, weighted into their (token, choice) row
            at = 0
            for src, rows in chunks:
                n = rows.stop - rows.start
                if prescale:
                    combine_buf[src, plan.row_token[rows], plan.row_choice[rows]] = out[at: at + n]
                else:
                    weight = plan.row_weight[rows].astype(dt)[:, None]
                    combine_buf[src, plan.row_token[rows], plan.row_choice[rows]] = weight * out[at: at + n]
                at += n
    return ordered_sum(combine_buf)
