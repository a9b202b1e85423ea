"""The tile plan: THE list of work of one layer call, derived from the routing.

The simulator schedules exactly these tiles and tasks and the kernel computes exactly them;
neither derives routing on its own. Everything is a plain NumPy array:

- blocks: one per (source rank, expert), b = src * n_experts + e with n_experts = E + S (shared
  experts last). The rows of block b, in slot order, are rows[block_offsets[b]:block_offsets[b+1]]
  and each row names the token (index on the source rank), its choice j (k + s for shared expert
  s) and its combine weight. Only routed rows are listed: no padding.
- tiles: the tile_m-row chunks of each non-empty block; a tile is dispatched from its source rank
  to the expert's owner, runs its GEMM tasks there and is combined back at the source rank.
- tasks: per tile, ffn / tile_n GEMM0 tasks (a tile_n-column block of I: x W1 + b1, activation),
  hidden / tile_n GEMM1 tasks (a tile_n-column block of H: h W2 + b2), and one combine task at
  the home rank (weighted accumulation of the returned rows). FLOPs and HBM bytes per task.
- transfers: per tile one dispatch (source -> owner) and one combine (owner -> source) transfer,
  with the bytes moved and the link class (local copy, NVLink inside a node, network).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Config
from .routing import Routing
from .weights import ffn_in_width

TASK_KINDS = ("gemm0", "gemm1", "combine")
GEMM0, GEMM1, COMBINE = range(3)
TRANSFER_KINDS = ("dispatch", "combine")
DISPATCH, RETURN = range(2)
LINKS = ("local", "nvlink", "network")
LOCAL, NVLINK, NETWORK = range(3)


@dataclass(frozen=True, eq=False)
class TilePlan:
    config: Config
    block_offsets: np.ndarray
    row_token: np.ndarray
    row_choice: np.ndarray
    row_weight: np.ndarray
    tile_src: np.ndarray
    tile_expert: np.ndarray
    tile_owner: np.ndarray
    tile_row0: np.ndarray
    tile_rows: np.ndarray
    task_kind: np.ndarray
    task_tile: np.ndarray
    task_rank: np.ndarray
    task_col0: np.ndarray
    task_cols: np.ndarray
    task_flops: np.ndarray
    task_bytes: np.ndarray
    transfer_kind: np.ndarray
    transfer_tile: np.ndarray
    transfer_src: np.ndarray
    transfer_dst: np.ndarray
    transfer_link: np.ndarray
    transfer_bytes: np.ndarray

    @property
    def n_experts(self) -> int:
        return self.config.experts + self.config.shared_experts

    @property
    def send_counts(self) -> np.ndarray:
        """(P, E + S) rows each source rank sends to each expert, padding-free."""
        return np.diff(self.block_offsets).reshape(self.config.ranks, self.n_experts)

    def block_rows(self, src: int, expert: int) -> slice:
        b = src * self.n_experts + expert
        return slice(int(self.block_offsets[b]), int(self.block_offsets[b + 1]))

    def summary(self) -> dict:
        kinds = np.bincount(self.task_kind, minlength=3)
        bytes_by_link = np.bincount(self.transfer_link, weights=self.transfer_bytes, minlength=3)
        return {
            "rows": int(self.row_token.size),
            "tiles": int(self.tile_src.size),
            **{f"{k}_tasks": int(n) for k, n in zip(TASK_KINDS, kinds)},
            "flops": int(self.task_flops.sum()),
            **{f"bytes_{name}": int(b) for name, b in zip(LINKS, bytes_by_link)},
        }


def link_class(cfg: Config, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    same_node = (src // cfg.gpus_per_node) == (dst // cfg.gpus_per_node)
    return np.where(src == dst, LOCAL, np.where(same_node, NVLINK, NETWORK)).astype(np.int8)


def _blocks(cfg: Config, routing: Routing):
    """Rows of every (source, expert) block in slot order: offsets, token, choice, weight."""
    p, t, k = routing.expert.shape
    n_exp = cfg.experts + cfg.shared_experts
    counts = np.zeros((p, n_exp), np.int64)
    counts[:, : cfg.experts] = routing.counts(cfg.experts)
    counts[:, cfg.experts:] = t
    offsets = np.zeros(p * n_exp + 1, np.int64)
    np.cumsum(counts.reshape(-1), out=offsets[1:])
    n = int(offsets[-1])
    token = np.empty(n, np.int32)
    choice = np.empty(n, np.int32)
    weight = np.empty(n, np.float64)
    for r in range(p):
        tt, jj = np.nonzero(routing.kept[r])
        e = routing.expert[r, tt, jj]
        pos = offsets[r * n_exp + e] + routing.slot[r, tt, jj]
        token[pos], choice[pos], weight[pos] = tt, jj, routing.weight[r, tt, jj]
        for s in range(cfg.shared_experts):
            lo = offsets[r * n_exp + cfg.experts + s]
            token[lo: lo + t], choice[lo: lo + t], weight[lo: lo + t] = np.arange(t), k + s, 1.0
    return offsets, token, choice, weight


def build(cfg: Config, routing: Routing) -> TilePlan:
    """The tile plan of one layer call."""
    offsets, token, choice, weight = _blocks(cfg, routing)
    n_exp = cfg.experts + cfg.shared_experts
    counts = np.diff(offsets)
    n_tiles_per_block = -(-counts // cfg.tile_m)
    block = np.repeat(np.arange(counts.size), n_tiles_per_block)
    chunk = np.arange(block.size) - np.repeat(np.cumsum(n_tiles_per_block) - n_tiles_per_block,
                                              n_tiles_per_block)
    tile_src = (block // n_exp).astype(np.int32)
    tile_expert = (block % n_exp).astype(np.int32)
    shared = tile_expert >= cfg.experts
    tile_owner = np.where(shared, tile_src, tile_expert // cfg.local_experts).astype(np.int32)
    tile_row0 = offsets[block] + chunk * cfg.tile_m
    tile_rows = np.minimum(cfg.tile_m, offsets[block + 1] - tile_row0).astype(np.int32)

    # tasks, tile-major: GEMM0 column blocks, GEMM1 column blocks, one combine
    n0, n1 = cfg.ffn // cfg.tile_n, cfg.hidden // cfg.tile_n
    per_tile = n0 + n1 + 1
    n_tiles = tile_src.size
    kind = np.tile(np.r_[np.full(n0, GEMM0), np.full(n1, GEMM1), COMBINE].astype(np.int8), n_tiles)
    col0 = np.tile(np.r_[np.arange(n0), np.arange(n1), 0] * cfg.tile_n, n_tiles).astype(np.int32)
    cols = np.where(kind == COMBINE, cfg.hidden, cfg.tile_n).astype(np.int32)
    task_tile = np.repeat(np.arange(n_tiles, dtype=np.int32), per_tile)
    rows = tile_rows[task_tile].astype(np.int64)
    task_rank = np.where(kind == COMBINE, tile_src[task_tile], tile_owner[task_tile]).astype(np.int32)
    widen = ffn_in_width(cfg) // cfg.ffn  # swiglu computes gate and up columns in one task
    depth = np.select([kind == GEMM0, kind == GEMM1], [cfg.hidden, cfg.ffn], 1)
    flops = np.where(kind == COMBINE, 2 * rows * cfg.hidden,
                     2 * rows * depth * cols * np.where(kind == GEMM0, widen, 1))
    nb = cfg.dtype_bytes
    # operand A + weight block B (+ bias) read, output written; combine reads the rows and
    # reads/writes the float32 accumulator of its choice
    gemm_bytes = nb * (rows * depth + depth * cols * np.where(kind == GEMM0, widen, 1) + rows * cols)
    task_bytes = np.where(kind == COMBINE, rows * cfg.hidden * (nb + 4), gemm_bytes)

    # transfers, tile-major: dispatch then combine
    x_tile = np.repeat(np.arange(n_tiles, dtype=np.int32), 2)
    x_kind = np.tile(np.array([DISPATCH, RETURN], np.int8), n_tiles)
    x_src = np.where(x_kind == DISPATCH, tile_src[x_tile], tile_owner[x_tile]).astype(np.int32)
    x_dst = np.where(x_kind == DISPATCH, tile_owner[x_tile], tile_src[x_tile]).astype(np.int32)
    x_bytes = tile_rows[x_tile].astype(np.int64) * cfg.hidden * nb

    return TilePlan(
        config=cfg, block_offsets=offsets, row_token=token, row_choice=choice, row_weight=weight,
        tile_src=tile_src, tile_expert=tile_expert, tile_owner=tile_owner,
        tile_row0=tile_row0.astype(np.int64), tile_rows=tile_rows,
        task_kind=kind, task_tile=task_tile, task_rank=task_rank, task_col0=col0, task_cols=cols,
        task_flops=flops.astype(np.int64), task_bytes=task_bytes.astype(np.int64),
        transfer_kind=x_kind, transfer_tile=x_tile, transfer_src=x_src, transfer_dst=x_dst,
        transfer_link=link_class(cfg, x_src, x_dst), transfer_bytes=x_bytes,
    )
