"""`moelab calibrate` on synthetic microbenchmarks made from known figures: the fit recovers them,
the written preset loads and changes the prediction, and bad files give one clear error."""

import json
import math

import numpy as np
import pytest

import reference
import sim
from moelab.cli import main
from reference import presets
from reference.plan import COMBINE, LOCAL, NVLINK
from sim import calibrate, costs, hardware
from sim.calibration import gate

HALVES, KNEES = calibrate.HALVES, calibrate.KNEES  # the fit's grids
TRUE = dict(blocks_per_sm=2, matrix_efficiency=0.5, gemm_fixed_ns=140000.0, task_overhead_ns=0.0,
            l2_knee_bytes=float(KNEES[33]),
            copy_ns_per_byte=0.04, copy_extra_ns_per_byte=0.13, copy_half_bytes=float(HALVES[50]),
            put_local_ns_per_byte=0.08, put_local_extra_ns_per_byte=0.2, put_local_half_bytes=float(HALVES[25]),
            put_nvlink_ns_per_byte=0.1, copy_nvlink_ns_per_byte=0.06, nvlink_gbps=380.0, reduce_ns_per_byte=0.25,
            gate_item_ns_per_h=350.0,
            gate_slot_ns=2.0, gate_fixed_ns=20000.0, gate_split_ns=8000.0, gate_select_smem_ns=40.0,
            gate_select_global_ns=300.0, gate_list_ns=6.0, gate_weigh_ns=700.0, gate_logit_ns=150.0,
            handoff_ns=5000.0,
            nvlink_latency_ns=1200.0, dispatch_store_fixed_ns=2500.0, dispatch_store_ns_per_byte=0.12,
            weight_load_ns_per_byte=0.03, wake_ns=4000.0, assign_ns=60.0, stop_ns=7000.0,
            gemm_row_group=0.0)
# the bf16 build's: its own GEMM (against the BF16 peak, rows in whole 64-row blocks), copies of
# 2-byte rows, gate, combine and scheduler; the knee, puts and link are the float32 job's byte moves, shared
TRUE_BF16 = dict(TRUE, matrix_efficiency=0.2, gemm_fixed_ns=60000.0, gemm_row_group=64.0, copy_ns_per_byte=0.05,
                 copy_extra_ns_per_byte=0.09, copy_half_bytes=float(HALVES[40]), reduce_ns_per_byte=0.4,
                 gate_item_ns_per_h=200.0, gate_slot_ns=3.0, gate_fixed_ns=30000.0, gate_split_ns=6000.0,
                 handoff_ns=4000.0)


def _stat(v):
    return {"median": v, "p10": v, "p90": v, "min": v, "max": v, "n": 1}


