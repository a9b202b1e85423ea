"""The simulator against closed forms (relative error 1e-9): pure compute on one GPU, one
transfer alone, transfers sharing a link, an ibrc fence draining m writes, nic_order without
proxy stalls. Expected values are computed here from the hardware figures, not by sim.costs."""

import math

import numpy as np
import pytest

import reference
import sim
from reference import Config, presets
from reference.plan import DISPATCH, GEMM0, GEMM1, NETWORK, NVLINK
from sim import hardware
from sim.clock import Clock
from sim.kernel import TilePhases
from sim.links import SharedLink
from sim.network import Fabric, Nic
from sim.trace import TraceBuilder

HW = hardware.get("h100-sxm")
REL = 1e-9


def close(a, b):
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-9)


def block_time(flops, nbytes, gemm=True):
    blocks = HW.sms * HW.blocks_per_sm
    rate = HW.tflops_float32 * 1e3 * HW.matrix_efficiency / blocks
    hbm = nbytes * (1 - HW.l2_hit_fraction) if gemm else nbytes
    return max(flops / rate, hbm / (HW.hbm_gbps / blocks)) + HW.task_overhead_ns


def test_one_gpu_one_expert_compute_only():
    # one tile; its 600 GEMM0 tasks take ceil(600 / 527) = 2 rounds, its 1 GEMM1 task one
    cfg = Config(tokens=128, hidden=64, ffn=64 * 600, experts=1, top_k=1, capacity_factor=None,
                 bias=False, ranks=1, tile_m=128, tile_n=64, tile_k=8)
    plan = reference.plan_of(cfg)
    P = HW.processors
    t = {k: block_time(plan.task_flops[plan.task_kind == k][0], plan.task_bytes[plan.task_kind == k][0], k != 2)
         for k in range(3)}
    n0, n1 = int((plan.task_kind == GEMM0).sum()), int((plan.task_kind == GEMM1).sum())
    blocks = HW.sms * HW.blocks_per_sm
    gate = max(2.0 * 128 * 64 * 1 / (HW.tflops_float32 * 1e3 * HW.matrix_efficiency),
               4 * (128 * 64 + 64) / HW.hbm_gbps) + HW.task_overhead_ns
    # the tile's rows gathered by one block (put path; the preset's local put costs nothing more),
    # or straight into its own inbox by 4 blocks, the most that share a tile (1 tile slot, 527 processors)
    for dispatch, shares in (("put", 1), ("store", 4)):
        r = sim.simulate(cfg, plan=plan, dispatch=dispatch)
        pack = 2.0 * plan.transfer_bytes[0] / shares / (HW.hbm_gbps / blocks) + HW.task_overhead_ns
        expected = (gate + pack + 2 * HW.subscriber_ns + math.ceil(n0 / P) * t[0] + math.ceil(n1 / P) * t[1] + t[2])
        assert close(r.metrics["latency_ns"], expected)
        assert len(r.trace.where("processor", "dispatch")) == shares
        gemm0 = r.trace.where("processor", "gemm0")
        assert len(gemm0) == n0 and np.unique(gemm0["start"]).size == 2  # two rounds


def test_tf32_gemm_tasks_run_at_the_tf32_matrix_rate():
    # the compute-only layer above with tf32: each GEMM task's FLOPs at the datasheet's dense TF32 rate
    cfg = Config(tokens=128, hidden=64, ffn=64 * 600, experts=1, top_k=1, capacity_factor=None,
                 bias=False, ranks=1, tile_m=128, tile_n=64, tile_k=8, precision="tf32")
    plan = reference.plan_of(cfg)
    r = sim.simulate(cfg, plan=plan)
    blocks = HW.sms * HW.blocks_per_sm
    flops, nbytes = plan.task_flops[plan.task_kind == GEMM0][0], plan.task_bytes[plan.task_kind == GEMM0][0]
    rate = HW.tflops_tf32 * 1e3 * HW.matrix_efficiency / blocks
    want = max(flops / rate, nbytes * (1 - HW.l2_hit_fraction) / (HW.hbm_gbps / blocks)) + HW.task_overhead_ns
    gemm0 = r.trace.where("processor", "gemm0")
    assert np.allclose(gemm0["end"] - gemm0["start"], want, rtol=REL)
    assert HW.tflops_tf32 == 494.7 and "TF32" in HW.source("tflops_tf32")
    assert r.metrics["latency_ns"] < sim.simulate(cfg.replace(precision="float32"), plan=plan).metrics["latency_ns"]


def test_tf32x3_gemm_tasks_run_at_a_third_of_the_tf32_matrix_rate():
    # split TF32: three TF32 products for each float32 one
    cfg = Config(tokens=128, hidden=64, ffn=64 * 600, experts=1, top_k=1, capacity_factor=None,
                 bias=False, ranks=1, tile_m=128, tile_n=64, tile_k=8, precision="tf32x3")
    plan = reference.plan_of(cfg)
    gemm0 = sim.simulate(cfg, plan=plan).trace.where("processor", "gemm0")
    blocks = HW.sms * HW.blocks_per_sm
    flops = plan.task_flops[plan.task_kind == GEMM0][0]
    assert HW.tflops("tf32x3") == HW.tflops_tf32 / 3
    want = flops / (HW.tflops_tf32 / 3 * 1e3 * HW.matrix_efficiency / blocks) + HW.task_overhead_ns
    assert np.allclose(gemm0["end"] - gemm0["start"], want, rtol=REL)


