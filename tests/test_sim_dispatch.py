"""The simulated dispatch follows the kernel's two paths: "store" gathers a chunk's rows straight
into the owner's inbox, shared by up to 4 processors when the dispatch slots are fewer than the
processors (this GPU and NVLink peers only), "put" packs and puts each chunk from one block."""

import numpy as np
import pytest

import reference
import sim
from moelab.cli import main
from reference import presets
from reference.plan import DISPATCH, LOCAL, NETWORK, NVLINK
from sim import costs, hardware
from sim.trace import DISPATCH_PATHS

HW = hardware.get("h200-sxm")


def shares_of(trace, rank):
    d = trace.where("processor", "dispatch")
    return d.columns if rank is None else {k: v[d["rank"] == rank] for k, v in d.columns.items()}


@pytest.mark.parametrize("ranks,nodes", [(1, 1), (2, 1), (4, 2)])
def test_every_chunk_is_moved_whole_by_its_shares(ranks, nodes):
    cfg = sim.with_nodes(presets.get("flashmoe").replace(ranks=ranks, tokens=2048, seed=int(np.random.randint(1e6))),
                         nodes)
    plan = reference.plan_of(cfg)
    parts = costs.dispatch_parts(cfg, HW.processors, "store")
    assert parts == min(HW.processors // costs.dispatch_slots(cfg), costs.DISPATCH_MAX_PARTS) > 1
    for path in DISPATCH_PATHS:
        d = shares_of(sim.simulate(cfg, HW, dispatch=path, plan=plan).trace, None)
        for x in np.flatnonzero(plan.transfer_kind == DISPATCH):
            # a tile holds one chunk of each source at most: (tile, source) names the chunk
            mine = (d["tile"] == plan.transfer_tile[x]) & (d["rank"] == plan.transfer_src[x])
            # on one GPU the staged dispatch is the flat store (processor.cuh dispatch_chunks)
            flat = path == "store" or (path == "staged" and ranks == 1)
            n = parts if flat and plan.transfer_link[x] != NETWORK else 1
            assert mine.sum() == n and d["bytes"][mine].sum() == plan.transfer_bytes[x]
            assert np.unique(d["lane"][mine]).size == n  # each share on its own processor
            assert (d["peer"][mine] == plan.transfer_dst[x]).all()


def test_stored_shares_end_the_dispatch_sooner():
    cfg = presets.get("flashmoe").replace(ranks=2)
    plan = reference.plan_of(cfg)
    ends = {path: shares_of(sim.simulate(cfg, HW, dispatch=path, plan=plan).trace, 0)["end"].max()
            for path in DISPATCH_PATHS}
    assert ends["store"] < ends["put"]


@pytest.mark.parametrize("merge", [True, False])
def test_shares_go_to_processors_in_the_kernels_order(merge):
    # processor.cuh deal_chunks: a source's non-empty chunks numbered c = 0.. expert by expert (window
    # order within its block), `parts` shares each, share c x parts + part on processor u mod processors
    cfg = presets.get("flashmoe").replace(tokens=1536, merge_sources=merge)  # C = 48: merged blocks straddle tiles
    d = shares_of(sim.simulate(cfg, HW, dispatch="store").trace, None)
    plan = reference.plan_of(cfg)
    parts = costs.dispatch_parts(cfg, HW.processors, "store")
    assert parts > 1
    stride = reference.plan.source_stride(cfg)
    places = set()
    for src in range(cfg.ranks):
        mine = sorted((int(plan.tile_expert[t]), int(plan.tile_window[t]), int(t))
                      for s, t in zip(plan.chunk_src, plan.chunk_tile) if s == src)
        for c, (_, window, t) in enumerate(mine):
            places.add(window - src * stride // cfg.tile_m)
            want = [(c * parts + part) % HW.processors for part in range(parts)]
            assert sorted(d["lane"][(d["tile"] == t) & (d["rank"] == src)]) == sorted(want)
    assert places == ({0, 1} if merge else {0})


def test_a_blocks_later_shares_run_beside_the_other_blocks_later_shares():
    """At 16K tokens on two GPUs with one block per SM the 131 processors take 256 shares: the first
    round stores into this GPU, the second goes over NVLink, 125 shares at once, sharing the port
    (not each at the block's own rate, as beside the first round's 3 NVLink shares): the port
    passes their bytes at its rate, and each takes about a 125th of it."""
    hw = HW.replace(blocks_per_sm=1)
    cfg = presets.get("flashmoe").replace(ranks=2, tokens=16384, seed=int(np.random.randint(1e6)))
    d = shares_of(sim.simulate(cfg, hw, dispatch="store").trace, 0)
    order = np.lexsort((d["start"], d["lane"]))
    lane = d["lane"][order]
    rounds = np.concatenate([np.arange(n) for n in np.bincount(lane)])  # each lane's shares in time order
    nvlink = d["peer"][order] != 0
    assert rounds.max() >= 1 and nvlink[rounds == 0].sum() < nvlink[rounds == 1].sum()
    second = nvlink & (rounds == 1)
    start, end, nbytes = (d[c][order][second] for c in ("start", "end", "bytes"))
    assert end.max() - start.min() >= nbytes.sum() / hw.nvlink_gbps * (1 - 1e-12)
    alone = nbytes * costs.nvlink_store_rate(hw)[0]
    took = end - start
    assert np.median(took / (nbytes * second.sum() / hw.nvlink_gbps)) > 0.8 > 4 * np.median(alone / took)


def test_a_stored_share_contends_with_the_bytes_stored_into_its_gpu():
    """Beside shares stored into the NVLink peer, a share stored into this GPU is quicker than among
    as many bytes in flight all stored into this GPU: the peer's shares load this GPU's memory
    for their rows only, not their stores (two H100s, bf16: local shares 28 us on two GPUs, 37 on one;
    one block per SM, so no NVLink share on the same SM holds the local one back)."""
    hw = HW.replace(blocks_per_sm=1, dispatch_store_fixed_ns=3000.0, dispatch_store_l2_ns_per_byte=0.06,
                    dispatch_store_ns_per_byte=0.30, dispatch_store_knee_bytes=float(2 ** 25))
    share = 128 * 4096.0
    inflight = 128 * share  # 64 MiB: past the knee where all of it is stored here
    alone = costs.dispatch_ns(hw, share, LOCAL, "store", inflight, {LOCAL: 128})
    beside = costs.dispatch_ns(hw, share, LOCAL, "store", inflight, {LOCAL: 64, NVLINK: 64})
    assert beside < alone
    assert beside == pytest.approx(costs.store_dispatch_ns(hw, share, inflight / 2) + hw.task_overhead_ns)


@pytest.mark.parametrize("ranks,path", [(1, "store"), (2, "staged"), (2, "store")])
def test_a_block_walks_its_deals_counts_to_each_share_and_after_its_last(ranks, path):
    """processor.cuh deal_chunks reads the row count of each expert on a block's list in turn: a
    share starts the block's turnaround plus a count for every expert from its share before (or the
    list's start) to its own after the block's previous share (or, with its first turnaround, the
    gate), and the block walks the rest of its list before its first task."""
    first, turnaround, count = 2600.0, 1700.0, 450.0
    hw = HW.replace(deal_first_ns=first, deal_share_ns=turnaround, deal_count_ns=count)
    cfg = presets.get("flashmoe").replace(ranks=ranks, tokens=1024, experts=32, seed=int(np.random.randint(1e6)))
    tr = sim.simulate(cfg, hw, dispatch=path).trace
    senders, per_gpu = min(costs.STAGED_BLOCKS, hw.processors - 1), cfg.local_experts
    walked = 0
    for rank in range(ranks):
        d = shares_of(tr, rank)
        gate = tr.where("processor", "gate")
        tasks = tr.where("processor", "gemm0")
        for lane in np.unique(d["lane"]):
            mine = d["lane"] == lane
            order = np.argsort(d["start"][mine])
            start, end, expert = (d[c][mine][order] for c in ("start", "end", "expert"))
            owner, local = np.divmod(expert, per_gpu)
            if path == "staged" and lane < senders:  # the peers' local experts, owners from rank + 1 on
                place, listed = local * (ranks - 1) + (owner - rank - 1) % ranks, per_gpu * (ranks - 1)
            elif path == "staged":
                place, listed = local, per_gpu
            else:
                place, listed = expert, cfg.experts
            before = np.concatenate([[gate["end"][(gate["rank"] == rank) & (gate["lane"] == lane)].max()], end[:-1]])
            turn = np.where(np.arange(len(start)) == 0, first, turnaround)
            assert start == pytest.approx(before + turn + count * np.diff(place, prepend=-1))
            first_task = tasks["start"][(tasks["rank"] == rank) & (tasks["lane"] == lane)]
            if first_task.size:
                assert first_task.min() >= end[-1] + count * (listed - 1 - place[-1]) - 1e-6
            walked += 1
    assert walked > ranks * 16


def test_a_landed_chunk_is_seen_after_its_subscribers_pass():
    """A tile's signal is taken by a subscriber warp no sooner than its lane's pass over the entries
    the GPU watches comes round (costs.signal_seen_ns): the first tiles, with the warps free, exactly then."""
    hw = HW.replace(signal_seen_ns=2000.0, signal_seen_ns_per_entry=30.0)
    cfg = presets.get("flashmoe").replace(ranks=1, tokens=2048, seed=int(np.random.randint(1e6)))
    plan = reference.plan_of(cfg)
    seen = costs.signal_seen_ns(hw, cfg, plan, 0)
    assert seen == 2000.0 + 30.0 * costs.watched_entries(cfg, plan, 0) and costs.watched_entries(cfg, plan, 0) > 0
    tr = sim.simulate(cfg, hw, dispatch="store").trace
    d, sig = shares_of(tr, 0), tr.where("subscriber", "signal")
    delays = []
    for t in np.unique(d["tile"]):
        landed = d["end"][d["tile"] == t].max()
        took = sig["start"][sig["tile"] == t]
        delays.append(took[took >= landed].min() - landed)
    assert min(delays) == pytest.approx(seen) and min(delays) <= max(delays)


def test_unknown_dispatch_path(capsys):
    with pytest.raises(sim.SimError, match=r"'dispatch' = 'copy' is not allowed: one of staged, store, put"):
        sim.simulate(presets.get("tiny"), dispatch="copy")
    assert main(["sim", "--dispatch", "copy"]) == 2
    assert "invalid choice: 'copy'" in capsys.readouterr().err
    assert main(["sim", "--staged-blocks", "0"]) == 2
    assert "'0' is not allowed: a whole number of at least 1" in capsys.readouterr().err


def test_the_kernels_dispatch_is_staged_and_the_simulator_follows_it():
    rng = np.random.default_rng()
    k, p = int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 8]))
    cfg = presets.get("tiny-deepseek").replace(top_k=k, experts=16, ranks=p)
    assert sim.simulate(cfg).trace.meta["dispatch"] == costs.DEFAULT_DISPATCH == "staged"  # unless told another
    assert sim.simulate(cfg, dispatch="store").trace.meta["dispatch"] == "store"
    assert sim.simulate(sim.with_nodes(cfg.replace(ranks=4), 2)).trace.meta["dispatch"] == "staged"  # across nodes too