def synthetic(gpu="NVIDIA H200", t=TRUE, dtype="float32"):
    """A calibration file of one build whose every figure follows the model with figures `t`."""
    hw = hardware.PRESETS["h200-sxm"].replace(**{k: v for k, v in t.items() if k != "task_overhead_ns"})
    blocks = 132 * t["blocks_per_sm"]
    rate = hw.tflops(dtype) * 1e3 * t["matrix_efficiency"] / blocks
    nb = 2 if dtype == "bfloat16" else 4

    def task(r, n=2):  # r rows (in whole groups), n tiles per expert sharing the 2048 x 64 weight slice
        group = t["gemm_row_group"] or 1
        computed = float(costs.grouped_rows(r, group, dtype in costs.WHOLE_ROW_BLOCKS))
        return (t["gemm_fixed_ns"] + 2 * computed * 2048 * 64 / rate
                + t["weight_load_ns_per_byte"] * 2048 * 64 * nb / n)

    gemm = [{"task": k, "blocks": b, "rows": r, "k": 2048, "n": 64, "flops": 2 * r * 2048 * 64, "tiles_per_expert": n,
             "weight_bytes": 2048 * 64 * nb,
             "ns_per_task": _stat(task(r, n) * (1.2 if b == 1 else 1.0))}  # alone: not fitted
            for k in ("gemm0", "gemm1")
            for b, r, n in ((1, 128, 2), (blocks, 128, 2), (blocks, 96, 2), (blocks, 64, 2), (blocks, 32, 2),
                            (blocks, 128, 1), (blocks, 128, 8))]
    tile = 128 * 2048 * nb
    copy_blocks = (1, 4, 8, 16, 24, 32, 48, 64, 96, 128, blocks)
    per_byte = [costs.contended_ns_per_byte(t["copy_ns_per_byte"], t["copy_extra_ns_per_byte"], t["copy_half_bytes"],
                                            b * tile, t["l2_knee_bytes"]) for b in copy_blocks]
    copy = [{"blocks": b, "rows": 128, "bytes": tile, "scaled": s, "ns_per_copy": _stat(tile * v)}
            for b, v in zip(copy_blocks, per_byte) for s in ((False, True) if nb == 4 else (False,))]
    put = [{"peer": p, "blocks": b, "bytes": size, "reps": 8, "issue_ns_per_put": _stat(1.0),
            "ns_per_put": _stat(costs.put_ns(hw, link, size, b * size, b)), "aggregate_gbps": 0.0}
           for p, link in (("self", LOCAL), ("nvlink", NVLINK)) for b in (1, 8, 16, 32, 64, 128, blocks)
           for size in (1 << 18, 1 << 20)]
    for p in put:
        p["aggregate_gbps"] = p["blocks"] * p["bytes"] / p["ns_per_put"]["median"]
    copy_nvlink = [{"peer": "nvlink", "blocks": b, "rows": 128, "bytes": tile,
                    "ns_per_copy": _stat(tile * costs.port_ns_per_byte(t["copy_nvlink_ns_per_byte"], b,
                                                                       t["nvlink_gbps"]))}
                   for b in (1, 2, 4, 8, 16, 32)]
    # the store path's shares at four layer sizes on one GPU (fitted); on two, half the shares go
    # to the peer and the local ones queue behind them (checks); a tile of the put path (a check)
    dispatch = [{"tokens": 64 * r, "world": 1, "peer": "self", "path": "store", "shares": 256,
                 "concurrent_blocks": 256, "rows": _stat(r), "bytes_per_row": 2048 * nb,
                 "ns_per_tile": _stat(t["dispatch_store_fixed_ns"] + r * 2048 * nb * t["dispatch_store_ns_per_byte"]),
                 "ns_per_row": _stat(1.0)} for r in (8, 32, 64, 128)]
    dispatch += [{"tokens": 8192, "world": 2, "peer": peer, "path": "store", "shares": 128, "concurrent_blocks": 256,
                  "rows": _stat(64), "bytes_per_row": 2048 * nb,
                  "ns_per_tile": _stat(costs.dispatch_ns(hw, 64 * 2048 * nb, link, "store", 256 * 64 * 2048 * nb,
                                                         {LOCAL: 128, NVLINK: 128}) - hw.task_overhead_ns),
                  "ns_per_row": _stat(1.0)} for peer, link in (("self", LOCAL), ("nvlink", NVLINK))]
    dispatch.append({"peer": "self", "tiles": 64, "concurrent_blocks": 128, "rows": _stat(128), "bytes_per_row": 8192,
                     "ns_per_tile": _stat(1.0), "ns_per_row": _stat(1.0)})
    per_block = math.ceil(8192 / (263 * 4)) * 4 * (2 * nb + 4) * 2048  # 2 rows of nb-byte values read, y written
    gate = []  # the passes selection's points (recording none, as an earlier kernel's), then the lists'
    for select in costs.GATE_SELECTS[::-1]:
        for tokens, experts, top_k in ((8192, 64, 2), (1024, 64, 2), (16384, 64, 2), (8192, 128, 2), (8192, 8, 2),
                                       (8192, 64, 8), (6144, 128, 8), (12288, 128, 4)):
            cfg = presets.get("flashmoe").replace(tokens=tokens, experts=experts, top_k=top_k, precision=dtype)
            gate.append({"tokens": tokens, "experts": experts, "hidden": 2048, "top_k": top_k, "grid": blocks,
                         "ns": costs.gate_kernel_ns(hw, cfg, select),
                         **({"select": select} if select == "lists" else {})})
    tile_k = {"TILE_K": 32, "MOE_BF16": 1} if nb == 2 else {"TILE_K": 8}
    return {"meta": {"gpu": gpu, "commit": "abc"}, "sms": 132, "world": 2,
            "tile": {"TILE_M": 128, "TILE_N": 64, **tile_k},
            "occupancy": {"megakernel_grid": blocks, "n_proc": blocks - 1, "sms": 132},
            "gemm": gemm, "copy": copy, "put": put, "copy_nvlink": copy_nvlink, "dispatch": dispatch, "gate": gate,
            "combine": [{"tokens": 8192, "top_k": 2, "hidden": 2048, "n_proc": 263, "bytes_per_value": nb,
                         "ns_per_block": _stat(per_block * t["reduce_ns_per_byte"])}],
            "scheduler": {"tasks": 4096, "gap_ns": _stat(t["handoff_ns"]), "task_ns": _stat(task(128)),
                          "arrival_to_first_task_ns": _stat(t["handoff_ns"] + 1500.0),
                          # on two GPUs the peer's counts hold the first task back: printed, not fitted
                          "idle": {"config": {"tokens": 1536}, "first_task_ns": 40000.0, "assign_ns_per_task": 200.0,
                                   "stop_ns": _stat(t["stop_ns"])},
                          "idle_one_gpu": {"config": {"tokens": 1536}, "first_task_ns": t["wake_ns"] + hw.subscriber_ns,
                                           "assign_ns_per_task": t["assign_ns"], "stop_ns": _stat(t["stop_ns"])}},
            "pingpong": [{"bytes": 0, "iters": 200, "round_trip_ns": 2 * t["nvlink_latency_ns"], "failed": False}],
            "failed": {}}


def _write(tmp_path, raw):
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(raw))
    return src


