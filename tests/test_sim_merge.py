"""Tiles shared by several sources (Config.merge_sources) in the simulator: a tile lands with its
last chunk, its GEMM1 tasks store every chunk's rows into the chunk's source, every chunk comes
back and is combined at its source, and at 1K tokens on two H200s merged tiles make the layer
faster (half the GEMM tasks, each a fixed cost and a weight slice's load)."""

import numpy as np
import pytest

import reference
import sim
from reference import presets
from reference.plan import GEMM1, NVLINK, RETURN
from sim import compare, costs, hardware
from sim.trace import KIND, ROLE

H200 = hardware.get(str(compare.MEASUREMENTS / "calibrated-h200.json"))
TILES = {"bfloat16": (128, 256, 64), "float32": (128, 64, 16)}  # the tiles the calibration measured


def small_layer(dtype: str, merge: bool):
    """FlashMoE's layer at 1K tokens on two GPUs: C = 32 slots per (source, expert), a quarter tile."""
    m, n, k = TILES[dtype]
    return presets.get("flashmoe").replace(ranks=2, tokens=1024, precision=dtype, tile_m=m, tile_n=n, tile_k=k,
                                          merge_sources=merge)


def rows_of(trace, role: str, kind: str):
    sel = (trace["role"] == ROLE[role]) & (trace["kind"] == KIND[kind])
    return {c: v[sel] for c, v in trace.columns.items()}


@pytest.mark.parametrize("dtype", list(TILES))
def test_merged_tiles_make_the_small_two_gpu_layer_faster(dtype):
    ms = {m: sim.simulate(small_layer(dtype, m), hardware=H200).metrics["latency_ms"] for m in (True, False)}
    assert ms[True] < 0.9 * ms[False], ms


def test_a_tile_lands_with_its_last_chunk():
    cfg = small_layer("float32", True)
    plan = reference.plan_of(cfg)
    assert np.bincount(plan.chunk_tile).min() == 2  # every tile holds both GPUs' rows
    trace = sim.simulate(cfg, hardware=H200, queue="tile", plan=plan).trace
    sig, g0 = rows_of(trace, "subscriber", "signal"), rows_of(trace, "processor", "gemm0")
    owner = plan.tile_owner[sig["tile"]] == sig["rank"]
    for t in range(plan.tile_expert.size):
        # at the owner a chunk's first signal is its dispatch (its own chunk's return comes later)
        mine = owner & (sig["tile"] == t)
        landed = max(sig["end"][mine & (sig["peer"] == src)].min() for src in (0, 1))
        assert g0["start"][g0["tile"] == t].min() >= landed + H200.for_dtype("float32").wake_ns


def test_gemm1_tasks_store_each_chunk_home_and_each_chunk_is_combined_there():
    cfg = small_layer("bfloat16", True)
    plan = reference.plan_of(cfg)
    hw = H200.for_dtype(cfg.dtype)
    trace = sim.simulate(cfg, hardware=H200, plan=plan).trace
    # a GEMM1 task's extra time: its column block of the peer's chunk stored over NVLink, then its fence
    alone = costs.weight_bytes_alone(cfg, plan, hw.processors, "expert")
    durations = costs.task_ns(hw, cfg, plan.task_kind, plan.task_flops.astype(float), plan.task_bytes.astype(float),
                              alone, costs.flops_per_row(cfg, plan), costs.weight_slice_bytes(cfg, plan))
    n1 = cfg.hidden // cfg.tile_n
    ret = plan.transfer_kind == RETURN
    peer_bytes = np.bincount(plan.transfer_tile[ret], (plan.transfer_bytes * (plan.transfer_link == NVLINK))[ret],
                             minlength=plan.tile_expert.size)
    g1 = rows_of(trace, "processor", "gemm1")
    want = np.array([durations[np.flatnonzero((plan.task_tile == t) & (plan.task_kind == GEMM1))[0]]
                     + costs.store_ns(hw, NVLINK, peer_bytes[t] / n1) for t in g1["tile"]])
    assert any(peer_bytes[t] for t in g1["tile"])
    took = g1["end"] - g1["start"]
    # at least that; longer only while the GPU's NVLink port still sends earlier tasks' stores
    assert np.all(took >= want * (1 - 1e-12)) and np.any(np.isclose(took, want, rtol=1e-12))
    # one combine task per chunk, at its source
    comb = rows_of(trace, "processor", "combine")
    per_task = comb["tile"] >= 0  # the final combine's rows name no tile
    assert sorted(zip(comb["tile"][per_task].tolist(), comb["rank"][per_task].tolist())) == \
        sorted(zip(plan.chunk_tile.tolist(), plan.chunk_src.tolist()))
