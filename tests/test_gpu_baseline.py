"""The torch layers (gpu/baseline.py) against the golden: on the CPU with one rank and with two
gloo processes (exact-split all-to-alls), and on GPUs with NCCL (pytest -m gpu).

Every layer (capacity-padded, dropless with torch._grouped_mm, dropless with one matmul per
expert) must route as reference.routing does (experts and slots exactly, weights to 1e-12) and
reproduce golden.dense: float32 against float64 at 1e-5, bf16 against the bf16-emulated path at
2e-2.
"""

from __future__ import annotations

import os
import socket

import cuda_gpus
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpu.baseline import DroplessLayer, TorchLayer, reference_inputs  # noqa: E402
from reference import Config, golden, routing, weights  # noqa: E402

LAYERS = {"padded": (TorchLayer, {}), "grouped": (DroplessLayer, {"gemm": "grouped"}),
          "loop": (DroplessLayer, {"gemm": "loop"})}
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
GOLDEN_PATH = {"float32": "float64", "bfloat16": "bfloat16"}

# the layers of the config the reference computes today, each change to a small base
CASES = {
    "capacity_drops": {},
    "dropless_swiglu_shared_sigmoid_bias": dict(capacity_factor=None, activation="swiglu", shared_experts=1,
                                                gate="sigmoid_bias"),
    "skewed_no_bias_topk_softmax": dict(skew=2.0, gate="topk_softmax", activation="gelu_tanh", bias=False),
    "one_expert_renorm_silu": dict(skew=1000.0, capacity_factor=None, gate="softmax_topk_renorm",
                                   activation="silu"),
    "top8_of_32": dict(experts=32, top_k=8, capacity_factor=None, shared_experts=2),
    "deepseek_groups_scaled": dict(experts=16, top_k=4, gate="sigmoid_bias", n_group=4, topk_group=2,
                                   routed_scaling=2.5, shared_experts=1, capacity_factor=None, bias=False),
    "softmax_groups": dict(experts=16, top_k=3, gate="softmax_topk", n_group=8, topk_group=3, routed_scaling=1.5),
    "gpt_oss_router_bias_swiglu_oai": dict(gate="topk_softmax", router_bias=True, activation="swiglu_oai",
                                           swiglu_limit=0.5, capacity_factor=None),
    "llama4_scale_before_expert": dict(top_k=1, gate="sigmoid_topk", scale_before_expert=True, shared_experts=1,
                                       activation="swiglu", capacity_factor=None),
}


def small(p: int, seed: int, dtype: str, **changes) -> Config:
    base = dict(tokens=48, hidden=32, ffn=48, experts=8, top_k=2, ranks=p, seed=seed, precision=dtype)
    return Config(**{**base, **changes})


def check(cfg: Config, outs: list[tuple]) -> None:
    """outs[r] = (y, expert, weight, slot) of rank r as numpy arrays."""
    w = weights.draw(cfg)
    r = routing.route(cfg, w.x, w.wg, w.gate_bias, w.wg_bias)
    y = np.stack([o[0] for o in outs])
    assert np.array_equal(np.stack([o[1] for o in outs]), r.expert)
    assert np.array_equal(np.stack([o[3] for o in outs]), r.slot)
    assert np.abs(np.stack([o[2] for o in outs]) - r.weight).max() < 1e-12
    err = golden.max_rel_error(y, golden.dense(cfg, w, r, GOLDEN_PATH[cfg.dtype]))
    assert err < TOLERANCE[cfg.dtype], err
    assert np.abs(y).max() > 0.1  # the check is not of zeros


def run_layer(cfg: Config, rank: int, name: str, device="cpu", group=None) -> tuple:
    cls, kw = LAYERS[name]
    layer = cls(cfg, reference_inputs(cfg, rank, device), rank, cfg.dtype, group=group, **kw)
    return tuple(t.cpu().numpy() for t in layer.forward())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_one_rank_matches_golden(name, case, dtype):
    seed = int.from_bytes(os.urandom(4), "little")
    cfg = small(1, seed, dtype, **CASES[case])
    check(cfg, [run_layer(cfg, 0, name)])


def test_gemm_and_precision_are_checked():
    cfg = small(1, 0, "float32")
    with pytest.raises(ValueError, match="gemm 'cutlass'"):
        DroplessLayer(cfg, reference_inputs(cfg, 0), 0, gemm="cutlass")
    with pytest.raises(ValueError, match="dtype 'float16'"):
        TorchLayer(cfg, reference_inputs(cfg, 0), 0, "float16")


