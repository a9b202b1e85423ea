"""The dispatch's, the final combine's and the tile GEMM's figures fitted on the megakernel's own
layers (the in_layer section: token counts no measured run uses): the fit recovers known
figures, prefers them to the microbenchmarks', leaves two-GPU layers out, and the model charges
every stored share the first round's mean share; the microbenchmark reads a traced layer's GEMM
tasks by tile height."""

import numpy as np
import pytest
from test_sim_calibrate import TRUE, _write, synthetic

import reference
from gpu import microbench
from reference import presets
from reference.plan import COMBINE, LOCAL, NVLINK
from sim import calibrate, costs, hardware
from sim.calibration import combine
from sim.trace import KIND, ROLE, TraceBuilder

KNEES = calibrate.KNEES
FIGURES = dict(dispatch_store_fixed_ns=3000.0, dispatch_store_l2_ns_per_byte=0.03, dispatch_store_ns_per_byte=0.16,
               dispatch_store_knee_bytes=float(KNEES[30]), reduce_fixed_ns=1500.0, reduce_l2_ns_per_byte=0.06,
               reduce_ns_per_byte=0.1, reduce_knee_bytes=float(KNEES[36]), deal_first_ns=2700.0, deal_share_ns=1800.0,
               deal_count_ns=380.0, signal_seen_ns=2500.0, signal_seen_ns_per_entry=15.0)
TOKENS = (768, 1280, 1536, 2560, 3072, 6144, 12288)
GEMM = dict(matrix_efficiency=0.8, gemm_fixed_ns=90000.0, weight_load_ns_per_byte=0.02, gemm_row_group=64.0)
TILE_COMBINE = dict(tile_combine_fixed_ns=2000.0, tile_combine_l2_ns_per_byte=0.03, tile_combine_ns_per_byte=0.09,
                    tile_combine_knee_bytes=float(KNEES[40]))


