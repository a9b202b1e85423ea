"""gpu.MoELayer's weight checks, on the CPU (torch's CPU build): the documented shapes, dtypes and
devices are taken (all E experts sliced to this rank's, or this rank's alone), anything else is one
clear ValueError naming the weight."""

import pytest

from reference import Config

torch = pytest.importorskip("torch")

from gpu.moe_layer import _checked  # noqa: E402

CPU = torch.device("cpu")


def _weights(cfg: Config, n: int) -> dict:
    h, i = cfg.hidden, cfg.ffn
    w = {"wg": torch.randn(h, cfg.experts), "w1": torch.randn(n, h, i), "b1": torch.randn(n, i),
         "w2": torch.randn(n, i, h), "b2": torch.randn(n, h)}
    if cfg.router_bias:
        w["wg_bias"] = torch.randn(cfg.experts)
    return w


def test_all_experts_are_sliced_to_the_ranks_own():
    cfg = Config(experts=8, ranks=4, hidden=64, ffn=32, tile_k=8)
    w = _weights(cfg, 8)
    got = _checked(cfg, w, rank=2, device=CPU)
    assert torch.equal(got["w1"], w["w1"][4:6]) and torch.equal(got["b2"], w["b2"][4:6])
    own = _checked(cfg, _weights(cfg, 2), rank=2, device=CPU)
    assert own["w2"].shape == (2, 32, 64)
    bf = _checked(cfg, {k: v.to(torch.bfloat16) for k, v in w.items()}, rank=0, device=CPU)
    assert bf["wg"].dtype == torch.float32  # any floating dtype, taken as float32


def test_bad_weights_are_named():
    cfg = Config(experts=8, ranks=2, hidden=64, ffn=32, tile_k=8, router_bias=True, gate="topk_softmax")
    good = _weights(cfg, 8)
    cases = [({"w1": torch.randn(3, 64, 32)}, "'w1' = (3, 64, 32)"),
             ({"wg": torch.randn(8, 64)}, "'wg' = (8, 64)"),
             ({"w2": torch.ones(8, 32, 64, dtype=torch.int32)}, "'w2'"),
             ({"gate_bias": torch.randn(8)}, "'gate_bias' is not allowed"),
             ({"b1": None}, "'b1' = NoneType")]
    for change, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _checked(cfg, {**good, **change}, rank=0, device=CPU)
    with pytest.raises(ValueError, match="'wg_bias' is missing"):
        _checked(cfg, {k: v for k, v in good.items() if k != "wg_bias"}, rank=0, device=CPU)
    with pytest.raises(ValueError, match="on meta"):
        _checked(cfg, good, rank=0, device=torch.device("meta"))
    with pytest.raises(ValueError, match="'b1' is not allowed"):
        _checked(cfg.replace(bias=False), good, rank=0, device=CPU)