@pytest.mark.parametrize("case", ["top8_of_32", "gpt_oss_router_bias_swiglu_oai", "deepseek_groups_scaled"])
def test_experts_alone_computes_the_routed_rows_and_shared_experts(case):
    # the timed expert work of the bench: each expert's FFN on the rows it was routed, expert by
    # expert in (token, choice) order, and every shared expert on all tokens
    cfg = small(1, int.from_bytes(os.urandom(4), "little"), "float32", **CASES[case])
    layer = DroplessLayer(cfg, reference_inputs(cfg, 0), 0, "float32")
    routed, *shared = (t.numpy() for t in layer.experts_alone()())
    w = weights.draw(cfg)
    r = routing.route(cfg, w.x, w.wg, w.gate_bias, w.wg_bias)
    expert, kept = r.expert[0], r.kept[0]
    every = ((e, w.w1[e], w.b1[e], w.w2[e], w.b2[e]) for e in range(cfg.experts + cfg.shared_experts))
    want = golden.contributions(cfg, w.x[0], expert, np.ones(expert.shape), kept, every)["float64"]
    order = sorted(zip(*np.nonzero(kept)), key=lambda tj: (expert[tj], tj[0] * cfg.top_k + tj[1]))
    assert golden.max_rel_error(routed, want[tuple(np.array(order).T)]) < TOLERANCE["float32"]
    assert len(shared) == int(cfg.shared_experts > 0)
    for s in range(cfg.shared_experts):
        assert golden.max_rel_error(shared[0][s], want[:, cfg.top_k + s]) < TOLERANCE["float32"]
    np.testing.assert_array_equal(routed, layer.experts_alone()()[0].numpy())  # the call repeats its work


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, backend: str, port: int, jobs: list, out: str) -> None:
    """One process of a multi-rank check: every (config, layer) job, outputs saved for the parent."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        for i, (cfg_dict, name) in enumerate(jobs):
            res = run_layer(Config.from_dict(cfg_dict), rank, name, device)
            np.savez(f"{out}/job{i}-rank{rank}.npz", *res)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, backend: str, jobs: list[tuple[Config, str]], tmp_path) -> list[list[tuple]]:
    """outs[job][rank] of every job, run by `world` processes."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(world, backend, _free_port(), [(c.to_dict(), n) for c, n in jobs], str(tmp_path)),
             nprocs=world, join=True)
    outs = []
    for i in range(len(jobs)):
        per_rank = []
        for r in range(world):
            with np.load(tmp_path / f"job{i}-rank{r}.npz") as f:
                per_rank.append(tuple(f[f"arr_{j}"] for j in range(4)))
        outs.append(per_rank)
    return outs


def multi_rank_jobs(p: int, seed: int, dtypes=("float32",)) -> list[tuple[Config, str]]:
    cases = [dict(), dict(capacity_factor=None, activation="swiglu_oai", shared_experts=1, skew=1.5, router_bias=True),
             dict(experts=16, top_k=8, capacity_factor=None, gate="sigmoid_bias", n_group=4, topk_group=3)]
    return [(small(p, seed + i, dt, **ch), name) for i, ch in enumerate(cases) for name in sorted(LAYERS)
            for dt in dtypes]


def test_two_gloo_ranks_match_golden(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed has no gloo backend here")
    jobs = multi_rank_jobs(2, int.from_bytes(os.urandom(4), "little"))
    for (cfg, _), outs in zip(jobs, run_ranks(2, "gloo", jobs, tmp_path)):
        check(cfg, outs)


@pytest.mark.gpu
@pytest.mark.parametrize("p", [1, 2])
def test_nccl_ranks_match_golden(p, tmp_path):
    if cuda_gpus.count() < p:
        pytest.skip(f"needs {p} CUDA GPU(s), found {cuda_gpus.count()}")
    jobs = multi_rank_jobs(p, int.from_bytes(os.urandom(4), "little"), ("float32", "bfloat16"))
    for (cfg, _), outs in zip(jobs, run_ranks(p, "nccl", jobs, tmp_path)):
        check(cfg, outs)


def test_random_inputs_feed_every_layer_alike():
    # inputs drawn on the device for the bench's torch-only points: gated W1, shared experts, the
    # gate's logit bias; the three layers compute the same output from them
    cfg = small(1, 0, "float32", activation="swiglu_oai", shared_experts=1, router_bias=True, capacity_factor=None,
                experts=16, top_k=4, gate="topk_softmax")
    from gpu.baseline import random_inputs

    inputs = random_inputs(cfg, 0, int.from_bytes(os.urandom(4), "little"), "cpu")
    assert inputs.w1.shape == (cfg.experts, cfg.hidden, 2 * cfg.ffn)
    assert inputs.shared[0].shape == (1, cfg.hidden, 2 * cfg.ffn) and inputs.wg_bias.abs().max() > 0
    ys = [cls(cfg, inputs, 0, **kw).forward()[0] for cls, kw in LAYERS.values()]
    assert all(torch.allclose(y, ys[0], rtol=1e-5, atol=1e-5) for y in ys[1:])
    assert ys[0].abs().max() > 0.1