def in_layer(hw, world=1, tokens=TOKENS, n_proc=263):
    """The in_layer section of layers whose times follow `hw` (shares of a 64-expert layer split 4 ways)."""
    out = []
    for t in tokens:
        cfg = presets.get("flashmoe").replace(ranks=1, tokens=t)
        shares = 256
        inflight = t * cfg.top_k * cfg.hidden * 4
        out.append({"tokens": t, "world": world, "n_proc": n_proc, "top_k": 2, "hidden": 2048, "bytes_per_value": 4,
                    "inflight_bytes": inflight, "first_round_shares": shares,
                    "dispatch_ns": _stat(costs.store_dispatch_ns(hw, inflight / shares, t * cfg.hidden * 4)),
                    "combine_tokens_per_block": int(np.ceil(t / (n_proc * 4)) * 4),
                    "final_combine_ns": _stat(costs.reduce_ns(hw, cfg, n_proc)),
                    **(tile_combine(hw, t) if hw.tile_combine_ns_per_byte else {}),
                    **({"deal_walk": deal_walk(hw, t)} if hw.deal_count_ns else {}),
                    **({"signal_seen": {"watched": t // 8, "ns": _stat(hw.signal_seen_ns + t // 8 *
                                                                       hw.signal_seen_ns_per_entry)}}
                       if hw.signal_seen_ns_per_entry else {}),
                    "gemm": [gemm_task(hw, t, kind, rows, n) for kind in ("gemm0", "gemm1")
                             for rows, n in ((t // 32, 1), (t // 32 - 7, 1), (128, 3), (t // 64, 2))]})
    return out


def tile_combine(hw, tokens):
    """A layer's per-tile combines (its tiles' rows: the capacity, at most 128), timed by `hw`'s model."""
    nbytes = min(tokens // 32, 128) * 2048 * 4
    per_byte = costs.tile_combine_ns_per_byte_at(hw, costs.returned_bytes(tokens, 2, 2048, 4))
    return {"tile_combine_bytes": _stat(nbytes), "tile_combine_ns": _stat(hw.tile_combine_fixed_ns + nbytes * per_byte)}


def deal_walk(hw, tokens):
    """A layer's walks to its first and next shares (the microbenchmark's medians by counts read),
    timed by `hw`."""
    first, later = list(range(1 + tokens % 3, 64, 5)), [131 // (1 + tokens % 4)]
    return {"first": {"loads": first, "ns": [hw.deal_first_ns + c * hw.deal_count_ns for c in first],
                      "n": [2] * len(first)},
            "next": {"loads": later, "ns": [hw.deal_share_ns + c * hw.deal_count_ns for c in later], "n": [40]}}


def gemm_task(hw, tokens, kind, rows, n, depth=2048):
    """A layer's GEMM tasks of `rows`-row tiles, `n` tiles per expert, `depth` deep, timed by `hw`'s model."""
    rows = min(rows, 128)
    flops = 2 * rows * depth * 64
    group = hw.gemm_row_group or 1
    computed = float(costs.grouped_rows(rows, group))
    load = hw.weight_stream_ns_per_byte * depth * 64 * 4 + hw.weight_load_ns_per_byte * depth * 64 * 4 / n
    ns = hw.gemm_fixed_ns + float(costs.overlapped(2 * computed * depth * 64 / costs.block_flops_per_ns(hw, "float32"),
                                                   load, hw.gemm_overlap_power))
    return {"tokens": tokens, "task": kind, "blocks": 264, "rows": rows, "k": depth, "n": 64, "flops": flops,
            "tiles_per_expert": n, "weight_bytes": depth * 64 * 4, "ns_per_task": {**_stat(ns), "n": 16}}


def _stat(v):
    return {"median": v, "p10": v, "p90": v, "min": v, "max": v, "n": 1}


def _fit(tmp_path, raw):
    _, fits = calibrate.calibrate(_write(tmp_path, raw), out=tmp_path / "calibrated-h200.json")
    return fits["float32"]


def test_the_in_layer_fit_recovers_the_dispatch_and_combine_figures(tmp_path):
    raw = synthetic()
    raw["in_layer"] = in_layer(hardware.PRESETS["h200-sxm"].replace(**FIGURES))
    fit = _fit(tmp_path, raw)
    for name, want in FIGURES.items():
        assert fit.values[name] == pytest.approx(want, rel=1e-6), name
    assert "inside the megakernel" in fit.sources["dispatch_store_ns_per_byte"]
    assert "inside the megakernel" in fit.sources["reduce_fixed_ns"]
    # the microbenchmark's shares (another straight line) are checked against the fit, not fitted
    assert any("not fitted" in point for point, *_ in fit.residuals if point.startswith("dispatch (store)"))


def test_layers_at_another_k_are_predicted_not_fitted(tmp_path):
    """The dispatch, final combine, walk and signal fits keep to the k most layers have: a layer at
    another k (times far off the model here) moves no figure and is listed as a check; the GEMM
    fit takes its tasks (a task's time does not depend on k)."""
    hw = hardware.PRESETS["h200-sxm"].replace(**FIGURES)
    raw = synthetic()
    raw["in_layer"] = in_layer(hw)
    other = in_layer(hw, tokens=(1792,))[0]
    other.update(top_k=8, dispatch_ns=_stat(4 * other["dispatch_ns"]["median"]),
                 final_combine_ns=_stat(3 * other["final_combine_ns"]["median"]),
                 signal_seen={"watched": 9, "ns": _stat(1e6)})
    raw["in_layer"].append(other)
    fit = _fit(tmp_path, raw)
    for name, want in FIGURES.items():
        assert fit.values[name] == pytest.approx(want, rel=1e-6), name
    checks = {p: (m, y) for p, m, y in fit.residuals if "dispatch share, T=1792" in p or "final combine, T=1792" in p}
    assert len(checks) == 2 and all("not fitted" in p for p in checks)
    share = costs.store_dispatch_ns(hw, other["inflight_bytes"] / other["first_round_shares"], 1792 * 2048 * 4)
    final = hw.reduce_fixed_ns + costs.reduce_bytes(other["combine_tokens_per_block"], 8, 2048, 4) * \
        costs.reduce_ns_per_byte_at(hw, costs.reduce_bytes(1792, 8, 2048, 4))
    assert sorted(checks.values()) == [(other["dispatch_ns"]["median"], pytest.approx(share, rel=1e-9)),
                                       (other["final_combine_ns"]["median"], pytest.approx(final, rel=1e-9))]


def test_the_in_layer_tasks_fit_the_tile_gemm_in_place_of_the_microbenchmark(tmp_path):
    raw = synthetic()  # its microbenchmark follows TRUE: a straight line, no row group
    hw = hardware.PRESETS["h200-sxm"].replace(blocks_per_sm=2, **FIGURES, **GEMM)
    raw["in_layer"] = in_layer(hw)
    fit = _fit(tmp_path, raw)
    for name, want in GEMM.items():
        assert fit.values[name] == pytest.approx(want, rel=1e-6), name
    assert fit.values["gemm_overlap_power"] == 0.0 and "none (added" in fit.sources["gemm_overlap_power"]
    assert "the megakernel's own tasks" in fit.sources["matrix_efficiency"]
    assert any("not fitted" in point for point, *_ in fit.residuals if point.startswith("gemm0 128 rows"))


@pytest.mark.parametrize("power", [2.0, 3.0])
def test_tasks_whose_multiply_hides_under_their_weight_load_fit_its_p_norm(tmp_path, power):
    """Layers whose tasks take the p-norm of multiply and load: the fit finds the power among its
    candidates, and the fixed cost and per-byte figure it was made with."""
    raw = synthetic()
    made = dict(GEMM, weight_load_ns_per_byte=0.2, gemm_overlap_power=power)
    raw["in_layer"] = in_layer(hardware.PRESETS["h200-sxm"].replace(blocks_per_sm=2, **FIGURES, **made))
    fit = _fit(tmp_path, raw)
    assert fit.values["gemm_overlap_power"] == power
    for name in ("gemm_fixed_ns", "weight_load_ns_per_byte", "matrix_efficiency", "gemm_row_group"):
        assert fit.values[name] == pytest.approx(made[name], rel=1e-3), name
    assert "p-norm" in fit.sources["gemm_overlap_power"]


@pytest.mark.parametrize("power", [0.0, 3.0])
def test_tasks_of_several_depths_fit_the_slices_stream_apart_from_the_fixed_time(tmp_path, power):
    """Layers whose GEMMs are 1024 to 7168 deep: every task streams its whole weight slice, so its
    time grows with the depth whatever its rows; the fit finds that stream, and the fixed time it
    was made with, where tasks of one depth could not tell them apart."""
    raw = synthetic()
    made = dict(GEMM, gemm_fixed_ns=6000.0, weight_stream_ns_per_byte=0.05, gemm_overlap_power=power)
    hw = hardware.PRESETS["h200-sxm"].replace(blocks_per_sm=2, **FIGURES, **made)
    layers = in_layer(hw)
    for c, depth in zip(layers, (1024, 4096, 7168)):  # three of the layers at other depths
        c["gemm"] = [gemm_task(hw, c["tokens"], g["task"], g["rows"], g["tiles_per_expert"], depth) for g in c["gemm"]]
    raw["in_layer"] = layers
    fit = _fit(tmp_path, raw)
    assert fit.values["gemm_overlap_power"] == power
    for name in ("gemm_fixed_ns", "weight_stream_ns_per_byte", "weight_load_ns_per_byte", "matrix_efficiency"):
        assert fit.values[name] == pytest.approx(made[name], rel=2e-3 if power else 1e-6), name
    assert "depth 1024, 2048, 4096, 7168" in fit.sources["weight_stream_ns_per_byte"]
    # one depth only: the stream is not measured, and the fixed time holds it
    raw["in_layer"] = in_layer(hw)
    one = _fit(tmp_path, raw)
    assert one.values["weight_stream_ns_per_byte"] == 0.0
    assert "not measured" in one.sources["weight_stream_ns_per_byte"]
    assert one.values["gemm_fixed_ns"] > made["gemm_fixed_ns"] * 1.5


def test_a_traced_layers_gemm_tasks_are_grouped_by_tile_height_and_sharing():
    """Tile rows from the dispatch shares' bytes, tiles per expert from the tiles they went to."""
    cfg = presets.get("flashmoe").replace(ranks=1, tokens=2048)
    row = cfg.hidden * 4
    tb = TraceBuilder()
    # tiles numbered within their expert, as traced() numbers them: expert 3's tiles 0 (2 shares:
    # 100 rows) and 1 (1 share: 20 rows); expert 5's tile 0 (64 rows)
    for lane, (tile, expert, rows) in enumerate(((0, 3, 60), (0, 3, 40), (1, 3, 20), (0, 5, 64))):
        tb.add(0, 0, lane, "processor", "dispatch", 0.0, 5.0, expert=expert, tile=tile, peer=0, nbytes=rows * row)
    for lane, (kind, tile, expert, ns) in enumerate((("gemm0", 0, 3, 100.0), ("gemm0", 0, 3, 120.0),
                                                     ("gemm1", 1, 3, 50.0), ("gemm0", 0, 5, 70.0))):
        tb.add(0, 0, lane, "processor", kind, 10.0, 10.0 + ns, expert=expert, tile=tile)
    tr = tb.build()
    proc = tr["role"] == ROLE["processor"]
    disp = proc & (tr["kind"] == KIND["dispatch"])
    bench = type("B", (), {"elem_bytes": 4})()
    got = {(g["task"], g["rows"], g["tiles_per_expert"]): (g["ns_per_task"]["median"], g["ns_per_task"]["n"])
           for g in microbench.layer_gemm_tasks(bench, cfg, tr, proc, disp, 263)}
    assert got == {("gemm0", 100, 2): (110.0, 2), ("gemm1", 20, 2): (50.0, 1), ("gemm0", 64, 1): (70.0, 1)}


def test_a_traced_layers_walks_are_read_by_the_counts_its_deal_passed():
    """One GPU deals every expert in turn: a block's first share after the counts of experts 0 ..
    its own (from its gate's end), each next after those from its share before's expert on."""
    tb = TraceBuilder()
    for lane in (0, 1):
        tb.add(0, 0, lane, "processor", "gate", 0.0, 100.0)
    # lane 0: experts 2 (walk 3 counts, 1300 ns), 2 again (0, 500), 6 (4, 1700); lane 1: expert 0 (1, 700)
    for lane, expert, start, end in ((0, 2, 1400.0, 2000.0), (0, 2, 2500.0, 3000.0), (0, 6, 4700.0, 5000.0),
                                     (1, 0, 800.0, 900.0)):
        tb.add(0, 0, lane, "processor", "dispatch", start, end, expert=expert, tile=0, peer=0, nbytes=64)
    tr = tb.build()
    proc = tr["role"] == ROLE["processor"]
    got = microbench.deal_walk(tr, proc, proc & (tr["kind"] == KIND["dispatch"]))
    assert got == {"first": {"loads": [1, 3], "ns": [700.0, 1300.0], "n": [1, 1]},
                   "next": {"loads": [0, 4], "ns": [500.0, 1700.0], "n": [1, 1]}}


def test_a_traced_layers_tiles_are_seen_after_their_last_share():
    """A tile's first signal is its landing (a later one its return): the delay from its last share."""
    cfg = presets.get("flashmoe").replace(ranks=1, tokens=768)
    tb = TraceBuilder()
    for lane, (expert, tile, end) in enumerate(((3, 0, 100.0), (3, 0, 140.0), (5, 1, 90.0))):
        tb.add(0, 0, lane, "processor", "dispatch", 0.0, end, expert=expert, tile=tile, peer=0, nbytes=64)
    for expert, tile, at in ((3, 0, 150.0), (5, 1, 120.0), (3, 0, 900.0)):  # the last: expert 3's return
        tb.add(0, 0, 0, "subscriber", "signal", at, at, expert=expert, tile=tile, peer=0)
    tr = tb.build()
    disp = (tr["role"] == ROLE["processor"]) & (tr["kind"] == KIND["dispatch"])
    got = microbench.signal_seen(cfg, tr, disp)
    assert got["ns"]["median"] == 20.0 and got["ns"]["n"] == 2 and (got["ns"]["min"], got["ns"]["max"]) == (10.0, 30.0)
    assert got["watched"] == costs.watched_entries(cfg, reference.plan_of(cfg), 0) == 128


def test_walks_timed_together_give_one_turnaround(tmp_path):
    """A file from before first and next shares were told apart: one turnaround for both."""
    raw = synthetic()
    hw = hardware.PRESETS["h200-sxm"].replace(**dict(FIGURES, deal_first_ns=FIGURES["deal_share_ns"]))
    raw["in_layer"] = in_layer(hw)
    for c in raw["in_layer"]:
        walk = c.pop("deal_walk")
        c["deal_walk"] = {k: walk["first"][k] + walk["next"][k] for k in ("loads", "ns", "n")}
    v = _fit(tmp_path, raw).values
    assert v["deal_first_ns"] == v["deal_share_ns"] == pytest.approx(FIGURES["deal_share_ns"])
    assert v["deal_count_ns"] == pytest.approx(FIGURES["deal_count_ns"])


def test_without_walks_timed_the_deal_is_not_modelled(tmp_path):
    raw = synthetic()
    raw["in_layer"] = in_layer(hardware.PRESETS["h200-sxm"].replace(**dict(FIGURES, deal_count_ns=0.0)))
    fit = _fit(tmp_path, raw)
    assert fit.values["deal_first_ns"] == fit.values["deal_share_ns"] == fit.values["deal_count_ns"] == 0.0
    assert "not modelled" in fit.sources["deal_count_ns"]


def test_the_per_tile_combine_is_fitted_in_the_layers_and_priced_for_float32_only(tmp_path):
    raw = synthetic()
    hw = hardware.PRESETS["h200-sxm"].replace(**FIGURES, **TILE_COMBINE)
    raw["in_layer"] = in_layer(hw)
    for name, want in TILE_COMBINE.items():
        assert _fit(tmp_path, raw).values[name] == pytest.approx(want, rel=1e-6), name
    # the task slows as the layer returns more bytes than the L2 holds; the bf16 task only marks arrival
    hw = hw.replace(copy_ns_per_byte=0.04)
    small, large = (presets.get("flashmoe").replace(ranks=1, tokens=t) for t in (1024, 16384))
    one = np.array([COMBINE]), np.array([1.0]), np.array([128 * 2048 * 8.0])  # a combine task of a 128-row tile
    ns = [costs.task_ns(hw, cfg, one[0], one[1], one[2])[0] for cfg in (small, large)]
    assert ns[0] < ns[1] == pytest.approx(hw.task_overhead_ns + tile_combine(hw, 16384)["tile_combine_ns"]["median"])
    # the bf16 task only marks its tile's arrival: its fixed time alone, whatever the tile's bytes
    bf16 = large.replace(precision="bfloat16")
    marks = [costs.task_ns(hw, bf16, one[0], one[1], np.array([rows * 2048 * 6.0]))[0] for rows in (16, 128)]
    assert marks == [hw.task_overhead_ns + hw.tile_combine_fixed_ns] * 2


def test_the_bf16_mark_is_the_median_of_its_layers_tasks():
    layers = [{"tokens": t, "experts": 64, "tile_combine_ns": _stat(ns), "tile_combine_bytes": _stat(2.0 ** 17)}
              for t, ns in ((768, 1216.0), (3072, 944.0), (12288, 864.0))]
    fit = combine.fit_tile_combine(layers, "bfloat16", "synthetic")
    assert fit.values == {"tile_combine_fixed_ns": 944.0, "tile_combine_l2_ns_per_byte": 0.0,
                          "tile_combine_ns_per_byte": 0.0, "tile_combine_knee_bytes": 0.0}
    assert "only marks its tile's arrival" in fit.sources["tile_combine_fixed_ns"]
    assert len(fit.residuals) == 3
    fewer = combine.fit_tile_combine(layers[:2], "bfloat16", "synthetic")  # too few layers: not modelled
    assert fewer.values["tile_combine_fixed_ns"] == 0.0 and "copy_rows' rate alone" in fewer.sources[
        "tile_combine_fixed_ns"]


def test_one_rate_is_kept_unless_a_knee_halves_the_residuals(tmp_path):
    raw = synthetic()
    flat = dict(FIGURES, dispatch_store_knee_bytes=0.0, dispatch_store_l2_ns_per_byte=0.0)
    raw["in_layer"] = in_layer(hardware.PRESETS["h200-sxm"].replace(**flat))
    v = _fit(tmp_path, raw).values
    assert (v["dispatch_store_knee_bytes"], v["dispatch_store_l2_ns_per_byte"]) == (0.0, 0.0)
    assert v["dispatch_store_ns_per_byte"] == pytest.approx(0.16, rel=1e-6)
    assert v["dispatch_store_fixed_ns"] == pytest.approx(3000.0, rel=1e-6)


def test_two_gpu_layers_and_too_few_layers_leave_the_microbenchmark_fit(tmp_path):
    hw = hardware.PRESETS["h200-sxm"].replace(**FIGURES)
    for layers in (in_layer(hw, world=2), in_layer(hw, tokens=TOKENS[:calibrate.IN_LAYER_MIN - 1])):
        raw = synthetic()
        raw["in_layer"] = layers
        v = _fit(tmp_path, raw).values
        assert v["dispatch_store_ns_per_byte"] == pytest.approx(TRUE["dispatch_store_ns_per_byte"], rel=1e-6)
        assert v["dispatch_store_knee_bytes"] == 0.0
        assert v["reduce_fixed_ns"] == 0.0


def test_layers_whose_times_do_not_grow_with_their_bytes_are_refused(tmp_path):
    raw = synthetic()
    raw["in_layer"] = in_layer(hardware.PRESETS["h200-sxm"].replace(**FIGURES))
    for c, ns in zip(raw["in_layer"], np.linspace(9e4, 1e4, len(TOKENS))):
        c["dispatch_ns"] = _stat(float(ns))
    with pytest.raises(calibrate.CalibrationError, match="in_layer.*grow with the bytes"):
        _fit(tmp_path, raw)


def test_every_stored_share_of_a_round_takes_the_mean_shares_time():
    """A share's fence waits for the stores queued ahead of it: a half share is no quicker."""
    hw = hardware.PRESETS["h200-sxm"].replace(**FIGURES)
    inflight = 256 * 65536.0
    tokens = 4096 * 2048 * 2.0
    half, full = (costs.dispatch_ns(hw, b, LOCAL, "store", inflight, {LOCAL: 256}, tokens) for b in (32768.0, 65536.0))
    assert half == full == pytest.approx(costs.store_dispatch_ns(hw, 65536.0, tokens) + hw.task_overhead_ns)
    # tokens beyond the knee are read at HBM's rate: slower per byte than within it
    small, large = (costs.store_dispatch_ns(hw, 65536.0, w) - hw.dispatch_store_fixed_ns
                    for w in (hw.dispatch_store_knee_bytes / 2, hw.dispatch_store_knee_bytes * 8))
    assert small == pytest.approx(65536.0 * 0.03) and large > 4 * small


def _return_layer(home1, peer1, home0, peer0, rows=100, tile_n=64, nb=4):
    """The in_layer entry of a two-GPU layer with these GEMM medians by source."""
    def task(home, peer):
        return {"home": _stat(home), "peer": _stat(peer)}
    return {"tokens": 6144, "experts": 64, "world": 2, "n_proc": 263, "tile_n": tile_n, "bytes_per_value": nb,
            "tile_rows": _stat(rows), "gemm_by_source": {"gemm0": task(home0, peer0), "gemm1": task(home1, peer1)}}


def test_a_peer_tiles_gemm1_stores_are_fitted_beyond_gemm0s_difference_and_the_fence(tmp_path):
    raw = synthetic()
    # GEMM1 of a peer's tile 5 us longer than of its own; GEMM0's 1 us (no stores away): 4 us, of
    # which the fence's round trip (2 x 1.2 us, the file's ping-pong) leaves 1.6 over 100 rows x 64
    # columns x 4 bytes
    raw["in_layer"] = in_layer(hardware.PRESETS["h200-sxm"].replace(**FIGURES)) + [
        _return_layer(200e3, 205e3, 190e3, 191e3)]
    fit = _fit(tmp_path, raw)
    assert fit.values["nvlink_latency_ns"] == TRUE["nvlink_latency_ns"] == 1200.0
    assert fit.values["return_store_ns_per_byte"] == pytest.approx(1600.0 / (100 * 64 * 4))
    assert "6144 tokens on 2 GPUs" in fit.sources["return_store_ns_per_byte"]
    hw = hardware.PRESETS["h200-sxm"].replace(put_nvlink_ns_per_byte=0.1, nvlink_latency_ns=1200.0,
                                              return_store_ns_per_byte=fit.values["return_store_ns_per_byte"])
    assert costs.store_ns(hw, NVLINK, 100 * 64 * 4) == pytest.approx(4000.0)
    assert costs.store_ns(hw, NVLINK, 0) == costs.store_ns(hw, LOCAL, 100 * 64 * 4) == 0.0
    # stores that cost no more than the fence stay free; without that layer one block's put rate stands
    raw["in_layer"][-1] = _return_layer(200e3, 203e3, 190e3, 191e3)
    assert _fit(tmp_path, raw).values["return_store_ns_per_byte"] == 0.0
    raw["in_layer"] = raw["in_layer"][:-1]
    fit = _fit(tmp_path, raw)
    assert fit.values["return_store_ns_per_byte"] == fit.values["put_nvlink_ns_per_byte"] > 0
    assert "not measured" in fit.sources["return_store_ns_per_byte"]


def test_a_traced_two_gpu_layers_tasks_are_split_by_their_tiles_source():
    """Rank 0's GEMM tasks by the trace's peer (the tile's source), tiles of one source only, its
    own shares' rows per tile."""
    cfg = presets.get("flashmoe").replace(ranks=2, tokens=6144)
    row = cfg.hidden * 4
    tb = TraceBuilder()
    # rank 0's shares: expert 3's tile 0 (2 shares, 90 rows), expert 40's tile 0 (30 rows, sent to rank 1)
    for lane, (expert, rows, to) in enumerate(((3, 50, 0), (3, 40, 0), (40, 30, 1))):
        tb.add(0, 0, lane, "processor", "dispatch", 0.0, 5.0, expert=expert, tile=0, peer=to, nbytes=rows * row)
    tb.add(1, 0, 0, "processor", "gemm1", 0.0, 999.0, expert=40, tile=0, peer=0)  # rank 1's: not rank 0's
    for lane, (kind, src, ns) in enumerate((("gemm0", 0, 100.0), ("gemm0", 1, 104.0), ("gemm1", 0, 110.0),
                                            ("gemm1", 0, 112.0), ("gemm1", 1, 130.0))):
        tb.add(0, 0, lane, "processor", kind, 10.0, 10.0 + ns, expert=3, tile=2 * src, peer=src)
    # window 1 (positions 128-255) holds source 0's last slots and source 1's first (C = 192): left out
    tb.add(0, 0, 9, "processor", "gemm1", 10.0, 500.0, expert=3, tile=1, peer=0)
    got = microbench.returns_by_source(cfg, tb.build(), 0, 4)
    assert got["tile_rows"]["median"] == 60.0 and got["tile_rows"]["n"] == 2
    assert {k: (v["home"]["median"], v["peer"]["median"]) for k, v in got["gemm_by_source"].items()} == {
        "gemm0": (100.0, 104.0), "gemm1": (111.0, 130.0)}
    with pytest.raises(RuntimeError, match="rank 1: no dispatch shares"):
        microbench.returns_by_source(cfg, tb.build(), 1, 4)


def test_the_final_combine_reads_a_row_in_whole_rounds():
    """processor.cuh combine_tokens reads a returned row in rounds of 32 lanes x REDUCE_BATCH 16-byte
    loads, a round's latency whatever share of it lies in H: a part round is priced as a whole one,
    and the y row written by its bytes."""
    rng = np.random.default_rng()
    for dtype_bytes, per_round in ((2, 32 * costs.REDUCE_BATCH * 8), (4, 32 * costs.REDUCE_BATCH * 4)):
        rounds = int(rng.integers(1, 8))
        whole = rounds * per_round
        assert costs.reduce_read_width(whole, dtype_bytes) == whole
        part = whole - 64 * int(rng.integers(1, per_round // 64))
        assert costs.reduce_read_width(part, dtype_bytes) == whole
        rows, tokens = float(rng.uniform(1, 8)), int(rng.integers(1, 4096))
        assert costs.reduce_bytes(tokens, rows, part, dtype_bytes) == pytest.approx(
            tokens * (rows * dtype_bytes * whole + costs.Y_BYTES * part))