def test_fit_recovers_the_figures_the_microbenchmarks_were_made_from(tmp_path):
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(synthetic()))
    out, fits = calibrate.calibrate(src, out=tmp_path / "calibrated-h200.json")
    assert list(fits) == ["float32"]
    fit = fits["float32"]
    for name, want in TRUE.items():
        assert fit.values[name] == pytest.approx(want, rel=1e-6, abs=1e-6), name
    assert all(abs(y - m) <= 1e-6 * max(abs(m), 1.0) for p, m, y in fit.residuals if "not fitted" not in p)
    hw = hardware.get(str(out))
    assert hw.name.startswith("h200-sxm+calibrated") and hw.processors == 263
    # the arrival-to-first-task delay waits for a processor too: printed, the preset's subscriber kept
    assert "subscriber_ns" not in fit.values and hw.subscriber_ns == hardware.get("h200-sxm").subscriber_ns
    assert any(p.startswith("a tile's arrival to its first task") for p, _, _ in fit.residuals)
    assert "calibration-h200.json" in hw.source("matrix_efficiency")
    cfg = presets.get("tiny").replace(ranks=1)
    assert sim.simulate(cfg, hardware=hw).metrics["latency_ns"] > sim.simulate(cfg, "h200-sxm").metrics["latency_ns"]


def test_tasks_whose_rows_are_computed_in_groups_are_fitted_with_the_group(tmp_path):
    """The float32 SIMT GEMM's shape: 96 rows cost as 128 (each thread 4 rows of every 64), and a
    tile of 64 rows or fewer its active warps' 16 rows each: 20 as 32, 40 as 48."""
    want = dict(TRUE, gemm_row_group=64.0)
    _, fits = calibrate.calibrate(_write(tmp_path, synthetic(t=want)), out=tmp_path / "calibrated-h200.json")
    for name in ("gemm_row_group", "matrix_efficiency", "gemm_fixed_ns", "weight_load_ns_per_byte"):
        assert fits["float32"].values[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), name
    # and the cost model charges a task its rows in whole groups
    hw = hardware.PRESETS["h200-sxm"].replace(**{k: want[k] for k in ("blocks_per_sm", "matrix_efficiency",
                                                                        "gemm_row_group")})
    row = 2.0 * 2048 * 64
    ns = costs.task_ns(hw, presets.get("flashmoe"), np.zeros(6, int), np.array([20, 32, 40, 48, 96, 128]) * row,
                       np.zeros(6), 0.0, row)
    assert ns[0] == pytest.approx(ns[1]) and ns[2] == pytest.approx(ns[3]) and ns[4] == pytest.approx(ns[5])
    assert ns[5] - ns[3] == pytest.approx(80 * row / costs.block_flops_per_ns(hw, "float32"))
    assert ns[3] - ns[1] == pytest.approx(16 * row / costs.block_flops_per_ns(hw, "float32"))
    with pytest.raises(ValueError, match="row_flops"):
        costs.task_ns(hw, presets.get("flashmoe"), np.array([0]), np.array([row]), np.zeros(1))


def test_a_file_from_before_the_small_scheduler_layer_stops_a_hand_off_after_the_last_task(tmp_path):
    raw = synthetic()
    del raw["scheduler"]["idle_one_gpu"]
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    v = fits["float32"].values
    assert (v["wake_ns"], v["assign_ns"], v["stop_ns"]) == (0.0, 0.0, TRUE["handoff_ns"])


def test_the_final_combine_at_several_sizes_fits_an_l2_and_an_hbm_rate(tmp_path):
    """Rows the L2 still holds (l2_knee_bytes of them) are combined at one rate, the rest at another."""
    raw = synthetic()
    hw = hardware.PRESETS["h200-sxm"].replace(reduce_knee_bytes=TRUE["l2_knee_bytes"], reduce_ns_per_byte=0.08,
                                              reduce_l2_ns_per_byte=0.05)
    raw["combine"] = []
    for tokens in (1024, 4096, 8192, 16384):
        cfg = presets.get("flashmoe").replace(ranks=1, tokens=tokens)
        raw["combine"].append({"tokens": tokens, "top_k": 2, "hidden": 2048, "n_proc": 263, "bytes_per_value": 4,
                               "ns_per_block": _stat(costs.reduce_ns(hw, cfg, 263))})
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    v = fits["float32"].values
    assert v["reduce_ns_per_byte"] == pytest.approx(0.08, rel=1e-6)
    assert v["reduce_l2_ns_per_byte"] == pytest.approx(0.05, rel=1e-6)
    assert (v["reduce_knee_bytes"], v["reduce_fixed_ns"]) == (TRUE["l2_knee_bytes"], 0.0)  # the copies' knee
    knee = TRUE["l2_knee_bytes"]
    small, large = (costs.reduce_ns_per_byte_at(hw, b) for b in (knee / 2, 100 * knee))
    assert small == pytest.approx(0.05) and 0.05 < large < 0.08


def test_the_scheduler_hands_out_a_burst_one_task_each_assign_ns():
    from sim.kernel import Scheduler

    sched = Scheduler([0.0] * 4, handoff=0.0, assign=100.0)
    assert [start for _, start, _ in sched.assign(1000.0, [10.0] * 4)] == [1000.0, 1100.0, 1200.0, 1300.0]
    assert [start for _, start, _ in sched.assign(5000.0, [10.0])] == [5000.0]  # its turn came long ago


