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


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["tiny", "tiny-nodrop", "tiny-deepseek"]), st.integers(0, 1000),
       st.sampled_from([None, 0.3, 1.0]))
def test_plan_invariants(name, seed, cf):
    cfg = presets.get(name).replace(seed=seed, capacity_factor=cf)
    r = reference.route_config(cfg)
    tp = plan.build(cfg, r)
    t, s = cfg.tokens, cfg.shared_experts
    # every kept assignment is one row, no padding; shared experts see every token
    assert tp.row_token.size == r.kept.sum() + cfg.ranks * t * s
    assert np.array_equal(tp.send_counts[:, : cfg.experts], r.counts(cfg.experts))
    if cfg.capacity is not None:
        assert tp.send_counts[:, : cfg.experts].max() <= cfg.capacity
    # tiles cover each block's rows exactly once, at most tile_m rows each
    covered = np.zeros(tp.row_token.size, int)
    for row0, rows in zip(tp.tile_row0, tp.tile_rows):
        covered[row0: row0 + rows] += 1
    assert np.all(covered == 1) and tp.tile_rows.max() <= cfg.tile_m and tp.tile_rows.min() >= 1
    # rows of a (src, expert) block are in slot order and name that block's tokens
    for src in range(cfg.ranks):
        for e in range(cfg.experts):
            rows = tp.block_rows(src, e)
            tt, jj = tp.row_token[rows], tp.row_choice[rows]
            assert np.all(r.expert[src, tt, jj] == e)
            assert r.slot[src, tt, jj].tolist() == list(range(len(tt)))
    # owners follow contiguous placement; shared experts stay home
    routed = tp.tile_expert < cfg.experts
    assert np.array_equal(tp.tile_owner[routed], tp.tile_expert[routed] // cfg.local_experts)
    assert np.array_equal(tp.tile_owner[~routed], tp.tile_src[~routed])
    # tasks: per tile I/bN GEMM0, H/bN GEMM1, one combine at home; columns tile the width
    per_tile = np.bincount(tp.task_tile, minlength=tp.tile_src.size)
    assert np.all(per_tile == cfg.ffn // cfg.tile_n + cfg.hidden // cfg.tile_n + 1)
    for kind, width in ((GEMM0, cfg.ffn), (GEMM1, cfg.hidden)):
        sel = tp.task_kind == kind
        assert tp.task_cols[sel].sum() == width * tp.tile_src.size
        assert np.array_equal(tp.task_rank[sel], tp.tile_owner[tp.task_tile[sel]])
    comb = tp.task_kind == COMBINE
    assert np.array_equal(tp.task_rank[comb], tp.tile_src[tp.task_tile[comb]])
    # transfers: one dispatch out and one return per tile, bytes = rows x H x dtype
    for kind, a, b in ((DISPATCH, tp.tile_src, tp.tile_owner), (RETURN, tp.tile_owner, tp.tile_src)):
        sel = tp.transfer_kind == kind
        assert np.array_equal(tp.transfer_src[sel], a) and np.array_equal(tp.transfer_dst[sel], b)
        assert tp.transfer_bytes[sel].sum() == tp.tile_rows.sum() * cfg.hidden * cfg.dtype_bytes


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
