"""A GPU's NVLink port as a link its flows share equally (links.SharedLink for the GEMM1 tasks' stores,
sim.ports for the dispatch's, way out and way in), on hand-worked cases: two flows each at half the
rate, a wave of GEMM1 tasks holding its blocks until its stores are through, many GPUs storing into
one hot GPU sharing its way in; and one simulation pass."""

import numpy as np
import pytest

import reference
import sim
from reference import presets
from reference.plan import DISPATCH, NVLINK
from sim import costs, engine, hardware
from sim.clock import Clock
from sim.kernel import Scheduler
from sim.links import SharedLink
from sim.ports import Move, move_times
from sim.trace import KIND, ROLE

H200 = hardware.PRESETS["h200-sxm"]


def scheduled(processors: int, tasks: list[tuple[float, float, float]], gbps: float, handoff: float = 0.0):
    """(lane, start, end) of `tasks` (own work, stores at the block's rate, bytes through the port)
    queued at time 0 on `processors` blocks of one GPU whose port has `gbps`, in queue order."""
    env = Clock()
    sched = Scheduler([0.0] * processors, handoff=handoff, env=env, port=SharedLink(env, gbps))
    out: dict[int, tuple[int, float, float]] = {}
    sched.submit(0.0, [(own, store, nbytes, lambda i, lane, s, e: out.__setitem__(i, (lane, s, e)), i)
                       for i, (own, store, nbytes) in enumerate(tasks)])
    env.run()
    return [out[i] for i in range(len(tasks))]


def test_two_flows_share_a_port_each_at_half_rate():
    rng = np.random.default_rng()
    gbps, nbytes, own = rng.uniform(100, 400), rng.uniform(1e4, 1e6), rng.uniform(1e3, 1e4)
    alone = scheduled(2, [(own, 0.0, nbytes)], gbps)
    assert alone[0][2] == pytest.approx(own + nbytes / gbps)
    both = scheduled(2, [(own, 0.0, nbytes)] * 2, gbps)
    assert [e for _, _, e in both] == pytest.approx([own + 2 * nbytes / gbps] * 2)  # each at gbps / 2


def test_a_task_alone_ends_with_its_stores_at_the_blocks_rate():
    gbps, nbytes, own = 366.0, 48 * 1024.0, 5000.0
    store = nbytes * 0.09  # a block stores slower than the port passes one flow
    (_, start, end), = scheduled(1, [(own, store, nbytes)], gbps)
    assert (start, end) == (0.0, pytest.approx(own + store))


def test_a_wave_holds_its_blocks_until_its_bytes_are_through():
    """Two blocks, three GEMM1 tasks and a task without stores behind them: the first two end together
    when both flows are through; the third starts on a block they free, and the last on the other."""
    gbps, nbytes, own, handoff = 200.0, 1e5, 3000.0, 50.0
    rows = scheduled(2, [(own, 0.0, nbytes)] * 3 + [(own, 0.0, 0.0)], gbps, handoff)
    wave = own + 2 * nbytes / gbps
    assert [e for _, _, e in rows[:2]] == pytest.approx([wave, wave])
    assert rows[2][1] == pytest.approx(wave + handoff) and rows[3][1] == pytest.approx(wave + handoff)
    assert rows[2][0] != rows[3][0]
    assert rows[2][2] == pytest.approx(wave + handoff + own + nbytes / gbps)  # alone in the port
    assert rows[3][2] == pytest.approx(wave + handoff + own)


def test_flows_of_unequal_bytes_leave_in_turn():
    """Two blocks of one GPU store into one peer at once: the smaller share leaves at half the rate
    throughout, the larger has the port to itself after it; each then waits its fence."""
    rng = np.random.default_rng()
    gbps, small, fence = rng.uniform(100, 400), rng.uniform(1e3, 1e5), rng.uniform(100, 2000)
    large = small * rng.uniform(1.5, 10)
    (a,), (b,) = move_times([[Move(fence, small, 0.0, 0, 1)], [Move(fence, large, 0.0, 0, 1)]], [0.0, 0.0], gbps)
    assert a == (0.0, pytest.approx(2 * small / gbps + fence))
    assert b == (0.0, pytest.approx((small + large) / gbps + fence))


