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


def test_a_ragged_last_block_multiplies_a_whole_tile_but_streams_its_own_columns():
    """The kernel multiplies a whole tile_n-wide weight slice (the columns past the matrix are the
    TMA's zero fill): a ragged block's multiply costs a full one's, its weight load its own columns'."""
    cfg = presets.get("small").replace(precision="bfloat16", tile_n=384, tile_k=64, activation="swiglu", seed=1)
    plan = reference.plan_of(cfg)  # I = 1024 in gated blocks of 192: 5 x 192 + 64; H = 512: 384 + 128
    t0 = plan.task_tile == 0
    multiply = costs.multiply_flops(cfg, plan)
    for kind, widths in ((tile_plan.GEMM0, [192] * 5 + [64]), (tile_plan.GEMM1, [384, 128])):
        sel = t0 & gemm(plan, kind)
        assert plan.task_cols[sel].tolist() == widths
        wide = np.array(widths) * (2 if kind == tile_plan.GEMM0 else 1)  # weight columns
        depth = cfg.hidden if kind == tile_plan.GEMM0 else cfg.ffn
        assert np.all(costs.flops_per_row(cfg, plan)[sel] == 2 * depth * cfg.tile_n)
        assert np.all(multiply[sel] == plan.tile_rows[0] * 2 * depth * cfg.tile_n)
        assert np.array_equal(plan.task_flops[sel], plan.tile_rows[0] * 2 * depth * wide)  # the useful FLOPs
        wb = costs.weight_bytes_alone(cfg, plan, 1, "tile")[sel]  # one processor: every slice alone
        assert np.allclose(wb / wb[0], wide / wide[0])
    hw = HW.for_config(cfg)
    args = (cfg, plan.task_kind, multiply, plan.task_bytes.astype(float))
    g1 = np.flatnonzero(t0 & gemm(plan, tile_plan.GEMM1))
    streamed = costs.task_ns(hw.replace(weight_load_ns_per_byte=1.0), *args,
                             costs.weight_bytes_alone(cfg, plan, 1, "tile"), costs.flops_per_row(cfg, plan))
    assert streamed[g1[1]] < streamed[g1[0]]  # a third of the slice to load
    in_l2 = costs.task_ns(hw.replace(weight_load_ns_per_byte=0.0), *args, 0.0, costs.flops_per_row(cfg, plan))
    assert in_l2[g1[1]] == pytest.approx(in_l2[g1[0]])  # the same multiply


def test_a_tensor_core_builds_rows_are_multiplied_in_whole_64_row_blocks():
    rows = np.array([1, 20, 64, 65, 100, 128])
    assert costs.grouped_rows(rows, costs.WGMMA_ROW_BLOCK, True).tolist() == [64, 64, 64, 128, 128, 128]
    # the float32 SIMT GEMM: a short tile in its warps' 16-row shares
    assert costs.grouped_rows(rows, 64, False).tolist() == [16, 32, 64, 128, 128, 128]
    cfg = presets.get("flashmoe").replace(precision="bfloat16", tile_n=256, tile_k=64)
    hw = hardware.get(str(compare.MEASUREMENTS / "calibrated-h200.json")).for_config(cfg)
    assert hw.gemm_row_group == costs.WGMMA_ROW_BLOCK
    row = 2.0 * cfg.hidden * cfg.tile_n
    ns = costs.task_ns(hw, cfg, np.zeros(4, int), rows[[1, 2, 3, 5]] * row, np.zeros(4), 0.0, row,
                       np.full(4, cfg.hidden * cfg.tile_n * 2.0))
    assert ns[0] == pytest.approx(ns[1]) and ns[2] == pytest.approx(ns[3]) and ns[2] > ns[1]


def test_every_task_streams_its_whole_weight_slice_so_deeper_gemms_take_longer():
    """A GEMM task's whole slice (depth x its weight columns, a gated GEMM0's gate and up ones) goes
    through the L2 whatever the tiles sharing it: twice the depth, twice that part of its time."""
    shallow = presets.get("small").replace(precision="bfloat16", tile_n=128, tile_k=64, activation="swiglu", seed=3)
    deep = shallow.replace(hidden=2 * shallow.hidden)
    times = []
    for cfg in (shallow, deep):
        plan = reference.plan_of(cfg)
        sel = gemm(plan, tile_plan.GEMM0) & (plan.task_tile == 0)
        slices = costs.weight_slice_bytes(cfg, plan)
        cols = tile_plan.weight_columns(cfg, plan.task_kind, plan.task_cols)
        assert np.all(slices[sel] == cfg.hidden * cols[sel] * 2) and np.all(cols[sel] == cfg.tile_n)
        assert np.all(slices[plan.task_kind == tile_plan.COMBINE] == 0)
        hw = HW.for_config(cfg).replace(weight_stream_ns_per_byte=0.05, weight_load_ns_per_byte=0.0,
                                        gemm_overlap_power=0.0)
        args = (hw, cfg, plan.task_kind, costs.multiply_flops(cfg, plan),
                plan.task_bytes.astype(float), 0.0, costs.flops_per_row(cfg, plan))
        with pytest.raises(ValueError, match="weight_slice"):
            costs.task_ns(*args)  # a preset that streams needs the slices
        ns = costs.task_ns(*args, slices)
        no_stream = costs.task_ns(args[0].replace(weight_stream_ns_per_byte=0.0), *args[1:], slices)
        assert np.allclose(ns[sel] - no_stream[sel], 0.05 * slices[sel])
        times.append((ns[sel] - no_stream[sel])[0])
    assert times[1] == pytest.approx(2 * times[0])


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
