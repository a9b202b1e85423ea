"""Each calibration fit on its own (sim/calibration/): on synthetic microbenchmark rows drawn from
known figures with noise, the figures come back; on the committed calibration files, the fitted
points' residuals stay within the bound the fit's module states."""

import copy
import json

import numpy as np
import pytest
from test_sim_calibrate import TRUE, synthetic

from reference import presets
from sim import calibrate, costs, hardware
from sim.calibration import combine, dispatch, gate, gemm, moves, scheduler
from sim.calibration.common import one_gpu_layers

NOISE = 0.003  # the synthetic medians' relative noise (the microbenchmark's repeat within 1-2%)
H200 = hardware.PRESETS["h200-sxm"]
BLOCKS = 132 * TRUE["blocks_per_sm"]


def noisy(rows: list[dict], key: str, rng) -> list[dict]:
    """`rows` with each median of `key` times 1 + a fresh draw of +-NOISE."""
    out = copy.deepcopy(rows)
    for r in out:
        r[key]["median"] *= 1.0 + rng.uniform(-NOISE, NOISE)
    return out


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_gemm_recovers_rate_fixed_cost_and_weight_streaming(rng):
    raw = synthetic()
    raw["gemm"] = noisy(raw["gemm"], "ns_per_task", rng)
    f = gemm.fit_gemm(raw, H200, BLOCKS, "synthetic", "float32")
    v = f.values
    assert v["gemm_row_group"] == 0.0
    assert v["matrix_efficiency"] == pytest.approx(TRUE["matrix_efficiency"], rel=0.03)
    assert v["gemm_fixed_ns"] == pytest.approx(TRUE["gemm_fixed_ns"], rel=0.03)
    # the weight streaming: a slice read by one tile against one shared by eight (its load is a
    # tenth of these tasks' time, so the noise may pick a p-norm of it with the multiply instead)
    rate = v["matrix_efficiency"] * H200.tflops("float32") * 1e3 / BLOCKS
    tall = [g for g in synthetic()["gemm"] if g["blocks"] == BLOCKS and g["rows"] == 128 and g["task"] == "gemm0"]
    alone, shared = (next(g for g in tall if g["tiles_per_expert"] == n) for n in (1, 8))
    want = alone["ns_per_task"]["median"] - shared["ns_per_task"]["median"]
    got = gemm.task_model_ns(v, rate, alone) - gemm.task_model_ns(v, rate, shared)
    assert got == pytest.approx(want, rel=0.25)
    assert f.fitted_misses()[1] <= 3 * NOISE


def test_moves_recover_the_copy_and_put_rates(rng):
    raw = synthetic()
    raw["copy"] = noisy(raw["copy"], "ns_per_copy", rng)
    raw["put"] = noisy(raw["put"], "ns_per_put", rng)
    f = moves.fit_moves(raw, H200, "h200-sxm", "synthetic", {"blocks_per_sm": TRUE["blocks_per_sm"]})
    for name in ("copy_ns_per_byte", "put_local_ns_per_byte", "put_nvlink_ns_per_byte"):
        assert f.values[name] == pytest.approx(TRUE[name], rel=0.02), name
    assert f.values["nvlink_gbps"] == pytest.approx(TRUE["nvlink_gbps"], rel=0.02)
    assert f.values["copy_nvlink_ns_per_byte"] == pytest.approx(TRUE["copy_nvlink_ns_per_byte"], rel=0.01)
    assert f.fitted_misses()[0] <= 0.02


def test_dispatch_recovers_the_store_shares_fixed_time_and_rate(rng):
    raw = synthetic()
    raw["dispatch"] = noisy(raw["dispatch"], "ns_per_tile", rng)
    given = calibrate.fit(synthetic(), "h200-sxm", "synthetic").values
    f = dispatch.fit_dispatch(raw, H200, "synthetic", given)
    assert f.values["dispatch_store_ns_per_byte"] == pytest.approx(TRUE["dispatch_store_ns_per_byte"], rel=0.02)
    assert f.values["dispatch_store_fixed_ns"] == pytest.approx(TRUE["dispatch_store_fixed_ns"], rel=0.15)
    assert f.fitted_misses()[1] <= 10 * NOISE  # absolute least squares: the 8-row share's noise shifts it most


