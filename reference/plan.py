"""The tile plan: THE list of work of one layer call, derived from the routing.

The simulator schedules exactly these tiles and tasks and the kernel computes exactly them;
neither derives routing on its own. Everything is a plain NumPy array:

- blocks: one per (source rank, expert), b = src * n_experts + e with n_experts = E + S (shared
  experts last). The rows of block b, in slot order, are rows[block_offsets[b]:block_offsets[b+1]]
  and each row names the token (index on the source rank), its choice j (k + s for shared expert
  s) and its combine weight. Only routed rows are listed: no padding.
- tiles: the GEMM work of an expert at its owner. A routed expert's slots are laid out source by
  source, `source_stride` positions apart (block s's slot q at position s * stride + q), and tile
  w is the window of positions [w * tile_m, (w + 1) * tile_m); windows holding no row have no
  tile. With cfg.merge_sources the stride is C (Config.slots), so an expert's few rows from many
  sources fill one tile; without, it is C rounded up to whole tiles, so a tile holds one source's
  rows. A tile computes its positions up to its last row (tile_rows): the unused slots between
  two sources' rows ride along, and their outputs are never read. A shared expert's tiles are
  its source's own (owner = source), windows over that block alone.
- chunks: the rows of one block inside one tile; a chunk moves from its source to the owner
  (dispatch), and back (combine transfer) once its tile's GEMM1 tasks are done.
- rows: each row's token, choice and weight. The weight is the combine weight, or with
  cfg.scale_before_expert (a routed row) the factor its token row is multiplied by before GEMM0,
  its output then combined with weight 1 (golden.py).
- tasks: per tile, GEMM0 tasks (a column block of I: x W1 + b1, activation) and GEMM1 tasks (a
  column block of H: h W2 + b2), every block block_width columns wide but the last, which holds
  the rest (column_blocks of them; task_col0, task_cols). A task multiplies tile_n columns of its
  weight matrix: a gated activation's GEMM0 task, a block of tile_n / 2 columns of I, computes
  their gate columns and the matching up columns (W1's columns c and I + c, tile_n in all) and
  writes act(gate, up): twice the weight columns and FLOPs of its output columns
  (weight_columns), GEMM1 reading I. Per chunk one combine task at its source (weighted
  accumulation of the returned rows). FLOPs and HBM bytes per task.
- transfers: per chunk one dispatch (source -> owner) and one combine (owner -> source) transfer,
  with the bytes moved and the link class (local copy, NVLink inside a node, network). A shared
  expert's chunk has no dispatch: its tile is at its tokens' own rank and reads them in place (its
  tile w holds tokens w * tile_m ..), ready once the gate is done; its return is a local one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
    tile_expert: np.ndarray
    tile_owner: np.ndarray
    tile_window: np.ndarray
    tile_rows: np.ndarray
    chunk_tile: np.ndarray
    chunk_src: np.ndarray
    chunk_slot0: np.ndarray
    chunk_rows: np.ndarray
    task_kind: np.ndarray
    task_tile: np.ndarray
    task_chunk: np.ndarray
    task_rank: np.ndarray
    task_col0: np.ndarray
    task_cols: np.ndarray
    task_flops: np.ndarray
    task_bytes: np.ndarray
    transfer_kind: np.ndarray
    transfer_chunk: np.ndarray
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

    @cached_property
    def chunk_lo(self) -> np.ndarray:
        """Chunks are tile-major: tile t's are chunk_lo[t]:chunk_lo[t + 1]."""
        return np.searchsorted(self.chunk_tile, np.arange(self.tile_expert.size + 1))

    def tile_chunks(self, tile: int) -> range:
        return range(int(self.chunk_lo[tile]), int(self.chunk_lo[tile + 1]))

    def chunk_row_slice(self, chunk: int) -> slice:
        """The chunk's rows in the row arrays (row_token, row_choice, row_weight)."""
        b = int(self.chunk_src[chunk]) * self.n_experts + int(self.tile_expert[self.chunk_tile[chunk]])
        lo = int(self.block_offsets[b]) + int(self.chunk_slot0[chunk])
        return slice(lo, lo + int(self.chunk_rows[chunk]))

    def summary(self) -> dict:
        kinds = np.bincount(self.task_kind, minlength=3)
        bytes_by_link = np.bincount(self.transfer_link, weights=self.transfer_bytes, minlength=3)
        return {
            "rows": int(self.row_token.size),
            "tiles": int(self.tile_expert.size),
            "chunks": int(self.chunk_src.size),
            **{f"{k}_tasks": int(n) for k, n in zip(TASK_KINDS, kinds)},
            "flops": int(self.task_flops.sum()),
            **{f"bytes_{name}": int(b) for name, b in zip(LINKS, bytes_by_link)},
        }


