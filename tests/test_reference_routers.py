"""Every router and activation on small hand-worked cases: numbers checked by hand in the test,
ties to the lower expert and the lower group, routed_scaling, the router bias, and Llama 4's
scaling of the token before its expert beside a shared expert."""

import math

import numpy as np
import pytest
from naive_moe import moe as naive_moe

from reference import Config, golden, numerics, plan, routing
from reference.weights import Weights


def sig(a):
    return 1 / (1 + math.exp(-a))


def pick(gate, z, k, bias=None, **changes):
    e = len(z)
    cfg = Config(experts=e, top_k=k, gate=gate, **changes)
    top, w = routing.select(cfg, np.array([z], np.float64), np.zeros(e) if bias is None else np.array(bias))
    return top[0].tolist(), w[0]


def test_softmax_topk_not_renormalized_ties_to_the_lower_expert():
    top, w = pick("softmax_topk", [1.0, 3.0, 2.0, 3.0], 2)
    assert top == [1, 3]  # 1 and 3 tie: the lower first
    total = math.e + 2 * math.e ** 3 + math.e ** 2
    assert np.allclose(w, [math.e ** 3 / total] * 2, rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_at_is_softmax_taken_bit_for_bit(dtype):
    rng = np.random.default_rng()
    z = (rng.standard_normal((64, 40)) * rng.uniform(0.1, 30)).astype(dtype)
    index = np.argsort(rng.random(z.shape), axis=-1)[:, :5]
    got = numerics.softmax_at(z, index)
    assert got.dtype == dtype
    assert np.array_equal(got, np.take_along_axis(numerics.softmax(z), index, axis=-1))


def test_softmax_topk_renorm_sums_to_one_and_scales():
    top, w = pick("softmax_topk_renorm", [0.0, math.log(3.0), -4.0], 2)
    assert top == [1, 0] and np.allclose(w, [0.75, 0.25], rtol=1e-15)
    top, w = pick("softmax_topk_renorm", [0.0, math.log(3.0), -4.0], 2, routed_scaling=2.0)
    assert np.allclose(w, [1.5, 0.5], rtol=1e-15)


def test_topk_softmax_over_the_selected_logits_only():
    # gpt-oss: e0 and e3 tie at 0 for the second place, the lower wins; e2 plays no part in the softmax
    top, w = pick("topk_softmax", [0.0, math.log(3.0), -1.0, 0.0], 2)
    assert top == [1, 0] and np.allclose(w, [0.75, 0.25], rtol=1e-15)


def test_router_bias_is_added_to_the_logits():
    cfg = Config(hidden=8, experts=4, top_k=2, gate="topk_softmax", router_bias=True, tile_k=8)
    x, wg, b = np.ones((1, 8)), np.zeros((8, 4)), np.array([0.0, 0.5, -0.5, 0.25])
    wg[:, 2] = 0.25  # logit of e2: 8 x 0.25 - 0.5 = 1.5
    assert np.array_equal(routing.logits(cfg, x, wg, b), [[0.0, 0.5, 1.5, 0.25]])
    with pytest.raises(ValueError, match="router_bias"):
        routing.logits(cfg, x, wg)


def test_sigmoid_topk_weight_is_the_sigmoid_of_the_logit():
    top, w = pick("sigmoid_topk", [0.0, 2.0, -1.0, 2.0], 1)
    assert top == [1] and np.allclose(w, [sig(2.0)], rtol=1e-15)
    top, w = pick("sigmoid_topk", [0.0, 2.0, -1.0, 2.0], 1, routed_scaling=3.0)
    assert np.allclose(w, [3 * sig(2.0)], rtol=1e-15)


# logits 0: every sigmoid 0.5; biases in eighths, so the sums are exact
V3_BIAS = [0.125, 0.0, 0.25, -0.125, 0.375, 0.0, 0.0, 0.125]  # biased: .625 .5 | .75 .375 | .875 .5 | .5 .625


def test_sigmoid_bias_selects_by_biased_score_weights_unbiased():
    top, w = pick("sigmoid_bias", [0.0] * 8, 2, V3_BIAS)
    assert top == [4, 2] and np.allclose(w, [0.5, 0.5], rtol=1e-15)


def test_sigmoid_bias_groups_by_their_top_two_sum_ties_to_the_lower_group():
    # group sums of the two best biased scores: 1.125, 1.125, 1.375, 1.125: group 2, then group 0 of
    # the three tied; expert 2 (0.75, group 1) is out, so the second pick is expert 0 (0.625)
    top, w = pick("sigmoid_bias", [0.0] * 8, 2, V3_BIAS, n_group=4, topk_group=2, routed_scaling=2.5)
    assert top == [4, 0]
    assert np.allclose(w, [0.5 / (1.0 + 1e-20) * 2.5] * 2, rtol=1e-15)


def test_softmax_group_limited_greedy_groups_by_their_best():
    # DeepSeek-V2: group maxima 1 and 2: only group 1 (e2, e3) stays, though e0's logit beats e3's
    z = [1.0, 0.0, 2.0, -5.0]
    top, w = pick("softmax_topk", z, 2, n_group=2, topk_group=1, routed_scaling=16.0)
    total = sum(math.exp(a) for a in z)
    assert top == [2, 3] and np.allclose(w, [16 * math.exp(2) / total, 16 * math.exp(-5) / total], rtol=1e-14)


def test_tied_groups_and_experts_go_to_the_lower_index():
    top, _ = pick("softmax_topk", [0.0] * 8, 3, n_group=4, topk_group=2)
    assert top == [0, 1, 2]


def test_swiglu_oai_clamps_and_adds_one_to_up():
    # gate | up; limit 7: gate 10 -> 7, up 8 -> 7, up -9 -> -7; gate -2 is not clamped below
    h = np.array([[0.0, 10.0, -2.0, 1.0, 8.0, -9.0]])
    out = numerics.activate("swiglu_oai", h, 7.0)
    want = [0.0, 8 * 7 * sig(1.702 * 7), -6 * -2 * sig(1.702 * -2)]
    assert np.allclose(out, [want], rtol=1e-15)
    with pytest.raises(ValueError, match="limit"):
        numerics.activate("swiglu_oai", h)


def test_swiglu_is_silu_gate_times_up():
    out = numerics.activate("swiglu", np.array([[1.0, -2.0, 3.0, 0.5]]))
    assert np.allclose(out, [[1 * sig(1) * 3, -2 * sig(-2) * 0.5]], rtol=1e-15)


def llama4_layer(scale_before: bool):
    """One token x = (3, 0.5); two routed experts, top-1 by sigmoid (logits 0 and 0: e0 by the tie,
    weight 1/2); e0: relu(x - 1), the shared one 2 relu(x) + 1."""
    cfg = Config(tokens=1, hidden=2, ffn=2, experts=2, top_k=1, gate="sigmoid_topk", scale_before_expert=scale_before,
                 shared_experts=1, capacity_factor=None, activation="relu", bias=True, tile_m=4, tile_n=1, tile_k=1)
    eye = np.eye(2)
    w = Weights(x=np.array([[[3.0, 0.5]]]), wg=np.zeros((2, 2)), gate_bias=np.zeros(2),
                w1=np.stack([eye, eye, eye]), b1=np.array([[-1.0, -1.0], [0.0, 0.0], [0.0, 0.0]]),
                w2=np.stack([eye, eye, 2 * eye]), b2=np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]),
                wg_bias=np.zeros(2))
    return cfg, w