def test_the_final_combine_recovers_its_l2_and_hbm_rates(rng):
    hw = H200.replace(reduce_knee_bytes=TRUE["l2_knee_bytes"], reduce_ns_per_byte=0.08, reduce_l2_ns_per_byte=0.05)
    from reference import presets

    points = []
    for tokens in (1024, 4096, 8192, 16384):
        cfg = presets.get("flashmoe").replace(ranks=1, tokens=tokens)
        ns = costs.reduce_ns(hw, cfg, 263) * (1.0 + rng.uniform(-NOISE, NOISE))
        points.append({"tokens": tokens, "top_k": 2, "hidden": 2048, "n_proc": 263, "bytes_per_value": 4,
                       "ns_per_block": {"median": ns, "n": 1}})
    f = combine.fit_reduce(points, [], TRUE["l2_knee_bytes"], "synthetic")
    assert f.values["reduce_ns_per_byte"] == pytest.approx(0.08, rel=0.03)
    assert f.values["reduce_l2_ns_per_byte"] == pytest.approx(0.05, rel=0.03)
    assert f.fitted_misses()[1] <= 3 * NOISE


def test_gate_recovers_its_work_item_fixed_and_selection_costs(rng):
    raw = synthetic()
    for g in raw["gate"]:
        g["ns"] *= 1.0 + rng.uniform(-NOISE, NOISE)
    f = gate.fit_gate(raw, costs.gate_units(H200.replace(blocks_per_sm=TRUE["blocks_per_sm"])), 1, "synthetic")
    # the work items carry most of the time; the small terms (slot scans, splits, a selection from
    # shared memory) trade places within the noise of 8 points, one the data want negative held at zero
    assert f.values["gate_item_ns_per_h"] == pytest.approx(TRUE["gate_item_ns_per_h"], rel=0.02)
    assert f.values["gate_select_global_ns"] == pytest.approx(TRUE["gate_select_global_ns"], rel=0.2)
    assert f.fitted_misses()[1] <= 0.03


def test_nonnegative_least_squares_is_the_best_fit_over_every_set_of_free_figures(rng):
    # the constrained optimum is the unconstrained fit over some subset of columns: try them all
    import itertools

    for _ in range(20):
        a = rng.uniform(0.0, 1.0, (9, 5)) * rng.uniform(1.0, 1e4, 5)
        y = a @ rng.uniform(-1.0, 1.0, 5) + rng.normal(0.0, 0.1, 9) * np.abs(a).mean()
        keep = np.ones(5, bool)
        keep[rng.integers(5)] = rng.random() < 0.5
        best = np.inf
        for n in range(int(keep.sum()) + 1):
            for cols in itertools.combinations(np.flatnonzero(keep), n):
                x = np.zeros(5)
                if cols:
                    x[list(cols)], *_ = np.linalg.lstsq(a[:, list(cols)], y, rcond=None)
                if (x >= 0).all():
                    best = min(best, float(np.sum((a @ x - y) ** 2)))
        got = gate.nonnegative_lstsq(a, y, keep)
        assert (got >= 0).all() and (got[~keep] == 0).all()
        assert float(np.sum((a @ got - y) ** 2)) == pytest.approx(best, rel=1e-9)


def test_scheduler_figures_are_the_measured_medians():
    raw = synthetic()
    f = scheduler.fit_scheduler(raw, H200, "synthetic").merge(scheduler.fit_latency(raw, "synthetic"))
    for name in ("handoff_ns", "wake_ns", "assign_ns", "stop_ns", "nvlink_latency_ns"):
        assert f.values[name] == pytest.approx(TRUE[name]), name


def test_enqueue_recovers_its_fixed_source_and_task_costs(rng):
    true = dict(enqueue_ns=1200.0, enqueue_source_ns=1900.0, enqueue_task_ns=23.0)

    def layer(world, tasks):  # an in-layer layer's enqueues of its experts' tasks
        ns = [true["enqueue_ns"] + world * true["enqueue_source_ns"] + n * true["enqueue_task_ns"] for n in tasks]
        return {"tokens": 1536, "experts": 64, "top_k": 2, "hidden": 2048, "ffn": 2048, "world": world,
                "enqueues": [[n, v * (1.0 + rng.uniform(-NOISE, NOISE))] for n, v in zip(tasks, ns)]}

    raw = {"world": 2, "in_layer": [layer(1, (8, 16, 48)), layer(1, (24, 96)), layer(2, (24, 48))]}
    f = scheduler.fit_enqueue(raw, "synthetic")
    for name, want in true.items():
        assert f.values[name] == pytest.approx(want, rel=0.05), name
    assert len(f.residuals) == 3 and "2 on 2 GPU(s)" in f.sources["enqueue_ns"]
    # a file from before them, or with one GPU's alone (the source ranks' cost unknown): not modelled
    for old in ({"in_layer": []}, {"world": 1, "in_layer": [layer(1, (8, 16))]}):
        f = scheduler.fit_enqueue(old, "old")
        assert all(f.values[k] == 0.0 and "not modelled" in f.sources[k] for k in true)


