"""Routing rules (ties, capacity priority, gate weights) and tile-plan invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from reference import Config, plan, presets, routing
from reference.plan import COMBINE, DISPATCH, GEMM0, GEMM1, LOCAL, NETWORK, NVLINK, RETURN


def test_ties_go_to_the_lower_expert():
    cfg = Config(experts=4, top_k=2, hidden=64, ffn=64)
    z = np.array([[1.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0]])
    top, _ = routing.select(cfg, z, np.zeros(4))
    assert top.tolist() == [[1, 2], [0, 1]]


def test_capacity_priority_is_choice_then_token():
    cfg = Config(tokens=4, experts=2, top_k=2, capacity_factor=0.5, hidden=64, ffn=64)  # C = 2
    top = np.array([[0, 1], [0, 1], [1, 0], [0, 1]], np.int32)
    # expert 0: first choices of tokens 0, 1, 3 (slots 0, 1, dropped), second choice of token 2
    # expert 1: first choice of token 2 (slot 0), then second choices of tokens 0, 1, 3
    assert routing.assign_slots(cfg, top).tolist() == [[0, 1], [1, -1], [0, -1], [-1, -1]]


@pytest.mark.parametrize("gate", ["softmax_topk", "softmax_topk_renorm", "topk_softmax", "sigmoid_bias"])
def test_gate_weights(gate):
    cfg = Config(experts=8, top_k=3, gate=gate, hidden=64, ffn=64)
    z = np.random.default_rng(0).standard_normal((50, 8))
    top, w = routing.select(cfg, z, np.zeros(8))
    assert np.all(w > 0)
    if gate == "softmax_topk":
        assert np.all(w.sum(-1) < 1) and np.all(np.diff(w, axis=-1) <= 0)
    else:
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.diff(np.take_along_axis(z, top, -1), axis=-1) <= 0)  # best first


def test_sigmoid_bias_only_changes_selection():
    cfg = Config(experts=4, top_k=1, gate="sigmoid_bias", hidden=64, ffn=64)
    z = np.array([[0.0, 0.1, 0.2, 0.3]])
    top, w = routing.select(cfg, z, np.array([5.0, 0, 0, 0]))
    assert top.tolist() == [[0]] and w.tolist() == [[1.0]]


def chunk_positions(cfg, tp):
    """Each chunk's first position in its expert's windows: source by source for a routed expert,
    its own block alone for a shared one."""
    routed = tp.tile_expert[tp.chunk_tile] < cfg.experts
    return np.where(routed, tp.chunk_src * plan.source_stride(cfg), 0) + tp.chunk_slot0


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["tiny", "tiny-nodrop", "tiny-deepseek"]), st.integers(0, 1000),
       st.sampled_from([None, 0.3, 1.0]), st.booleans(), st.sampled_from([8, 16, 32]), st.sampled_from([32, 24, 48]))
def test_plan_invariants(name, seed, cf, merge, tile_m, tile_n):
    cfg = presets.get(name).replace(seed=seed, capacity_factor=cf, merge_sources=merge, tile_m=tile_m, tile_n=tile_n)
    r = reference.route_config(cfg)
    tp = plan.build(cfg, r)
    t, s, m = cfg.tokens, cfg.shared_experts, cfg.tile_m
    n_tiles, n_chunks = tp.tile_expert.size, tp.chunk_src.size
    # every kept assignment is one row, no padding; shared experts see every token
    assert tp.row_token.size == r.kept.sum() + cfg.ranks * t * s
    assert np.array_equal(tp.send_counts[:, : cfg.experts], r.counts(cfg.experts))
    if cfg.capacity is not None:
        assert tp.send_counts[:, : cfg.experts].max() <= cfg.capacity
    # chunks cover every row exactly once, each a run of one block's slots from its first on
    covered = np.zeros(tp.row_token.size, int)
    for c in range(n_chunks):
        rows = tp.chunk_row_slice(c)
        covered[rows] += 1
        block = tp.block_rows(int(tp.chunk_src[c]), int(tp.tile_expert[tp.chunk_tile[c]]))
        assert block.start <= rows.start and rows.stop <= block.stop
    assert np.all(covered == 1) and tp.chunk_rows.min() >= 1
    # chunks are tile-major, in source order within a tile; one chunk per (tile, source)
    assert np.all(np.diff(tp.chunk_tile) >= 0) and np.array_equal(np.unique(tp.chunk_tile), np.arange(n_tiles))
    same = tp.chunk_tile[1:] == tp.chunk_tile[:-1]
    assert np.all(tp.chunk_src[1:][same] > tp.chunk_src[:-1][same])
    # a chunk's rows lie in its tile's window; the tile computes from the window's start to its last row
    pos = chunk_positions(cfg, tp)
    w0 = tp.tile_window[tp.chunk_tile].astype(np.int64) * m
    assert np.all(pos >= w0) and np.all(pos + tp.chunk_rows <= w0 + m)
    end = np.zeros(n_tiles, np.int64)
    np.maximum.at(end, tp.chunk_tile, pos + tp.chunk_rows - w0)
    assert np.array_equal(tp.tile_rows, end) and tp.tile_rows.max() <= m
    # tiles of one expert are distinct windows; a block is cut into at most chunk_slots chunks
    assert np.unique(np.c_[tp.tile_expert, tp.tile_owner, tp.tile_window], axis=0).shape[0] == n_tiles
    routed_chunk = tp.tile_expert[tp.chunk_tile] < cfg.experts
    per_block = np.bincount(tp.chunk_src[routed_chunk] * cfg.experts + tp.tile_expert[tp.chunk_tile[routed_chunk]])
    assert per_block.max(initial=0) <= plan.chunk_slots(cfg)
    if not merge or cfg.ranks == 1:  # each (source, expert) block has tiles of its own
        assert np.array_equal(tp.chunk_tile, np.arange(n_tiles)) and np.all(tp.chunk_slot0 % m == 0)
    # rows of a (src, expert) block are in slot order and name that block's tokens
    for src in range(cfg.ranks):
        for e in range(cfg.experts):
            rows = tp.block_rows(src, e)
            tt, jj = tp.row_token[rows], tp.row_choice[rows]
            assert np.all(r.expert[src, tt, jj] == e)
            assert r.slot[src, tt, jj].tolist() == list(range(len(tt)))
    # owners follow contiguous placement; shared experts stay home, their tiles of one source
    routed = tp.tile_expert < cfg.experts
    assert np.array_equal(tp.tile_owner[routed], tp.tile_expert[routed] // cfg.local_experts)
    assert np.array_equal(tp.chunk_src[~routed_chunk], tp.tile_owner[tp.chunk_tile[~routed_chunk]])
    # tasks: per tile ceil(I/b0) GEMM0 (b0 = bN, or bN/2 gated: bN weight columns, gate and up) and
    # ceil(H/bN) GEMM1 at the owner, one combine per chunk at its source
    b0 = cfg.tile_n // 2 if cfg.activation == "swiglu" else cfg.tile_n
    chunks_of = np.bincount(tp.chunk_tile, minlength=n_tiles)
    per_tile = np.bincount(tp.task_tile, minlength=n_tiles)
    assert np.array_equal(per_tile, -(-cfg.ffn // b0) - (-cfg.hidden // cfg.tile_n) + chunks_of)
    for kind, width, b in ((GEMM0, cfg.ffn, b0), (GEMM1, cfg.hidden, cfg.tile_n)):
        sel = tp.task_kind == kind
        assert tp.task_cols[sel].sum() == width * n_tiles and np.all(tp.task_chunk[sel] == -1)
        # column blocks of b from 0 on, the last the rest of the width (ragged where b does not divide it)
        n = -(-width // b)
        assert np.array_equal(tp.task_col0[sel], np.tile(np.arange(n) * b, n_tiles))
        assert np.array_equal(tp.task_cols[sel], np.tile([b] * (n - 1) + [width - (n - 1) * b], n_tiles))
        # every task multiplies tile_n weight columns but a ragged last one
        assert np.all(plan.weight_columns(cfg, tp.task_kind[sel], tp.task_cols[sel]) <= cfg.tile_n)
        assert np.array_equal(tp.task_rank[sel], tp.tile_owner[tp.task_tile[sel]])
    comb = tp.task_kind == COMBINE
    assert np.array_equal(tp.task_chunk[comb], np.arange(n_chunks))
    assert np.array_equal(tp.task_rank[comb], tp.chunk_src) and np.array_equal(tp.task_tile[comb], tp.chunk_tile)
    # transfers: one dispatch out per routed chunk (a shared expert's rows are read in place) and one
    # return per chunk, bytes = rows x H x dtype
    for kind, chunks in ((DISPATCH, np.flatnonzero(routed_chunk)), (RETURN, np.arange(n_chunks))):
        a, b = tp.chunk_src[chunks], tp.tile_owner[tp.chunk_tile[chunks]]
        sel = tp.transfer_kind == kind
        assert np.array_equal(tp.transfer_chunk[sel], chunks)
        assert np.array_equal(tp.transfer_tile[sel], tp.chunk_tile[chunks])
        a, b = (a, b) if kind == DISPATCH else (b, a)
        assert np.array_equal(tp.transfer_src[sel], a) and np.array_equal(tp.transfer_dst[sel], b)
        assert np.array_equal(tp.transfer_bytes[sel], tp.chunk_rows[chunks].astype(np.int64) * cfg.hidden
                              * cfg.dtype_bytes)


@pytest.mark.parametrize("changes", [dict(ranks=2, merge_sources=False), dict(ranks=1, merge_sources=True),
                                     dict(ranks=2, merge_sources=True, tokens=128, capacity_factor=1.0)])
def test_tiles_of_one_source(changes):
    """Without merging, on one rank, or with C a multiple of tile_m (here 128 x 4 / 16 = 32 slots), a
    tile is one chunk: up to tile_m rows of one (source, expert) block, from a whole tile's slot on."""
    cfg = presets.get("tiny-deepseek").replace(**changes)
    assert not cfg.merge_sources or cfg.ranks == 1 or cfg.slots % cfg.tile_m == 0
    tp = reference.plan_of(cfg)
    assert np.array_equal(tp.chunk_tile, np.arange(tp.tile_expert.size))
    counts = tp.send_counts[tp.chunk_src, tp.tile_expert]
    assert np.all(tp.chunk_slot0 % cfg.tile_m == 0)
    assert np.array_equal(tp.chunk_rows, np.minimum(cfg.tile_m, counts - tp.chunk_slot0))
    assert np.array_equal(tp.tile_rows, tp.chunk_rows)