def test_a_block_stores_at_its_own_rate_under_its_share_and_in_order():
    gbps, nbytes = 300.0, 3e4
    (first, second, local), = move_times([[Move(10.0, nbytes, 0.05, 0, 1), Move(10.0, nbytes, 0.05, 0, 2),
                                          Move(700.0, 0, 0.0, 0, 0)]], [100.0], gbps)
    assert first == (100.0, pytest.approx(100.0 + nbytes * 0.05 + 10.0))  # 20 GB/s: under the port's 300
    assert second == (first[1], pytest.approx(first[1] + nbytes * 0.05 + 10.0))
    assert local == (second[1], pytest.approx(second[1] + 700.0))  # into its own GPU: its time alone


def test_a_hot_receiver_shares_its_way_in():
    """Three GPUs' 16 blocks each store a share into the GPU that owns the hot experts: its way in
    passes the 48 flows, each at a 48th of the port, half a block's own rate (each GPU's way out
    alone, a 16th of it, would not hold them back); a fourth GPU's blocks storing into a cold GPU
    keep their own rate."""
    gbps, share, per_byte = 366.0, 64 * 1024.0, 1 / 16.0  # a block alone: 16 GB/s
    hot = [[Move(0.0, share, per_byte, src, 0)] for src in (1, 2, 3) for _ in range(16)]
    cold = [[Move(0.0, share, per_byte, 0, 1)] for _ in range(16)]
    times = move_times(hot + cold, [0.0] * 64, gbps)
    assert [t[0][1] for t in times[:48]] == pytest.approx([48 * share / gbps] * 48)
    assert [t[0][1] for t in times[48:]] == pytest.approx([share * per_byte] * 16)
    assert 48 / gbps > 2 * per_byte > 2 * 16 / gbps


def test_the_skewed_layers_hot_gpu_receives_no_faster_than_its_port():
    """Routing skewed towards GPU 0's experts (7 times the bytes into it that go into any other): the
    other GPUs' shares into it end no sooner than its way in can pass their bytes after the gate,
    though each GPU's way out and blocks alone would pass them sooner."""
    cfg = presets.get("flashmoe").replace(ranks=4, tokens=2048, precision="bfloat16", skew=1.0, tile_n=256, tile_k=64)
    plan = reference.plan_of(cfg)
    peer = (plan.transfer_link == NVLINK) & (plan.transfer_kind == DISPATCH)
    into = np.bincount(plan.transfer_dst[peer], plan.transfer_bytes[peer], minlength=4)
    hot = peer & (plan.transfer_dst == 0)
    out = np.bincount(plan.transfer_src[hot], plan.transfer_bytes[hot], minlength=4)
    assert into.argmax() == 0 and into[0] > 5 * into[1:].max()
    hw = H200.for_config(cfg)
    tr = sim.simulate(cfg, hardware=hw, plan=plan).trace
    gate = tr["end"][tr["kind"] == KIND["gate"]].max()
    sel = (tr["role"] == ROLE["processor"]) & (tr["kind"] == KIND["dispatch"]) & (tr["peer"] == 0) & (tr["rank"] != 0)
    assert tr["end"][sel].max() - gate >= into[0] / hw.nvlink_gbps
    alone = max(out.max() / hw.nvlink_gbps, out.max() / costs.STAGED_BLOCKS * costs.nvlink_store_rate(hw)[0])
    assert into[0] / hw.nvlink_gbps > 1.5 * alone


def test_one_pass_where_stores_meet_at_a_port(monkeypatch):
    """Four GPUs at 1K bf16 tokens: every GEMM1 wave stores into three peers through one port, in one
    simulation (the events grow with the work, not twice it)."""
    made = []

    class Counted(engine.Clock):
        def __init__(self, say, tick):
            super().__init__(say, tick)
            made.append(self)

    monkeypatch.setattr(engine, "Clock", Counted)
    cfg = presets.get("flashmoe").replace(ranks=4, tokens=1024, precision="bfloat16", tile_n=256, tile_k=64)
    said: list[str] = []
    r = sim.simulate(cfg, hardware=H200, progress=said.append)
    assert len(made) == 1 and r.events == made[0].events
    assert not any("pass" in line for line in said), said
