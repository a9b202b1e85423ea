"""Golden forward: dense formula == tile walk, == a naive token loop, and precision paths."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from naive_moe import moe as naive_moe

from reference import Config, golden, max_rel_error, plan, presets, routing, weights
from reference.config import ACTIVATIONS, GATES


def forward_all(cfg, w=None):
    w = w or weights.draw(cfg)
    r = routing.route(cfg, w.x, w.wg, w.gate_bias)
    return w, r, plan.build(cfg, r)


@st.composite
def configs(draw):
    ranks = draw(st.sampled_from([1, 2, 4]))
    experts = ranks * draw(st.integers(1, 4))
    tile_n = draw(st.sampled_from([8, 16]))
    cf = draw(st.sampled_from([None, 0.25, 0.5, 1.0, 1.5]))
    return Config(
        tokens=draw(st.integers(1, 40)), hidden=tile_n * draw(st.integers(1, 3)),
        ffn=tile_n * draw(st.integers(1, 3)), experts=experts,
        top_k=draw(st.integers(1, experts)), gate=draw(st.sampled_from(GATES)),
        capacity_factor=cf, activation=draw(st.sampled_from([a for a in ACTIVATIONS if a != "gelu"])),
        bias=draw(st.booleans()), shared_experts=draw(st.integers(0, 1)),
        skew=draw(st.sampled_from([0.0, 0.0, 3.0])), seed=draw(st.integers(0, 2**32)),
        ranks=ranks, gpus_per_node=draw(st.sampled_from([1, 2, 8])) if ranks > 1 else 8,
        tile_m=draw(st.sampled_from([4, 8, 32])), tile_n=tile_n, tile_k=tile_n)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_tile_walk_equals_dense_in_float64(cfg):
    w, r, tp = forward_all(cfg)
    dense = golden.dense(cfg, w, r, "float64")
    assert max_rel_error(golden.tile_walk(cfg, w, tp, "float64"), dense) < 1e-13


@settings(max_examples=25, deadline=None)
@given(configs())
def test_dense_equals_naive_token_loop(cfg):
    w, r, _ = forward_all(cfg)
    assert max_rel_error(golden.dense(cfg, w, r, "float64"), naive_moe(cfg, w)) < 1e-12


def skewed(cfg):
    """Inputs where nearly every token prefers expert 0: a large shared component of x along
    a direction that Wg maps onto expert 0."""
    w = weights.draw(cfg)
    x, wg = w.x.copy(), w.wg.copy()
    x[..., 0] = np.abs(x[..., 0]) + 4.0
    wg[0] = -1.0
    wg[0, 0] = 3.0
    return dataclasses.replace(w, x=x, wg=wg)


@pytest.mark.parametrize("changes", [
    dict(top_k=1), dict(top_k=8), dict(capacity_factor=0.1), dict(capacity_factor=None),
    dict(tokens=5, tile_m=32), dict(tokens=33, tile_m=32), dict(activation="gelu"),
    dict(activation="swiglu", shared_experts=2), dict(gate="sigmoid_bias", skew=2.0),
])
def test_edge_configs_all_paths(changes):
    cfg = presets.get("tiny").replace(**changes)
    w, r, tp = forward_all(cfg)
    truth = golden.dense(cfg, w, r, "float64")
    assert max_rel_error(golden.tile_walk(cfg, w, tp, "float64"), truth) < 1e-13
    assert max_rel_error(truth, naive_moe(cfg, w)) < 1e-12
    assert max_rel_error(golden.tile_walk(cfg, w, tp, "float32"), truth) < 1e-5
    assert max_rel_error(golden.dense(cfg, w, r, "float32"), truth) < 1e-5
    assert max_rel_error(golden.dense(cfg, w, r, "bfloat16"), truth) < 2e-2


def test_skewed_routing_drops_and_matches():
    cfg = presets.get("tiny")
    w, r, tp = forward_all(cfg, skewed(cfg))
    counts = r.counts(cfg.experts)
    assert (r.expert[..., 0] == 0).mean() > 0.9  # nearly every token's first choice
    assert counts[:, 0].tolist() == [cfg.capacity] * cfg.ranks  # expert 0 is full
    assert r.dropped > cfg.ranks * cfg.tokens // 2
    truth = golden.dense(cfg, w, r, "float64")
    assert max_rel_error(golden.tile_walk(cfg, w, tp, "float64"), truth) < 1e-13
    assert max_rel_error(truth, naive_moe(cfg, w)) < 1e-12


def test_dropped_tokens_contribute_nothing():
    cfg = presets.get("tiny").replace(capacity_factor=0.05, top_k=1, bias=False)
    w, r, _ = forward_all(cfg)
    y = golden.dense(cfg, w, r, "float64")
    dropped = ~r.kept[..., 0]
    assert dropped.sum() > cfg.tokens  # most tokens dropped
    assert np.all(y[dropped] == 0) and np.all(np.abs(y[~dropped]).sum(-1) > 0)


def test_precision_paths_differ_as_their_dtypes_do():
    cfg = presets.get("small").replace(tokens=128, ranks=2)
    w, r, _ = forward_all(cfg)
    truth = golden.dense(cfg, w, r, "float64")
    e32 = max_rel_error(golden.dense(cfg, w, r, "float32"), truth)
    ebf = max_rel_error(golden.dense(cfg, w, r, "bfloat16"), truth)
    assert 1e-9 < e32 < 1e-5 and 1e-4 < ebf < 2e-2


def test_round_bf16_ties_to_even():
    from reference.numerics import round_bf16

    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)  # bf16 spacing at 1
    vals = np.array([one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2 ** -20, -(one + ulp / 2)], np.float32)
    assert round_bf16(vals).tolist() == [1.0, 1 + 2 * ulp, 1 + ulp, -1.0]


def test_weights_are_reproducible_and_per_rank():
    cfg = presets.get("tiny")
    a, b = weights.draw(cfg), weights.draw(cfg)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("x", "wg", "w1", "w2"))
    assert np.array_equal(a.x[1], weights.tokens(cfg, 1))
    assert not np.array_equal(a.x[0], weights.draw(cfg.replace(seed=1)).x[0])
    assert abs(a.x.std() - 1) < 0.1 and abs(float((a.x[0] @ a.w1[0]).std()) - 1) < 0.2
