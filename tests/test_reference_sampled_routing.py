"""The routing across nodes (reference.route_config): gate logits drawn from their law (y R with
Wg = Q R) route as the golden's tokens do, in distribution; one node keeps the golden's routing."""

import numpy as np
import pytest

from reference import Config, route_config, routing, weights


def layer(ranks, per_node, seed, **changes):
    fields = dict(name="sampled", tokens=512, hidden=256, ffn=64, experts=32, top_k=4, ranks=ranks,
                  gpus_per_node=per_node, seed=seed, capacity_factor=1.25, precision="float32")
    return Config(**{**fields, **changes})


@pytest.mark.parametrize("hidden, experts", [(256, 32), (16, 32)])
def test_the_factor_carries_the_gates_covariance(hidden, experts):
    cfg = layer(2, 1, int(np.random.default_rng().integers(1 << 30)), hidden=hidden, experts=experts)
    wg, _ = weights.gate(cfg)
    r = routing.gate_factor(cfg, wg)
    assert r.shape == (min(hidden, experts), experts)
    np.testing.assert_allclose(r.T @ r, wg.astype(np.float64).T @ wg.astype(np.float64), atol=1e-12)


@pytest.mark.parametrize("gate, changes", [("softmax_topk_renorm", {}), ("topk_softmax", {"router_bias": True}),
                                           ("sigmoid_bias", {"n_group": 4, "topk_group": 2}),
                                           ("softmax_topk", {"skew": 1.0})])
def test_sampled_logits_route_as_the_tokens_do(gate, changes):
    seed = int(np.random.default_rng().integers(1 << 30))
    across = layer(8, 4, seed, gate=gate, **changes)  # two nodes: the logits' law
    within = across.replace(gpus_per_node=8)  # one node: the golden's tokens
    a, w = route_config(across), route_config(within)
    ca, cw = a.counts(across.experts), w.counts(within.experts)
    # 16384 choices over 32 experts on 8 GPUs: the per-expert load (its prior under skew) and the
    # spread of the (source, expert) counts, which sets the drops, agree within sampling noise (over
    # 30 seeds: loads within 0.009, weights within 1% and 3.4%; the spreads' ratio, over 400 seeds of
    # softmax_topk_renorm, has sd 5.4%, and one seed in about a thousand passes 20%: 30% is 5.5 sd);
    # the routing itself is another sample
    load_a, load_w = ca.sum(0) / ca.sum(), cw.sum(0) / cw.sum()
    assert np.abs(load_a - load_w).max() < 0.02
    assert abs(ca.std() / cw.std() - 1) < 0.3
    assert abs(a.weight.mean() - w.weight.mean()) < 0.02 * w.weight.mean()
    assert abs(a.weight.std() - w.weight.std()) < 0.08 * w.weight.std()
    assert not np.array_equal(a.expert, w.expert)


def test_one_node_routes_the_goldens_tokens():
    cfg = layer(4, 4, int(np.random.default_rng().integers(1 << 30)))
    wg, gate_bias = weights.gate(cfg)
    x = np.stack([weights.tokens(cfg, r) for r in range(cfg.ranks)])
    golden = routing.route(cfg, x, wg, gate_bias, weights.router_bias(cfg))
    got = route_config(cfg)
    assert np.array_equal(got.expert, golden.expert) and np.array_equal(got.slot, golden.slot)
    assert np.array_equal(got.weight, golden.weight)