def test_scheduler_bag_of_equal_tasks_is_ceil_tasks_over_processors():
    from sim.kernel import Scheduler

    for n in (1, 526, 527, 528, 1500):
        slots = Scheduler([0.0] * HW.processors).assign(0.0, [330.5] * n)
        assert close(max(e for _, _, e in slots), math.ceil(n / HW.processors) * 330.5)


def _fabric(cfg, transport="ibgda"):
    env = Clock()
    plan = reference.plan_of(cfg)
    arrivals = {}
    rec = TraceBuilder()
    fabric = Fabric(env, cfg, plan, HW, transport, rec,
                    lambda dst, xs: arrivals.update({x: env.now for x in xs}), TilePhases(plan))
    return env, plan, fabric, arrivals, rec


def test_one_nvlink_transfer_alone_is_latency_plus_bytes_over_bandwidth():
    env, plan, fabric, arrivals, _ = _fabric(presets.get("small"))
    x = int(np.flatnonzero(plan.transfer_link == NVLINK)[0])
    fabric.send(x)
    env.run()
    assert close(arrivals[x], HW.nvlink_latency_ns + plan.transfer_bytes[x] / HW.nvlink_gbps)


def test_n_concurrent_transfers_share_a_link():
    env, plan, fabric, arrivals, _ = _fabric(presets.get("small"))
    src0 = np.flatnonzero((plan.transfer_link == NVLINK) & (plan.transfer_src == 0)
                          & (plan.transfer_bytes == plan.transfer_bytes.max()))
    xs = [int(x) for x in src0[:5]]
    assert len(xs) == 5
    for x in xs:
        fabric.send(x)
    env.run()
    for x in xs:
        assert close(arrivals[x], HW.nvlink_latency_ns + 5 * plan.transfer_bytes[x] / HW.nvlink_gbps)


def test_processor_sharing_of_unequal_transfers():
    env = Clock()
    link = SharedLink(env, 2.0)
    sizes = [100.0, 300.0, 700.0]
    done = {}
    for b in sizes:
        link.transfer(b).callbacks.append(lambda _, b=b: done.update({b: env.now}))
    env.run()
    # all three share until the smallest leaves, then two, then one
    t1 = 100 * 3 / 2
    t2 = t1 + 200 * 2 / 2
    t3 = t2 + 400 / 2
    assert close(done[100.0], t1) and close(done[300.0], t2) and close(done[700.0], t3)


def _network_cfg():
    return presets.get("tiny-nodrop")  # 4 GPUs, 2 per node


def test_ibrc_fence_drains_m_outstanding_writes():
    env = Clock()
    nic = Nic(env, HW, 0, 0, TraceBuilder())
    m, b = 7, 65536
    for i in range(m):
        nic.write(peer=2 + i % 2, tile=i, nbytes=b, expert=0)
    drained = {}

    def fence():
        start = env.now
        yield env.all_of(nic.pending())
        yield env.timeout(HW.fence_ns)
        drained["t"] = env.now - start

    env.process(fence())
    env.run()
    assert close(drained["t"], m * b / HW.nic_gbps + 2 * HW.nic_latency_ns + HW.fence_ns)


def test_ibrc_one_tile_is_ring_post_fence_signal():
    cfg = _network_cfg()
    env, plan, fabric, arrivals, rec = _fabric(cfg, "ibrc")
    x = int(np.flatnonzero((plan.transfer_link == NETWORK) & (plan.transfer_kind == DISPATCH))[0])
    fabric.send(x)
    env.run()
    b = plan.transfer_bytes[x]
    fence_end = HW.pcie_latency_ns + HW.proxy_op_ns + b / HW.nic_gbps + 2 * HW.nic_latency_ns + HW.fence_ns
    assert close(arrivals[x], fence_end + HW.proxy_op_ns + HW.nic_latency_ns)
    fences = rec.build().where("proxy", "fence")
    assert len(fences) == 1 and close(float(fences["end"][0]), fence_end)


def test_nic_order_never_stalls_the_proxy():
    cfg = _network_cfg()
    env, plan, fabric, arrivals, rec = _fabric(cfg, "nic_order")
    xs = [int(x) for x in np.flatnonzero((plan.transfer_link == NETWORK) & (plan.transfer_src == 0))]
    m = len(xs)
    assert m >= 4
    for x in xs:
        fabric.send(x)
    env.run()
    trace = rec.build()
    proxy = trace.where("proxy")
    assert not len(proxy.where(kind="fence"))
    # back to back from the moment the requests land: 2 ops per tile, never blocked
    assert close(float(proxy["end"].max()), HW.pcie_latency_ns + 2 * m * HW.proxy_op_ns)
    assert len(trace.where("nic", "fence")) == m


def test_nic_order_one_tile_signal_waits_on_the_nic_for_the_write():
    env, plan, fabric, arrivals, rec = _fabric(_network_cfg(), "nic_order")
    x = int(np.flatnonzero(plan.transfer_link == NETWORK)[0])
    fabric.send(x)
    env.run()
    written = HW.pcie_latency_ns + HW.proxy_op_ns + plan.transfer_bytes[x] / HW.nic_gbps + 2 * HW.nic_latency_ns
    assert close(arrivals[x], written + HW.nic_latency_ns)
    fence = rec.build().where("nic", "fence")
    assert close(float(fence["start"][0]), HW.pcie_latency_ns + 2 * HW.proxy_op_ns)
    assert close(float(fence["end"][0]), written)


@pytest.mark.parametrize("transport", sim.TRANSPORTS)
def test_single_gpu_runs_the_same_under_every_transport(transport):
    cfg = presets.get("tiny").replace(ranks=1, experts=8)
    assert sim.simulate(cfg, transport=transport).metrics["latency_ns"] == \
        sim.simulate(cfg).metrics["latency_ns"]
