"""The simulator prices the task shapes of real models' layers from the tile plan: a gated GEMM0
task reads and multiplies its gate and up columns (twice its output's), a ragged last column block
costs its own columns, and a shared expert's tiles are local tasks with no dispatch."""

import numpy as np
import pytest

import reference
import sim
from reference import plan as tile_plan
from reference import presets
from sim import compare, costs, hardware
from sim.trace import KIND, ROLE

HW = hardware.get(str(compare.MEASUREMENTS / "calibrated-h100.json"))


def gemm(plan, kind):
    return plan.task_kind == kind


@pytest.mark.parametrize("queue", costs.QUEUE_POLICIES)
def test_gated_gemm0_reads_and_multiplies_twice_its_columns(queue):
    plain = presets.get("small").replace(activation="silu", seed=3)
    gated = plain.replace(activation="swiglu")
    p, g = reference.plan_of(plain), reference.plan_of(gated)
    assert np.array_equal(p.task_kind, g.task_kind) and np.array_equal(p.task_cols, g.task_cols)
    g0, g1 = gemm(g, tile_plan.GEMM0), gemm(g, tile_plan.GEMM1)
    wp, wg = (costs.weight_bytes_alone(c, pl, 132, queue) for c, pl in ((plain, p), (gated, g)))
    assert np.allclose(wg[g0], 2 * wp[g0]) and np.allclose(wg[g1], wp[g1])
    # the slice of a gated GEMM0 task: H x (its gate and up columns) x the dtype's bytes (one processor: alone)
    alone = costs.weight_bytes_alone(gated, g, 1, queue)
    assert np.all(alone[g0] == gated.hidden * 2 * gated.tile_n * gated.dtype_bytes)
    fp, fg = costs.flops_per_row(plain, p), costs.flops_per_row(gated, g)
    assert np.array_equal(fg[g0], 2 * fp[g0]) and np.array_equal(fg[g1], fp[g1])
    assert np.array_equal(fg[g0], 2 * gated.hidden * 2 * g.task_cols[g0])
    # the plan's FLOPs are rows x FLOPs per row, so a calibrated row group counts the rows right
    rows = g.tile_rows[g.task_tile[g0]]
    assert np.array_equal(g.task_flops[g0], rows * fg[g0])
    tg = costs.task_ns(HW.for_config(gated), gated, g.task_kind, g.task_flops.astype(float),
                       g.task_bytes.astype(float), wg, fg)
    tp = costs.task_ns(HW.for_config(plain), plain, p.task_kind, p.task_flops.astype(float),
                       p.task_bytes.astype(float), wp, fp)
    assert np.all(tg[g0] > tp[g0]) and np.allclose(tg[g1], tp[g1])


def test_a_ragged_last_block_costs_its_own_columns():
    cfg = presets.get("small").replace(dtype="bfloat16", tile_n=384, tile_k=64, activation="swiglu", seed=1)
    plan = reference.plan_of(cfg)  # I = 1024: blocks of 384, 384, 256; H = 512: 384, 128
    t0 = plan.task_tile == 0
    for kind, widths in ((tile_plan.GEMM0, [384, 384, 256]), (tile_plan.GEMM1, [384, 128])):
        sel = t0 & gemm(plan, kind)
        assert plan.task_cols[sel].tolist() == widths
        fpr = costs.flops_per_row(cfg, plan)[sel]
        assert np.array_equal(fpr, 2 * (cfg.hidden if kind == tile_plan.GEMM0 else cfg.ffn)
                              * np.array(widths) * (2 if kind == tile_plan.GEMM0 else 1))
        wb = costs.weight_bytes_alone(cfg, plan, 1, "tile")[sel]  # one processor: every slice alone
        assert np.allclose(wb / wb[0], np.array(widths) / widths[0])
    durations = costs.task_ns(HW.for_config(cfg), cfg, plan.task_kind, plan.task_flops.astype(float),
                              plan.task_bytes.astype(float), costs.weight_bytes_alone(cfg, plan, 132, "tile"),
                              costs.flops_per_row(cfg, plan))
    g1 = np.flatnonzero(t0 & gemm(plan, tile_plan.GEMM1))
    assert durations[g1[1]] < durations[g1[0]]


@pytest.mark.parametrize("queue", costs.QUEUE_POLICIES)
def test_shared_expert_tiles_are_local_and_ready_after_the_gate(queue):
    cfg = presets.get("tiny-deepseek")
    plan = reference.plan_of(cfg)
    trace = sim.simulate(cfg, queue=queue, plan=plan).trace
    c = trace.columns
    shared = np.flatnonzero(plan.tile_expert >= cfg.experts)
    assert shared.size and np.all(plan.tile_owner[shared] == plan.chunk_src[plan.chunk_lo[shared]])
    dispatch = (c["role"] == ROLE["processor"]) & (c["kind"] == KIND["dispatch"])
    assert not np.isin(c["tile"][dispatch], shared).any()
    gate_end = c["end"][(c["role"] == ROLE["processor"]) & (c["kind"] == KIND["gate"])].max()
    g0 = (c["role"] == ROLE["processor"]) & (c["kind"] == KIND["gemm0"]) & np.isin(c["tile"], shared)
    assert g0.sum() == shared.size * -(-cfg.ffn // cfg.tile_n)
    assert c["start"][g0].min() >= gate_end
    # no routed tile can start before its rows arrive, so the first shared tasks run before any routed one
    routed = (c["role"] == ROLE["processor"]) & (c["kind"] == KIND["gemm0"]) & ~np.isin(c["tile"], shared)
    assert c["start"][g0].min() < c["start"][routed].min()
