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
    p0, p1 = gemm(p, tile_plan.GEMM0), gemm(p, tile_plan.GEMM1)
    g0, g1 = gemm(g, tile_plan.GEMM0), gemm(g, tile_plan.GEMM1)
    # a gated GEMM0 task: tile_n / 2 columns of I, its tile_n weight columns their gate and up halves
    assert np.all(g.task_cols[g0] == gated.tile_n // 2) and g0.sum() == 2 * p0.sum()
    assert np.array_equal(tile_plan.weight_columns(gated, g.task_kind[g0], g.task_cols[g0]), 2 * g.task_cols[g0])
    assert np.array_equal(g.task_cols[g1], p.task_cols[p1])
    # so each task reads and multiplies what a plain one does; the phase, twice as much
    fp, fg = costs.flops_per_row(plain, p), costs.flops_per_row(gated, g)
    assert np.all(fg[g0] == fp[p0][0]) and fg[g0].sum() == 2 * fp[p0].sum() and np.array_equal(fg[g1], fp[p1])
    assert g.task_flops[g0].sum() == 2 * p.task_flops[p0].sum()
    alone = costs.weight_bytes_alone(gated, g, 1, queue)  # one processor: every slice alone
    assert np.all(alone[g0] == gated.hidden * gated.tile_n * gated.dtype_bytes)
    assert alone[g0].sum() == 2 * costs.weight_bytes_alone(plain, p, 1, queue)[p0].sum()
    # the plan's FLOPs are rows x FLOPs per row, so a calibrated row group counts the rows right
    assert np.array_equal(g.task_flops[g0], g.tile_rows[g.task_tile[g0]] * fg[g0])
    tg = costs.task_ns(HW.for_config(gated), gated, g.task_kind, g.task_flops.astype(float), g.task_bytes.astype(float),
                       costs.weight_bytes_alone(gated, g, 132, queue), fg)
    tp = costs.task_ns(HW.for_config(plain), plain, p.task_kind, p.task_flops.astype(float), p.task_bytes.astype(float),
                       costs.weight_bytes_alone(plain, p, 132, queue), fp)
    assert tg[g0].sum() > tp[p0].sum()


def test_a_ragged_last_block_costs_its_own_columns():
    cfg = presets.get("small").replace(precision="bfloat16", tile_n=384, tile_k=64, activation="swiglu", seed=1)
    plan = reference.plan_of(cfg)  # I = 1024 in gated blocks of 192: 5 x 192 + 64; H = 512: 384 + 128
    t0 = plan.task_tile == 0
    for kind, widths in ((tile_plan.GEMM0, [192] * 5 + [64]), (tile_plan.GEMM1, [384, 128])):
        sel = t0 & gemm(plan, kind)
        assert plan.task_cols[sel].tolist() == widths
        wide = np.array(widths) * (2 if kind == tile_plan.GEMM0 else 1)  # weight columns
        fpr = costs.flops_per_row(cfg, plan)[sel]
        assert np.array_equal(fpr, 2 * (cfg.hidden if kind == tile_plan.GEMM0 else cfg.ffn) * wide)
        wb = costs.weight_bytes_alone(cfg, plan, 1, "tile")[sel]  # one processor: every slice alone
        assert np.allclose(wb / wb[0], wide / wide[0])
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
    assert g0.sum() == shared.size * tile_plan.column_blocks(cfg, tile_plan.GEMM0)
    assert c["start"][g0].min() >= gate_end
    # no routed tile can start before its rows arrive, so the first shared tasks run before any routed one
    routed = (c["role"] == ROLE["processor"]) & (c["kind"] == KIND["gemm0"]) & ~np.isin(c["tile"], shared)
    assert c["start"][g0].min() < c["start"][routed].min()