def test_merged_sources_share_tiles():
    """Two GPUs, 1024 tokens of the FlashMoE layer: C = 32 slots per (source, expert), under a tile
    of 128 rows. Merged, an expert's rows from both sources fill one tile (two chunks); apart,
    each source's take a tile of their own: twice the tiles, the same rows and bytes moved."""
    cfg = presets.get("flashmoe").replace(ranks=2, tokens=1024)
    assert cfg.slots == 32 < cfg.tile_m
    merged, apart = (reference.plan_of(cfg.replace(merge_sources=m)) for m in (True, False))
    assert 2 * merged.tile_expert.size == apart.tile_expert.size == 2 * cfg.experts
    assert merged.chunk_src.size == apart.chunk_src.size == apart.tile_expert.size
    assert np.all(np.bincount(merged.chunk_tile) == 2)
    assert np.array_equal(merged.tile_rows, 32 + merged.chunk_rows[1::2])  # the second source's rows start at C
    for key in ("rows", "chunks", "combine_tasks", "bytes_local", "bytes_nvlink"):
        assert merged.summary()[key] == apart.summary()[key]
    assert merged.summary()["gemm0_tasks"] * 2 == apart.summary()["gemm0_tasks"]


def test_link_classes_and_flops():
    cfg = presets.get("tiny-nodrop")  # 4 ranks, 2 GPUs per node
    tp = reference.plan_of(cfg)
    same = tp.transfer_src == tp.transfer_dst
    node = lambda r: r // cfg.gpus_per_node  # noqa: E731
    assert np.all(tp.transfer_link[same] == LOCAL)
    cross = node(tp.transfer_src) != node(tp.transfer_dst)
    assert np.all(tp.transfer_link[cross] == NETWORK)
    assert np.all(tp.transfer_link[~same & ~cross] == NVLINK)
    rows = tp.tile_rows.sum()
    gemm = np.isin(tp.task_kind, (GEMM0, GEMM1))
    assert tp.task_flops[gemm].sum() == 2 * rows * cfg.hidden * cfg.ffn * 2