def test_a_tiles_tasks_wait_wake_ns_and_the_final_combine_stop_ns():
    cfg = presets.get("flashmoe").replace(ranks=1, tokens=1024, precision="bfloat16", tile_n=128)
    base = hardware.PRESETS["h200-sxm"].replace(reduce_ns_per_byte=0.1)
    first, gap = {}, {}
    for name, hw in (("base", base), ("slow", base.replace(wake_ns=5000.0, stop_ns=9000.0))):
        tr = sim.simulate(cfg, hardware=hw).trace
        proc = tr["role"] == 0
        first[name] = tr["start"][proc & (tr["kind"] == 2)].min()
        combine = proc & (tr["kind"] == 4)
        final = combine & (tr["tile"] < 0)  # the final combine belongs to no tile
        gap[name] = tr["start"][final].min() - tr["end"][combine & ~final].max()
    assert first["slow"] - first["base"] == pytest.approx(5000.0)
    assert gap["slow"] == pytest.approx(9000.0)


def test_an_experts_tasks_wait_for_one_thread_to_queue_them():
    # bf16 queues an expert's tiles together: its GEMM0 tasks go out once one thread has written them
    cfg = presets.get("flashmoe").replace(ranks=1, tokens=1024, precision="bfloat16", tile_n=128)
    base = hardware.PRESETS["h200-sxm"].replace(reduce_ns_per_byte=0.1)
    slow = base.replace(enqueue_ns=2000.0, enqueue_source_ns=1000.0, enqueue_task_ns=50.0)
    first = {}
    for name, hw in (("base", base), ("slow", slow)):
        tr = sim.simulate(cfg, hardware=hw).trace
        proc = tr["role"] == 0
        first[name] = [tr["start"][proc & (tr["kind"] == kind)].min() for kind in (2, 3)]
    tasks = 2048 // 128  # every expert one tile (32 rows on average), GEMM0 in 16 column blocks
    assert first["slow"][0] - first["base"][0] == pytest.approx(2000.0 + 1000.0 + 50.0 * tasks)
    assert first["slow"][1] - first["base"][1] >= 2000.0 + 1000.0 + 50.0 * tasks  # and GEMM1's after its own