@pytest.mark.parametrize("scale_before, want", [(True, [0.5 + 7, 0 + 2]),  # relu(x / 2 - 1) + shared
                                                (False, [1 + 7, 0 + 2])])  # relu(x - 1) / 2 + shared
def test_llama4_scales_the_token_before_its_expert(scale_before, want):
    cfg, w = llama4_layer(scale_before)
    r = routing.route(cfg, w.x, w.wg, w.gate_bias, w.wg_bias)
    assert r.expert.tolist() == [[[0]]] and r.weight.tolist() == [[[0.5]]]
    tp = plan.build(cfg, r)
    for path in ("float64", "float32", "bfloat16"):
        assert np.allclose(golden.dense(cfg, w, r, path), [[want]], rtol=1e-7)
        assert np.allclose(golden.tile_walk(cfg, w, tp, path), [[want]], rtol=1e-7)
    assert np.allclose(naive_moe(cfg, w), [[want]], rtol=1e-15)


@pytest.mark.parametrize("name, want", [
    ("relu", [0.0, 0.0, 2.0]),
    ("silu", [-1 * sig(-1), 0.0, 2 * sig(2)]),
    ("gelu", [-0.5 * (1 + math.erf(-1 / math.sqrt(2))), 0.0, 0.5 * 2 * (1 + math.erf(2 / math.sqrt(2)))]),
    ("gelu_tanh", [-0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * (-1 - 0.044715))), 0.0,
                   0.5 * 2 * (1 + math.tanh(math.sqrt(2 / math.pi) * (2 + 0.044715 * 8)))]),
])
def test_plain_activations_by_hand(name, want):
    assert np.allclose(numerics.activate(name, np.array([[-1.0, 0.0, 2.0]])), [want], rtol=1e-15)