def block_width(cfg: Config, kind: int) -> int:
    """Output columns of a GEMM task of `kind` (but a ragged last one): tile_n, or tile_n / 2 for a
    gated GEMM0 task, whose tile_n weight columns are those columns' gate and up halves."""
    return cfg.tile_n // 2 if kind == GEMM0 and cfg.gated else cfg.tile_n


def column_blocks(cfg: Config, kind: int) -> int:
    """GEMM tasks of `kind` per tile: its output columns (I for GEMM0, H for GEMM1) in blocks of
    block_width, the last the rest."""
    return -(-(cfg.ffn if kind == GEMM0 else cfg.hidden) // block_width(cfg, kind))


def weight_columns(cfg: Config, kind: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Columns of its weight matrix a task of `kind` with `cols` output columns reads: a gated
    GEMM0 task both its gate and its up columns (2 x cols), any other GEMM task cols."""
    widen = ffn_in_width(cfg) // cfg.ffn
    return np.where(np.asarray(kind) == GEMM0, widen, 1) * np.asarray(cols)


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


def _within(sizes: np.ndarray) -> np.ndarray:
    """0, 1, .., n - 1 for each group of n in `sizes`, concatenated: an item's place in its group."""
    return np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def source_stride(cfg: Config) -> int:
    """Positions between two sources' slots in a routed expert's tile windows: C merged, else C
    rounded up to whole tiles (each source's rows in tiles of their own)."""
    c = cfg.slots
    return c if cfg.merge_sources else -(-c // cfg.tile_m) * cfg.tile_m


def chunk_slots(cfg: Config) -> int:
    """The most chunks a (source, routed expert) block of C slots can be cut into: the windows
    its slots can touch, from wherever in a window its source's first slot falls."""
    c, m, stride = cfg.slots, cfg.tile_m, source_stride(cfg)
    return max((s * stride % m + c - 1) // m + 1 for s in range(min(cfg.ranks, m)))


def windows(cfg: Config, send_counts: np.ndarray):
    """Tiles and chunks of a layer call whose (P, E + S) blocks hold `send_counts` rows.

    Returns (tile_expert, tile_owner, tile_window, tile_rows) and (chunk_tile, chunk_src,
    chunk_slot0, chunk_rows): tiles routed experts first, each expert's in window order, then the
    shared experts' source by source; a tile's chunks in source order. The kernel numbers its
    tiles (expert, window) the same way (gpu/kernels/tiles.cuh)."""
    counts = np.asarray(send_counts, np.int64)
    p, m = cfg.ranks, cfg.tile_m
    n_exp = cfg.experts + cfg.shared_experts
    if counts.shape != (p, n_exp):
        raise ValueError(f"send counts have shape {counts.shape}, expected ({p}, {n_exp})")
    # (expert, source, window) of every chunk: routed blocks at source * stride, shared at 0
    stride = source_stride(cfg)
    src, exp = np.nonzero(counts > 0)
    n = counts[src, exp]
    shared = exp >= cfg.experts
    start = np.where(shared, 0, src * stride)
    first, last = start // m, (start + n - 1) // m
    per_block = last - first + 1
    c_src = np.repeat(src, per_block)
    c_exp = np.repeat(exp, per_block)
    c_start, c_n = np.repeat(start, per_block), np.repeat(n, per_block)
    c_win = np.repeat(first, per_block) + _within(per_block)
    lo = np.maximum(c_win * m, c_start)
    hi = np.minimum((c_win + 1) * m, c_start + c_n)
    c_slot0, c_rows = lo - c_start, hi - lo
    c_shared = c_exp >= cfg.experts
    # tile key: routed (expert, window); shared after them, (source, expert, window)
    owner_of = np.where(c_shared, c_src, c_exp // cfg.local_experts)
    big = int(c_win.max(initial=0)) + 1
    key = np.where(c_shared, (n_exp + c_src * n_exp + c_exp) * big + c_win, c_exp * big + c_win)
    order = np.lexsort((c_src, key))
    key, c_src, c_exp, c_win, c_slot0, c_rows = (a[order] for a in (key, c_src, c_exp, c_win, c_slot0, c_rows))
    owner_of, hi = owner_of[order], hi[order]
    new = np.r_[True, key[1:] != key[:-1]] if key.size else np.zeros(0, bool)
    chunk_tile = (np.cumsum(new) - 1).astype(np.int32)
    heads = np.flatnonzero(new)
    tile_expert = c_exp[heads].astype(np.int32)
    tile_owner = owner_of[heads].astype(np.int32)
    tile_window = c_win[heads].astype(np.int32)
    # computed rows: from the window's first position to the tile's last row
    end = np.maximum.reduceat(hi, heads) if heads.size else np.zeros(0, np.int64)
    tile_rows = (end - tile_window.astype(np.int64) * m).astype(np.int32)
    return ((tile_expert, tile_owner, tile_window, tile_rows),
            (chunk_tile, c_src.astype(np.int32), c_slot0.astype(np.int32), c_rows.astype(np.int32)))


def build(cfg: Config, routing: Routing) -> TilePlan:
    """The tile plan of one layer call."""
    return _build(cfg, *_blocks(cfg, routing))


def from_counts(cfg: Config, send_counts: np.ndarray) -> TilePlan:
    """The tile plan of a layer call known only by the (P, E) rows each GPU sent each routed expert
    (a measured call, whose tokens were drawn on the GPU): its tiles, chunks, tasks and transfers
    are the call's own; which token and choice each row holds is not known (-1, weights NaN)."""
    counts = np.asarray(send_counts)
    if counts.shape != (cfg.ranks, cfg.experts) or counts.dtype.kind not in "iu" or np.any(counts < 0):
        raise ValueError(f"send_counts of shape {counts.shape}: {cfg.ranks} x {cfg.experts} (GPUs x routed experts) "
                         "counts of rows >= 0 are allowed")
    full = np.concatenate([counts.astype(np.int64), np.full((cfg.ranks, cfg.shared_experts), cfg.tokens)], axis=1)
    offsets = np.zeros(full.size + 1, np.int64)
    np.cumsum(full.reshape(-1), out=offsets[1:])
    n = int(offsets[-1])
    return _build(cfg, offsets, np.full(n, -1, np.int32), np.full(n, -1, np.int32), np.full(n, np.nan))


def _build(cfg: Config, offsets: np.ndarray, token: np.ndarray, choice: np.ndarray, weight: np.ndarray) -> TilePlan:
    """The plan of a call whose (source, expert) blocks start at `offsets`, their rows' tokens,
    choices and weights."""
    n_exp = cfg.experts + cfg.shared_experts
    counts = np.diff(offsets).reshape(cfg.ranks, n_exp)
    (tile_expert, tile_owner, tile_window, tile_rows), (c_tile, c_src, c_slot0, c_rows) = windows(cfg, counts)
    n_tiles, n_chunks = tile_expert.size, c_tile.size

    # tasks, tile-major: GEMM0 column blocks, GEMM1 column blocks, then a combine per chunk
    n0, n1 = column_blocks(cfg, GEMM0), column_blocks(cfg, GEMM1)
    chunks_of = np.bincount(c_tile, minlength=n_tiles)
    per_tile = n0 + n1 + chunks_of
    task_tile = np.repeat(np.arange(n_tiles, dtype=np.int32), per_tile)
    at = _within(per_tile)
    kind = np.select([at < n0, at < n0 + n1], [GEMM0, GEMM1], COMBINE).astype(np.int8)
    col0 = np.where(at < n0, at * block_width(cfg, GEMM0), (at - n0) * block_width(cfg, GEMM1))
    col0 = (col0 * (kind != COMBINE)).astype(np.int32)
    width = np.select([kind == GEMM0, kind == GEMM1], [cfg.ffn, cfg.hidden], cfg.hidden)
    # the last column block of a GEMM holds what is left of its width
    block = np.where(kind == GEMM0, block_width(cfg, GEMM0), block_width(cfg, GEMM1))
    cols = np.where(kind == COMBINE, cfg.hidden, np.minimum(block, width - col0)).astype(np.int32)
    # combine tasks take the tile's chunks in order (chunks are tile-major)
    chunk_base = np.cumsum(chunks_of) - chunks_of
    task_chunk = np.where(kind == COMBINE, chunk_base[task_tile] + at - n0 - n1, -1).astype(np.int32)
    combine = task_chunk >= 0
    rows = np.where(combine, c_rows[np.maximum(task_chunk, 0)], tile_rows[task_tile]).astype(np.int64)
    task_rank = np.where(combine, c_src[np.maximum(task_chunk, 0)], tile_owner[task_tile]).astype(np.int32)
    depth = np.select([kind == GEMM0, kind == GEMM1], [cfg.hidden, cfg.ffn], 1)
    wcols = weight_columns(cfg, kind, cols)  # a gated GEMM0 task computes gate and up columns
    flops = np.where(kind == COMBINE, 2 * rows * cfg.hidden, 2 * rows * depth * wcols)
    nb = cfg.dtype_bytes
    # operand A + weight block B (+ bias) read, output written; combine reads the rows and
    # reads/writes the float32 accumulator of its choice
    gemm_bytes = nb * (rows * depth + depth * wcols + rows * cols)
    task_bytes = np.where(kind == COMBINE, rows * cfg.hidden * (nb + 4), gemm_bytes)

    # transfers, chunk-major: dispatch then combine; a shared expert's chunk is not dispatched (its
    # tile's GEMM0 reads the tokens where they are), only its rows' return to the combine is listed
    routed = tile_expert[c_tile] < cfg.experts
    x_chunk = np.repeat(np.arange(n_chunks, dtype=np.int32), 1 + routed)
    x_kind = np.where(_within(1 + routed.astype(np.int64)) < routed[x_chunk], DISPATCH, RETURN).astype(np.int8)
    owner = tile_owner[c_tile[x_chunk]]
    x_src = np.where(x_kind == DISPATCH, c_src[x_chunk], owner).astype(np.int32)
    x_dst = np.where(x_kind == DISPATCH, owner, c_src[x_chunk]).astype(np.int32)
    x_bytes = c_rows[x_chunk].astype(np.int64) * cfg.hidden * nb

    return TilePlan(
        config=cfg, block_offsets=offsets, row_token=token, row_choice=choice, row_weight=weight,
        tile_expert=tile_expert, tile_owner=tile_owner, tile_window=tile_window, tile_rows=tile_rows,
        chunk_tile=c_tile, chunk_src=c_src, chunk_slot0=c_slot0, chunk_rows=c_rows,
        task_kind=kind, task_tile=task_tile, task_chunk=task_chunk, task_rank=task_rank, task_col0=col0,
        task_cols=cols, task_flops=flops.astype(np.int64), task_bytes=task_bytes.astype(np.int64),
        transfer_kind=x_kind, transfer_chunk=x_chunk, transfer_tile=c_tile[x_chunk].astype(np.int32),
        transfer_src=x_src, transfer_dst=x_dst, transfer_link=link_class(cfg, x_src, x_dst),
        transfer_bytes=x_bytes,
    )