def test_each_processor_pays_for_its_own_rounds_of_the_final_combine():
    # tokens in rounds of processors x 4 warps: the processors of the last, partial round pay one
    # round more than the others, however few of its tokens they hold
    for tokens, procs in ((1792, 131), (5888, 131), (1024, 263), (524, 131), (7, 3)):
        got = costs.reduce_tokens(tokens, procs)
        whole, rest = divmod(tokens, procs * costs.REDUCE_WARPS)
        assert got.sum() >= tokens and set(got) <= {whole * 4, (whole + 1) * 4}
        assert np.count_nonzero(got == (whole + 1) * 4) == -(-rest // costs.REDUCE_WARPS)
        assert np.all(np.diff(got) <= 0)  # the first processors take the extra round
    cfg = presets.get("flashmoe").replace(ranks=1, tokens=1792, precision="bfloat16", tile_n=128,
                                          capacity_factor=None)  # every token's k rows come back
    hw = hardware.PRESETS["h200-sxm"].replace(reduce_ns_per_byte=0.1, reduce_fixed_ns=700.0)
    tr = sim.simulate(cfg, hardware=hw).trace
    procs = int(tr.meta["processors"])
    final = (tr["role"] == 0) & (tr["kind"] == 4) & (tr["tile"] < 0)
    lanes, took = tr["lane"][final], (tr["end"] - tr["start"])[final]
    assert sorted(lanes) == list(range(procs))
    np.testing.assert_allclose(took, costs.reduce_block_ns(hw, cfg, procs)[lanes])
    assert took.max() == pytest.approx(costs.reduce_ns(hw, cfg, procs)) and took.min() < took.max()


def test_a_file_from_before_the_sharing_points_holds_the_weight_loads_in_the_fixed_cost(tmp_path):
    raw = synthetic()
    raw["gemm"] = [{k: v for k, v in g.items() if k not in ("tiles_per_expert", "weight_bytes")}
                   for g in raw["gemm"] if g.get("tiles_per_expert") == 2]
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    fit = fits["float32"]
    assert fit.values["weight_load_ns_per_byte"] == 0.0 and "not measured" in fit.sources["weight_load_ns_per_byte"]
    at_two = TRUE["weight_load_ns_per_byte"] * 2048 * 64 * 4 / 2
    assert fit.values["gemm_fixed_ns"] == pytest.approx(TRUE["gemm_fixed_ns"] + at_two, rel=1e-6)


def test_fewer_tiles_per_expert_make_longer_tasks():
    """A weight slice one tile uses alone costs its task the slice's loads; shared, a share (at
    most processors / the tile's tasks of a kind share at once)."""
    hw = hardware.PRESETS["h200-sxm"].replace(weight_load_ns_per_byte=0.05)
    median = {}
    for experts, tiles in ((8, 16), (64, 2), (128, 1)):  # 8192 tokens x top 2, 128-row tiles, 1 GPU
        cfg = presets.get("flashmoe").replace(ranks=1, experts=experts, precision="bfloat16", tile_n=128)
        plan = reference.plan_of(cfg)
        alone = costs.weight_bytes_alone(cfg, plan, hw.processors, "expert")
        gemm = plan.task_kind != COMBINE
        sharing = min(tiles, hw.processors // (2048 // 128))
        assert np.allclose(alone[gemm], 2048 * 128 * 2 / sharing) and (alone[~gemm] == 0).all()
        d = costs.task_ns(hw, cfg, plan.task_kind, plan.task_flops.astype(float), plan.task_bytes.astype(float), alone)
        median[experts] = float(np.median(d[gemm]))
    assert median[8] < median[64] < median[128]


def test_a_measured_overlap_hides_a_short_tiles_multiply_under_its_weight_load():
    """Added (power 0 or 1) the multiply and the load sum; as a p-norm a task takes at least the
    longer of the two and less than their sum, and a task whose slice's load far outlasts its
    multiply takes nearly the load's time."""
    multiply, load = np.array([5000.0, 20000.0]), np.array([30000.0, 30000.0])
    for power in (0.0, 1.0):
        assert np.allclose(costs.overlapped(multiply, load, power), multiply + load)
    both = costs.overlapped(multiply, load, 2.0)
    assert np.allclose(both, np.hypot(multiply, load))
    assert (both >= np.maximum(multiply, load)).all() and (both < multiply + load).all()
    hw = hardware.PRESETS["h200-sxm"].replace(weight_load_ns_per_byte=0.5, gemm_fixed_ns=5000.0)
    cfg = presets.get("flashmoe").replace(ranks=1, experts=128, precision="bfloat16", tile_n=128)
    plan = reference.plan_of(cfg)
    gemm = plan.task_kind != COMBINE
    alone = costs.weight_bytes_alone(cfg, plan, hw.processors, "expert")
    args = (cfg, plan.task_kind, plan.task_flops.astype(float), plan.task_bytes.astype(float), alone)
    added = costs.task_ns(hw, *args)[gemm]
    normed = costs.task_ns(hw.replace(gemm_overlap_power=4.0), *args)[gemm]
    load = hw.gemm_fixed_ns + hw.weight_load_ns_per_byte * alone[gemm]
    assert (normed < added).all() and np.allclose(normed, load, rtol=0.02)


def test_an_experts_tiles_share_its_weight_slices_as_they_are_queued():
    """On 2 GPUs an expert's 4 tiles come 2 from each source. Queued together (the "expert"
    policy), a task's slice is shared by all 4; queued as each lands ("tile"), by its own source's
    2, the peer's running after the slice has left the L2. On 1 GPU the expert's 2 tiles share it
    either way."""
    hw = hardware.PRESETS["h200-sxm"]
    for ranks, queue, tiles in ((1, "expert", 2), (1, "tile", 2), (2, "expert", 4), (2, "tile", 2)):
        cfg = presets.get("flashmoe").replace(ranks=ranks, precision="bfloat16", tile_n=128)
        plan = reference.plan_of(cfg)
        gemm = plan.task_kind != COMBINE
        assert np.allclose(costs.weight_bytes_alone(cfg, plan, hw.processors, queue)[gemm], 2048 * 128 * 2 / tiles)


def test_local_dispatch_shares_wait_for_the_nvlink_ones_beside_them():
    """A GPU's local store share takes its own time alone, and an NVLink share's while any goes
    over NVLink at once from a block on the same SM; with one block per SM, its own time still."""
    hw = hardware.PRESETS["h200-sxm"].replace(dispatch_store_fixed_ns=1000.0, dispatch_store_ns_per_byte=0.12,
                                            put_nvlink_ns_per_byte=0.1, blocks_per_sm=2)
    nbytes, inflight = 1 << 18, 256 * (1 << 18)
    alone = costs.dispatch_ns(hw, nbytes, LOCAL, "store", inflight, {LOCAL: 256})
    assert alone == pytest.approx(1000.0 + 0.12 * nbytes + hw.task_overhead_ns)
    over = {LOCAL: 128, NVLINK: 128}
    beside = costs.dispatch_ns(hw, nbytes, LOCAL, "store", inflight, over)
    assert beside == pytest.approx(costs.dispatch_ns(hw, nbytes, NVLINK, "store", inflight, over)) and beside > alone
    one_per_sm = hw.replace(blocks_per_sm=1)
    assert costs.dispatch_ns(one_per_sm, nbytes, LOCAL, "store", inflight, over) == pytest.approx(alone)


def test_a_share_stored_into_the_peer_ends_with_a_round_trip_a_fence():
    """Its bytes at a put's rate (or the port's share), then its fence's wait for the peer's
    acknowledgement, two NVLink latencies; an earlier kernel fenced a chunk of one share twice."""
    hw = hardware.PRESETS["h200-sxm"].replace(put_nvlink_ns_per_byte=0.1, nvlink_gbps=370.0, nvlink_latency_ns=900.0)
    nbytes, over = 1 << 16, {LOCAL: 64, NVLINK: 64}
    got = costs.dispatch_ns(hw, nbytes, NVLINK, "store", 128 * nbytes, over)
    assert got == pytest.approx(nbytes * max(0.1, 64 / 370.0) + 2 * 900.0 + hw.task_overhead_ns)
    assert costs.nvlink_store_rate(hw, parts=1)[1] == costs.nvlink_store_rate(hw, parts=4, share_fences=2)[1]
    assert costs.nvlink_store_rate(hw, parts=1, share_fences=2)[1] == pytest.approx(2 * 2 * 900.0)


@pytest.mark.parametrize("warpgroups", [1, 2])
def test_a_blocks_copy_loop_pays_for_whole_rounds_of_rows_and_whole_passes_of_a_row(warpgroups):
    """copy_rows: each warp takes COPY_ROW_GROUP rows a round, each lane COPY_ROW_BATCH 16-byte
    vectors of a row a pass: one row costs a whole round, a row a byte past a pass another pass;
    whole rounds of whole passes cost what they move."""
    hw = hardware.PRESETS["h200-sxm"].replace(warpgroups_per_block=warpgroups)
    round_rows = costs.COPY_ROW_GROUP * 4 * warpgroups
    pass_bytes = 32 * costs.COPY_ROW_BATCH * 16
    row = 4 * pass_bytes
    assert costs.copied_bytes(hw, row, row) == round_rows * row
    assert costs.copied_bytes(hw, round_rows * row, row) == round_rows * row
    assert costs.copied_bytes(hw, (round_rows + 1) * row, row) == 2 * round_rows * row
    assert costs.copied_bytes(hw, row + 16, row + 16) == round_rows * (row + pass_bytes)
    assert costs.copied_bytes(hw, 0.0, row) == 0.0


@pytest.mark.parametrize("blocks", [1, 16, 64, 264])
def test_a_put_over_nvlink_goes_at_its_own_rate_or_the_ports_share(blocks):
    """The local puts' slowdown with the bytes in flight does not reach puts into the peer: a
    block's own rate until the port's share is slower."""
    hw = hardware.PRESETS["h200-sxm"].replace(put_nvlink_ns_per_byte=0.1, nvlink_gbps=370.0,
                                            put_local_extra_ns_per_byte=0.5, put_local_half_bytes=1 << 20,
                                            l2_knee_bytes=1 << 20)
    size = 1 << 20
    want = size * max(0.1, blocks / 370.0)
    assert costs.put_ns(hw, NVLINK, size, blocks * size, blocks) == pytest.approx(want)
    assert costs.put_ns(hw, LOCAL, size, blocks * size, blocks) > size * hw.put_local_ns_per_byte or blocks == 1


def test_a_file_from_before_the_store_dispatch_keeps_the_base_figures(tmp_path):
    raw = synthetic()
    raw["dispatch"] = [d for d in raw["dispatch"] if "path" not in d]
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    for name in ("dispatch_store_fixed_ns", "dispatch_store_ns_per_byte"):
        assert fits["float32"].values[name] == 0.0 and "no store-path dispatch" in fits["float32"].sources[name]


def test_the_local_shares_of_a_two_gpu_dispatch_are_checked_not_fitted(tmp_path):
    """Beside NVLink shares a GPU's local shares take as long as those (the port holds its stores
    back): the fit takes the one-GPU shares, and the model meets the two-GPU ones as checks."""
    raw = synthetic()
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    fit = fits["float32"]
    checks = {p: (m, y) for p, m, y in fit.residuals if p.startswith("dispatch (store) of 64 rows to")}
    two = {p: v for p, v in checks.items() if "2 GPU(s)" in p}
    assert len(two) == 2 and all("not fitted" in p for p in two)
    (m_self, y_self), = [v for p, v in two.items() if "to self" in p]
    alone = TRUE["dispatch_store_fixed_ns"] + 64 * 2048 * 4 * TRUE["dispatch_store_ns_per_byte"]
    assert m_self > 1.5 * alone and y_self == pytest.approx(m_self, rel=1e-6)
    raw["dispatch"] = [d for d in raw["dispatch"] if d.get("world") != 1]
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    assert fits["float32"].values["dispatch_store_ns_per_byte"] == 0.0
    assert "on one GPU alone" in fits["float32"].sources["dispatch_store_ns_per_byte"]


def test_a_one_gpu_file_keeps_the_base_presets_nvlink_figures(tmp_path):
    """An H100 lent alone measures no peer: everything else is fitted, the NVLink figures stay
    the base preset's and say so; a two-GPU file without its NVLink puts is still refused."""
    raw = synthetic("NVIDIA H100 80GB HBM3")
    raw.update(world=1, put=[p for p in raw["put"] if p["peer"] == "self"], pingpong=[])
    src = tmp_path / "calibration-h100.json"
    src.write_text(json.dumps(raw))
    _, fits = calibrate.calibrate(src, out=tmp_path / "calibrated-h100.json")
    fit, base = fits["float32"], hardware.PRESETS["h100-sxm"]
    for name in ("put_nvlink_ns_per_byte", "nvlink_gbps"):
        assert fit.values[name] == getattr(base, name) and "not measured (one GPU" in fit.sources[name]
    assert "nvlink_latency_ns" not in fit.values
    assert fit.values["matrix_efficiency"] == pytest.approx(TRUE["matrix_efficiency"], rel=1e-6)
    raw["world"] = 2
    with pytest.raises(calibrate.CalibrationError, match="'put'"):
        calibrate.fit(raw, "h100-sxm", "x")


def test_cli_prints_the_fit_and_its_residuals(tmp_path, capsys):
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(synthetic()))
    out = tmp_path / "calibrated-h100.json"
    assert main(["calibrate", "--calibration", str(src), "--base", "h100-sxm", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "matrix_efficiency" in text and "residual" in text and f"wrote {out}" in text
    assert json.loads(out.read_text())["base"] == "h100-sxm"


@pytest.mark.parametrize("change, field", [
    (lambda d: d["meta"].update(gpu="NVIDIA A100"), "meta.gpu"),
    (lambda d: d.pop("gemm"), "gemm"),
    (lambda d: d.update(gate=d["gate"][:2]), "gate"),
    (lambda d: d["occupancy"].update(megakernel_grid=0), "occupancy"),
])
def test_a_file_lacking_what_a_fit_needs_names_the_field(tmp_path, capsys, change, field):
    raw = synthetic()
    change(raw)
    assert_calibrate_refuses(raw, field, tmp_path, capsys)


def assert_calibrate_refuses(raw: dict, field: str, tmp_path, capsys) -> None:
    """`moelab calibrate` on the calibration file `raw` exits 2, naming `field`."""
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(raw))
    assert main(["calibrate", "--calibration", str(src), "--out", str(tmp_path / "x.json")]) == 2
    assert f"calibration field '{field}'" in capsys.readouterr().err


def test_a_missing_file_is_an_error(tmp_path, capsys):
    assert main(["calibrate", "--calibration", str(tmp_path / "nope.json"), "--out", str(tmp_path / "c.json")]) == 2
    assert "nope.json': does not exist" in capsys.readouterr().err


def test_a_block_of_two_warpgroups_runs_its_gate_on_both(tmp_path):
    """The bf16 128 x 256 build: one block per SM, each two 128-thread units with gate items of
    their own. Its gate points, timed on twice the blocks' units, fit back to the same figures."""
    raw = synthetic(t=TRUE_BF16, dtype="bfloat16")
    raw["tile"]["BLOCK_WARPGROUPS"] = 2
    two = hardware.PRESETS["h200-sxm"].replace(**{k: v for k, v in TRUE_BF16.items() if k != "task_overhead_ns"},
                                               warpgroups_per_block=2)
    for g in raw["gate"]:
        cfg = presets.get("flashmoe").replace(tokens=g["tokens"], experts=g["experts"], top_k=g["top_k"],
                                              precision="bfloat16")
        g["ns"] = costs.gate_kernel_ns(two, cfg, g.get("select", "passes"))
    fit = calibrate.fit(raw, "h200-sxm", "synthetic", dtype="bfloat16")
    assert fit.values["warpgroups_per_block"] == 2
    for name in ("gate_item_ns_per_h", "gate_slot_ns", "gate_fixed_ns", "gate_split_ns", "gate_select_smem_ns",
                 "gate_select_global_ns", "gate_list_ns", "gate_weigh_ns", "gate_logit_ns"):
        assert fit.values[name] == pytest.approx(TRUE_BF16[name], rel=1e-6), name
    # 8192 tokens are 256 items: one a unit on 132 blocks of two units, two a unit on 132 of one
    one_per_sm = two.replace(blocks_per_sm=1)
    assert costs.gate_work(8192, 2048, 64, costs.gate_units(one_per_sm)) == 2048
    assert costs.gate_work(8192, 2048, 64, costs.blocks(one_per_sm)) == 4096
    cfg = presets.get("flashmoe").replace(precision="bfloat16")
    assert costs.gate_ns(two, cfg) < costs.gate_ns(two.replace(warpgroups_per_block=1), cfg)


def test_the_megakernels_own_gates_give_what_its_gate_event_adds(tmp_path):
    """The in-layer layers' gate phase (one GPU, other widths and k) is the gate's code plus a fixed
    time of the megakernel's: fitted beside the microbenchmark's points, which stay the code alone.
    Without those layers the figure stays 0 and says why."""
    raw = synthetic()
    fitted = calibrate.fit(raw, "h200-sxm", "synthetic")
    assert fitted.values["gate_layer_ns"] == 0.0 and "recorded the megakernel's gate" in fitted.sources["gate_layer_ns"]
    hw = hardware.PRESETS["h200-sxm"].replace(**{k: v for k, v in TRUE.items() if k != "task_overhead_ns"},
                                              gate_layer_ns=7000.0)
    layers = []
    for tokens, hidden, top_k in ((768, 2048, 2), (4608, 768, 2), (7936, 1024, 2), (5120, 4096, 2), (1792, 2048, 8),
                                  (6912, 2048, 1)):
        cfg = presets.get("flashmoe").replace(ranks=1, tokens=tokens, hidden=hidden, top_k=top_k)
        layers.append({"tokens": tokens, "experts": 64, "world": 1, "hidden": hidden, "ffn": 2048, "top_k": top_k,
                       "gate_ns": _stat(costs.gate_ns(hw, cfg)), "select": "lists"})
    layers.append({"tokens": 512, "experts": 64, "world": 2, "hidden": 2048, "ffn": 2048, "top_k": 2,
                   "gate_ns": _stat(1e9), "select": "lists"})  # two GPUs: its event waits for the peer's start
    fitted = gate.fit_gate({**raw, "in_layer": layers}, costs.gate_units(hw), 1, "synthetic")
    for name in ("gate_layer_ns", "gate_item_ns_per_h", "gate_logit_ns", "gate_list_ns"):
        assert fitted.values[name] == pytest.approx(getattr(hw, name), rel=1e-6), name
    assert sum("in layer" in p for p, _, _ in fitted.residuals) == 6
    cfg = presets.get("flashmoe")
    assert costs.gate_ns(hw, cfg) - costs.gate_kernel_ns(hw, cfg) == 7000.0


def test_the_selection_is_fitted_only_where_the_gate_points_vary_top_k(tmp_path):
    """Points of one top_k cannot tell the selection's passes from the other costs that grow with E:
    its figures stay 0 and say why, the rest are fitted as before."""
    raw = synthetic()
    one_k = [g for g in raw["gate"] if g["top_k"] == 2 or g.get("select") == "lists"]
    assert len(one_k) < len(raw["gate"])
    fitted = calibrate.fit({**raw, "gate": one_k}, "h200-sxm", "synthetic")
    for name in ("gate_select_smem_ns", "gate_select_global_ns"):
        assert fitted.values[name] == 0.0 and "varies top_k" in fitted.sources[name]
    fitted = calibrate.fit(raw, "h200-sxm", "synthetic")
    assert fitted.values["gate_select_global_ns"] == pytest.approx(TRUE["gate_select_global_ns"], rel=1e-6)


def test_a_top_8_gate_reads_its_logits_eight_times_from_global_memory_past_64_experts():
    hw = hardware.PRESETS["h100-sxm"].replace(blocks_per_sm=1, warpgroups_per_block=2, gate_select_smem_ns=10.0,
                                              gate_select_global_ns=300.0)
    units = costs.gate_units(hw)
    assert costs.gate_select_reads(4096, 8, 128, units) == (0, 8 * 32)  # one item a unit, 32 experts a lane
    assert costs.gate_select_reads(8192, 2, 64, units) == (2 * 16, 0)
    assert costs.gate_select_reads(16384, 2, 64, units) == (2 * 2 * 16, 0)  # 512 items on 264 units
    cfg = presets.get("flashmoe").replace(tokens=4096, experts=128, precision="bfloat16")
    assert costs.gate_ns(hw, cfg.replace(top_k=8), "passes") - costs.gate_ns(hw, cfg, "passes") == pytest.approx(
        6 * 32 * 300.0)


def test_the_lists_selection_reads_each_logit_once_a_round_and_compares_it_at_each_place():
    hw = hardware.PRESETS["h100-sxm"].replace(blocks_per_sm=1, warpgroups_per_block=2, gate_select_smem_ns=10.0,
                                              gate_select_global_ns=300.0, gate_list_ns=500.0)
    units = costs.gate_units(hw)
    assert [costs.select_list(k) for k in (1, 2, 3, 4, 5, 8, 9, 16)] == [2, 2, 4, 4, 8, 8, 8, 8]
    assert costs.gate_list_steps(4096, 8, 128, units) == 32 * 8  # one item a unit, one round over 32 experts
    assert costs.gate_list_steps(4096, 12, 128, units) == 2 * 32 * 8  # two rounds of 8 places
    assert costs.gate_list_steps(16384, 2, 64, units) == 2 * 16 * 2  # 512 items on 264 units, lists of 2
    cfg = presets.get("flashmoe").replace(tokens=4096, experts=128, precision="bfloat16")
    # the passes selection's figures do not enter it: top-8 costs its list's longer compares alone
    assert costs.gate_ns(hw, cfg.replace(top_k=8)) - costs.gate_ns(hw, cfg) == pytest.approx(32 * (8 - 2) * 500.0)


def test_a_sender_stores_into_the_peer_at_its_measured_rate_or_its_port_share(tmp_path):
    raw = synthetic()
    fitted = calibrate.fit(raw, "h200-sxm", "synthetic")
    assert fitted.values["copy_nvlink_ns_per_byte"] == pytest.approx(TRUE["copy_nvlink_ns_per_byte"])
    assert all(abs(m - p) <= 1e-6 * m for point, m, p in fitted.residuals if "into the peer" in point)
    without = calibrate.fit({k: v for k, v in raw.items() if k != "copy_nvlink"}, "h200-sxm", "synthetic")
    assert without.values["copy_nvlink_ns_per_byte"] == 0.0 and "not measured" in without.sources[
        "copy_nvlink_ns_per_byte"]
    hw = hardware.PRESETS["h200-sxm"].replace(copy_ns_per_byte=0.03, nvlink_gbps=380.0, nvlink_latency_ns=0.0)
    mib = float(1 << 20)
    assert costs.nvlink_share_ns(hw, mib, mib, {NVLINK: 16}) == pytest.approx(mib * 16 / 380.0)  # the port's share
    slow = hw.replace(copy_nvlink_ns_per_byte=0.0625)  # 16 GB/s a block, under its share (23.75)
    assert costs.nvlink_share_ns(slow, mib, mib, {NVLINK: 16}) == pytest.approx(mib * 0.0625)
