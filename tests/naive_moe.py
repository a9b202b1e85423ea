"""A deliberately naive MoE layer, token by token in float64, written apart from `reference`.

It re-derives routing (every gate, group limits, routed scaling, the router bias), capacity and
the FFN (every activation, scaling before the expert, shared experts) from the rules in
reference/routing.py's and reference/golden.py's docstrings without using any of reference's
functions, so that a shared bug cannot hide in both.
"""

import math

import numpy as np


def _sig(a):
    return 1 / (1 + math.exp(-a))


def _act(cfg, v):
    name = cfg.activation
    if name == "relu":
        return [max(a, 0.0) for a in v]
    if name == "gelu_tanh":
        return [0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))) for a in v]
    if name == "gelu":
        return [0.5 * a * (1 + math.erf(a / math.sqrt(2))) for a in v]
    if name == "silu":
        return [a / (1 + math.exp(-a)) for a in v]
    half = len(v) // 2  # gated: [gate | up]
    if name == "swiglu":
        return [v[i] * _sig(v[i]) * v[half + i] for i in range(half)]
    lim = cfg.swiglu_limit  # swiglu_oai
    out = []
    for i in range(half):
        g, u = min(v[i], lim), max(-lim, min(v[half + i], lim))
        out.append((u + 1) * g * _sig(1.702 * g))
    return out


def _pick(score, k, allowed):
    """k best allowed experts, best first, ties to the lower index."""
    return sorted(allowed, key=lambda e: (-score[e], e))[:k]


def _allowed(cfg, score):
    n = len(score)
    if cfg.n_group == 1:
        return list(range(n))
    size = n // cfg.n_group
    gscore = []
    for g in range(cfg.n_group):
        members = sorted((score[e] for e in range(g * size, (g + 1) * size)), reverse=True)
        gscore.append(sum(members[:2]) if cfg.gate == "sigmoid_bias" else members[0])
    groups = sorted(range(cfg.n_group), key=lambda g: (-gscore[g], g))[: cfg.topk_group]
    return [e for e in range(n) if e // size in groups]


def _route_token(cfg, z, gate_bias):
    k = cfg.top_k
    if cfg.gate in ("sigmoid_bias", "sigmoid_topk"):
        s = [_sig(a) for a in z]
        score = [s[e] + float(gate_bias[e]) for e in range(len(z))] if cfg.gate == "sigmoid_bias" else z
        order = _pick(score, k, _allowed(cfg, score))
        if cfg.gate == "sigmoid_bias":
            total = sum(s[e] for e in order) + 1e-20
            w = [s[e] / total for e in order]
        else:
            w = [s[e] for e in order]
    else:
        order = _pick(z, k, _allowed(cfg, z))
        m = max(z)
        denom = sum(math.exp(a - m) for a in z)
        w = [math.exp(z[e] - m) / denom for e in order]
        if cfg.gate == "softmax_topk_renorm":
            w = [a / sum(w) for a in w]
        if cfg.gate == "topk_softmax":
            mz = max(z[e] for e in order)
            ex = [math.exp(z[e] - mz) for e in order]
            w = [a / sum(ex) for a in ex]
    return order, [a * cfg.routed_scaling for a in w]


def _ffn(cfg, w, e, row):
    pre = row @ w.w1[e].astype(np.float64) + w.b1[e]
    return np.array(_act(cfg, list(pre))) @ w.w2[e].astype(np.float64) + w.b2[e]


def moe(cfg, w):
    """(P, T, H) float64 output of the layer for a reference.weights.Weights-like object."""
    p_ranks, t_tokens, h = w.x.shape
    y = np.zeros((p_ranks, t_tokens, h))
    for r in range(p_ranks):
        x = w.x[r].astype(np.float64)
        z = x @ w.wg.astype(np.float64) - cfg.skew * np.log1p(np.arange(cfg.experts))
        if cfg.router_bias:
            z = z + w.wg_bias.astype(np.float64)
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
            for j in range(cfg.top_k):
                if keep[t, j]:
                    e, weight = routes[t][0][j], routes[t][1][j]
                    if cfg.scale_before_expert:
                        acc += _ffn(cfg, w, e, weight * x[t])
                    else:
                        acc += weight * _ffn(cfg, w, e, x[t])
            for s in range(cfg.shared_experts):
                acc += _ffn(cfg, w, cfg.experts + s, x[t])
            y[r, t] = acc
    return y