def test_plan_at_eight_ranks():
    cfg = presets.get("flashmoe-gpus-8").replace(tokens=512, hidden=128, ffn=128)
    tp = reference.plan_of(cfg)
    assert set(tp.tile_owner.tolist()) == set(range(8))
    assert np.array_equal(np.unique(tp.tile_expert // 8), np.arange(8))


@pytest.mark.parametrize("changes", [dict(ranks=2, capacity_factor=1.25, skew=1.0), dict(ranks=4, shared_experts=1),
                                     dict(ranks=2, activation="swiglu")])
def test_a_plan_from_the_send_counts_alone_is_the_calls_own(changes):
    """A measured call is known by the rows each GPU sent each expert: its tiles, chunks, tasks and
    transfers are the seeded plan's when the counts are; the rows' tokens are not known."""
    cfg = presets.get("small").replace(seed=int(np.random.default_rng().integers(1 << 30)), **changes)
    seeded = reference.plan_of(cfg)
    counted = plan.from_counts(cfg, seeded.send_counts[:, : cfg.experts])
    for f in ("block_offsets", "tile_expert", "tile_owner", "tile_rows", "chunk_tile", "chunk_src", "chunk_rows",
              "task_kind", "task_tile", "task_cols", "task_flops", "task_bytes", "transfer_src", "transfer_dst",
              "transfer_bytes"):
        assert np.array_equal(getattr(seeded, f), getattr(counted, f)), f
    assert np.all(counted.row_token == -1) and np.all(np.isnan(counted.row_weight))
    routed = seeded.send_counts[:, : cfg.experts]
    for bad in (routed[:, 1:], -routed, routed * 0.5):
        with pytest.raises(ValueError, match="send_counts"):
            plan.from_counts(cfg, bad)
