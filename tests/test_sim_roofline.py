"""sim.metrics.layer_roofline on hand-worked layers: the GEMM, weights and NVLink bounds."""

import numpy as np
import pytest

from reference import Config
from sim.metrics import layer_roofline


def test_two_gpus_gemm_then_nvlink_bound():
    # expert 0 on GPU 0, expert 1 on GPU 1; GPU 1 computes 4 + 7 = 11 rows of H (I + I) = 64
    # multiply-adds: 1408 FLOPs; one expert's float32 weights, 256 bytes; each GPU sends 4 + 3
    # rows of 16 bytes over NVLink (its dispatch and the other's returns): 112 bytes. At 1000
    # FLOP/s, 1000 B/s and 100 B/s: 1408, 256 and 1120 ms
    cfg = Config(tokens=10, hidden=4, ffn=8, experts=2, top_k=1, ranks=2, capacity_factor=None, tile_k=4)
    counts = [[6, 4], [3, 7]]
    r = layer_roofline(cfg, counts, ceiling_tflops=1e-9, memory_gbps=1e-6, nvlink_gbps=1e-7)
    assert r["gemm_ms"] == pytest.approx(1408.0)
    assert r["weights_ms"] == pytest.approx(256.0)
    assert r["nvlink_ms"] == pytest.approx(1120.0)
    assert (r["ms"], r["bound"]) == (pytest.approx(1408.0), "gemm")
    slow = layer_roofline(cfg, counts, ceiling_tflops=1e-9, memory_gbps=1e-6, nvlink_gbps=5e-8)
    assert (slow["ms"], slow["bound"]) == (pytest.approx(2240.0), "nvlink")


def test_gated_bf16_shared_expert_one_gpu():
    # swiglu: W1 has 2I = 16 columns, 4 (16 + 8) = 96 multiply-adds a row; 5 + 10 + 5 routed rows
    # and 10 shared ones: 5760 FLOPs; weights of 3 used routed experts and the shared one in bf16:
    # 4 x 96 x 2 = 768 bytes; nothing moves between GPUs, so no NVLink rate is needed
    cfg = Config(tokens=10, hidden=4, ffn=8, experts=4, top_k=2, shared_experts=1, activation="swiglu",
                 precision="bfloat16", capacity_factor=None, tile_k=4)
    r = layer_roofline(cfg, [[5, 0, 10, 5]], ceiling_tflops=1e-9, memory_gbps=1e-7, nvlink_gbps=None)
    assert r["gemm_ms"] == pytest.approx(5760.0)
    assert r["weights_ms"] == pytest.approx(7680.0)
    assert (r["nvlink_ms"], r["bound"]) == (0.0, "weights")


def test_network_bytes_are_not_nvlink_and_counts_are_checked():
    cfg = Config(tokens=10, hidden=4, ffn=8, experts=2, top_k=1, ranks=2, gpus_per_node=1, capacity_factor=None,
                 tile_k=4)
    assert layer_roofline(cfg, [[6, 4], [3, 7]], 1e-6, 1e-6, None)["nvlink_ms"] == 0.0
    with pytest.raises(ValueError, match=r"shape \(1, 2\), expected \(2, 2\)"):
        layer_roofline(cfg, [[6, 4]], 1e-6, 1e-6, 1.0)
    with pytest.raises(ValueError, match="an NVLink rate is needed"):
        layer_roofline(cfg.replace(gpus_per_node=8), np.array([[6, 4], [3, 7]]), 1e-6, 1e-6, None)
