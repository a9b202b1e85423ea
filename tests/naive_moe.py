"""A deliberately naive MoE layer, token by token in float64, written apart from `reference`.

It re-derives routing, capacity and the FFN from the rules in reference/routing.py's docstring
without using any of reference's functions, so that a shared bug cannot hide in both.
"""

import math

import numpy as np


def _act(name, v):
    if name == "relu":
        return [max(a, 0.0) for a in v]
    if name == "gelu_tanh":
        return [0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))) for a in v]
    if name == "gelu":
        return [0.5 * a * (1 + math.erf(a / math.sqrt(2))) for a in v]
    if name == "silu":
        return [a / (1 + math.exp(-a)) for a in v]
    half = len(v) // 2  # swiglu: [gate | up]
    return [v[i] / (1 + math.exp(-v[i])) * v[half + i] for i in range(half)]


def _route_token(cfg, z, gate_bias):
    e_all = range(len(z))
    if cfg.gate == "sigmoid_bias":
        s = [1 / (1 + math.exp(-a)) for a in z]
        order = sorted(e_all, key=lambda e: (-(s[e] + float(gate_bias[e])), e))[: cfg.top_k]
        total = sum(s[e] for e in order)
        return order, [s[e] / total for e in order]
    order = sorted(e_all, key=lambda e: (-z[e], e))[: cfg.top_k]
    m = max(z)
    denom = sum(math.exp(a - m) for a in z)
    p = [math.exp(z[e] - m) / denom for e in order]
    if cfg.gate == "softmax_topk_renorm":
        p = [a / sum(p) for a in p]
    if cfg.gate == "topk_softmax":
        mz = max(z[e] for e in order)
        ex = [math.exp(z[e] - mz) for e in order]
        p = [a / sum(ex) for a in ex]
    return order, p


def moe(cfg, w):
    """(P, T, H) float64 output of the layer for a reference.weights.Weights-like object."""
    p_ranks, t_tokens, h = w.x.shape
    y = np.zeros((p_ranks, t_tokens, h))
    for r in range(p_ranks):
        x = w.x[r].astype(np.float64)
        z = x @ w.wg.astype(np.float64) - cfg.skew * np.log1p(np.arange(cfg.experts))
        routes = [_route_token(cfg, list(z[t]), w.gate_bias) for t in range(t_tokens)]
        used = [0] * cfg.experts
        keep = {}
        for j in range(cfg.top_k):  # every first choice claims a slot before any second choice
            for t in range(t_tokens):
                e = routes[t][0][j]
                cap = cfg.capacity
                keep[t, j] = cap is None or used[e] < cap
                used[e] += 1
        for t in range(t_tokens):
            acc = np.zeros(h)
            experts = [(routes[t][0][j], routes[t][1][j]) for j in range(cfg.top_k) if keep[t, j]]
            experts += [(cfg.experts + s, 1.0) for s in range(cfg.shared_experts)]
            for e, weight in experts:
                pre = x[t] @ w.w1[e].astype(np.float64) + w.b1[e]
                hid = np.array(_act(cfg.activation, list(pre)))
                acc += weight * (hid @ w.w2[e].astype(np.float64) + w.b2[e])
            y[r, t] = acc
    return y