def test_wake_is_the_first_tasks_wait_beyond_its_experts_enqueue():
    raw = synthetic()
    idle = raw["scheduler"]["idle_one_gpu"]
    # 48 rows an expert on average: one tile, GEMM0's 2048 columns in 8 blocks of 256
    idle["config"] = presets.get("flashmoe").replace(ranks=1, tokens=1536, tile_n=256).to_dict()
    enqueue = dict(enqueue_ns=1000.0, enqueue_source_ns=2000.0, enqueue_task_ns=20.0)
    f = scheduler.fit_scheduler(raw, H200, "synthetic", enqueue)
    assert f.values["wake_ns"] == pytest.approx(TRUE["wake_ns"] - (1000.0 + 2000.0 + 8 * 20.0))
    assert "its expert's enqueue (3160 ns)" in f.sources["wake_ns"]


def _committed():
    """(gpu, build) of every build section in the committed calibration files."""
    out = []
    for gpu in sorted(calibrate.GPU_PRESET):
        raw = json.loads((calibrate.MEASUREMENTS / f"calibration-{gpu}.json").read_text())
        out += [(gpu, d) for d in hardware.DTYPES if d == "float32" or d in raw]
    return out


@pytest.fixture(scope="module")
def committed_fits():
    """Each committed build's rows, its whole fit and each mechanism's fit, fitted once."""
    out = {}
    for gpu, build in _committed():
        raw = json.loads((calibrate.MEASUREMENTS / f"calibration-{gpu}.json").read_text())
        rows = raw if build == "float32" else {**{k: raw[k] for k in calibrate.BYTE_SECTIONS if k in raw},
                                               **raw[build]}
        base = calibrate.GPU_PRESET[gpu]
        hw, whole = hardware.PRESETS[base], calibrate.fit(rows, base, gpu, build)
        v = whole.values
        blocks, wgs = int(v["blocks_per_sm"] * v["sms"]), int(v["warpgroups_per_block"])
        layers = one_gpu_layers(rows)
        out[gpu, build] = {
            gemm: [(gemm.BOUND, gemm.fit_gemm(rows, hw, blocks, gpu, build))],
            moves: [(moves.BOUND, moves.fit_moves(rows, hw, base, gpu, v))],
            dispatch: [(dispatch.BOUND, dispatch.fit_dispatch(rows, hw, gpu, v)),
                       (dispatch.DEAL_BOUND, dispatch.fit_deal(layers, gpu))],
            combine: [(combine.TILE_COMBINE_BOUND, combine.fit_tile_combine(layers, build, gpu)),
                      (combine.REDUCE_BOUND, combine.fit_reduce(rows["combine"], layers, v["l2_knee_bytes"], gpu))],
            gate: [(gate.BOUND, gate.fit_gate(rows, blocks * wgs, wgs, gpu))],
            scheduler: [(scheduler.SEEN_BOUND, scheduler.fit_signal_seen(layers, gpu)),
                        (scheduler.ENQUEUE_BOUND, scheduler.fit_enqueue(rows, gpu))],
            "whole": whole}
    return out


@pytest.mark.parametrize("mechanism", [gemm, moves, dispatch, combine, gate, scheduler],
                         ids=lambda m: m.__name__.split(".")[-1])
def test_committed_files_fit_within_the_stated_bounds(committed_fits, mechanism):
    for (gpu, build), fits in committed_fits.items():
        for (mean_bound, worst_bound), f in fits[mechanism]:
            mean, worst = f.fitted_misses()
            assert mean <= mean_bound and worst <= worst_bound, (gpu, build, mean, worst)
            # the whole fit holds this mechanism's figures and residuals unchanged
            whole = fits["whole"]
            assert all(whole.values[k] == v for k, v in f.values.items()), (gpu, build)
            assert set(f.residuals) <= set(whole.residuals), (gpu, build)


def test_committed_scheduler_figures_are_their_medians(committed_fits):
    for (gpu, build), fits in committed_fits.items():
        raw = json.loads((calibrate.MEASUREMENTS / f"calibration-{gpu}.json").read_text())
        s = (raw if build == "float32" else raw[build])["scheduler"]
        v = fits["whole"].values
        assert v["handoff_ns"] == s["gap_ns"]["median"], (gpu, build)
        assert v["stop_ns"] == s["idle_one_gpu"]["stop_ns"]["median"], (gpu, build)
        bare = next(p for p in raw["pingpong"] if p["bytes"] == 0 and not p.get("failed"))
        assert v["nvlink_latency_ns"] == bare["round_trip_ns"] / 2, (gpu, build)


def test_every_figure_names_its_source(committed_fits):
    for (gpu, build), fits in committed_fits.items():
        whole = fits["whole"]
        assert set(whole.sources) == set(whole.values)
        assert all(gpu in how for how in whole.sources.values()), (gpu, build)
