"""The validation set (reference/validation_set.py): the committed list is the seed's draw, it spans the
distribution it claims, no layer of it is one the calibration fits (gpu.microbench.fit_layers) or one
a committed run measured, and the device part that measures it (`validate`) fits its time."""

import json
import statistics
from pathlib import Path

import pytest

from gpu import cases, microbench, spawn
from moelab.cli import main
from reference import Config, validation_set
from sim import compare, heldout

LAYERS = validation_set.layers()

# the committed bf16 sweep on 1, 2 and 4 H100s (30 traced points) and its call's figures (its device
# log, named in measurements/MANIFEST.json: 194 s with calibrate, which took 48.9 s alone in an earlier
# call): the call's time beyond its cases' own is the environment, the ceilings and one session per GPU count
SWEEP = compare.MEASUREMENTS / "gpu" / "h100x4-bench-bf16-33d8ac7.json"
SWEEP_CALL_S, CALIBRATE_CALL_S = 194.0, 48.9
DEVICE_BUDGET_S = 180.0  # the whole set on 1, 2 and 4 GPUs of one 4-GPU call


def shape(cfg: Config) -> tuple:
    """What makes two layers the same layer: every field but the name, the tile and the precision."""
    d = cfg.to_dict()
    for f in ("name", "tile_m", "tile_n", "tile_k", "precision", "seed"):
        d.pop(f)
    return tuple(sorted(d.items(), key=lambda kv: kv[0]))


def test_the_committed_list_is_the_seeds_draw():
    assert [c.to_dict() for c in LAYERS] == [c.to_dict() for c in validation_set.draw()]


def test_another_seed_draws_another_set():
    assert [shape(c) for c in validation_set.draw(validation_set.SEED + 1)] != [shape(c) for c in LAYERS]


def test_the_set_spans_the_distribution():
    v = validation_set
    assert len(LAYERS) >= 24 and len({c.name for c in LAYERS}) == len(LAYERS)
    for p in v.GPU_COUNTS:
        assert len(v.layers(ranks=p)) == v.PER_GPU_COUNT
    for c in LAYERS:
        assert c.experts in v.EXPERTS and 1 <= c.top_k <= min(v.TOP_K_MAX, c.experts)
        for w in (c.hidden, c.ffn):
            assert v.WIDTH_RANGE[0] <= w <= v.WIDTH_RANGE[1] + v.FULL_STEP and w % v.WIDTH_STEP == 0
        assert 0 <= c.skew <= v.SKEW_MAX and c.dtype == "bfloat16"
        assert v.weight_bytes(c) <= v.WEIGHT_BYTES_MAX and v.flops(c) <= v.FLOPS_MAX
        assert v.slot_bytes(c) <= v.SLOT_BYTES_MAX
    assert {c.gated for c in LAYERS} == {True, False}
    assert {v.ragged(c) for c in LAYERS} == {True, False}
    assert {c.capacity_factor for c in LAYERS} == set(v.CAPACITY)
    assert min(c.skew for c in LAYERS) == 0 and max(c.skew for c in LAYERS) >= 1.5


@pytest.mark.parametrize("dtype", microbench.DTYPES)
def test_no_validation_layer_is_in_the_fit_set(dtype):
    fit = {shape(c) for p in (1, 2) for c in microbench.fit_layers(p, dtype)}
    assert fit, "the fit set is empty"
    assert not fit & {shape(c) for c in LAYERS}


def test_the_fit_set_check_can_fail():
    fit = microbench.fit_layers(2, "bfloat16")
    assert shape(fit[0].replace(name="val-xx")) in {shape(c) for c in fit}


def test_no_validation_layer_is_a_committed_runs_layer():
    """No other committed run (a bench point, an experiment) measured a validation layer."""
    measured = {shape(r.config) for r in compare.measured_runs(calibrated_only=False) if not heldout.is_validation(r)}
    assert not measured & {shape(c) for c in LAYERS}


def test_the_device_part_runs_every_layer_the_kernel_supports_at_the_bench_tile():
    for p in validation_set.GPU_COUNTS:
        run, refused = cases.validation_cases(p, "h100x4-")
        # NVSHMEM's heap is sized for a GPU count's largest layer (its slot buffers and signals)
        assert spawn.symmetric_heap_bytes(run) < 10 * validation_set.SLOT_BYTES_MAX
        assert len(run) + len(refused) == validation_set.PER_GPU_COUNT
        assert all(why for _, why in refused)
        for case in run:
            cfg = Config.from_dict(case["config"])
            assert (cfg.tile_m, cfg.tile_n, cfg.tile_k) == cases.BF16_TILE and cfg.ranks == p
            assert case["trace"] == f"h100x4-trace-{cfg.name}-p{p}.npz" and case["baselines"] == []
        ragged = [validation_set.ragged(Config.from_dict(c["config"]), cases.BF16_TILE[1]) for c in run]
        assert ragged == sorted(ragged), "layers with a ragged column block run last"


def device_seconds(cfg: Config, sweep: dict) -> float:
    """A validation case's seconds on the GPUs: the committed sweep's time a case beyond its launches
    (median, on the same GPU count), plus its launches (golden run, telemetry run, 3 + 10 timed, twice)
    at the sweep's slowest expert FLOP rate a GPU."""
    def launches(r):
        return 2 + 2 * (r["warmup"] + r["iters"])

    same = [r for r in sweep["results"] if r["config"]["ranks"] == cfg.ranks and not r["name"].startswith(
        "bench-flashmoe-bf16-")]  # the default point also profiles the torch layer
    fixed = statistics.median(r["seconds"] - launches(r) * (r["kernel_ms"] + r["torch_bfloat16_ms"]) / 1e3
                              for r in same)
    rate = min(4 * r["kept_rows"] * r["config"]["hidden"] * r["config"]["ffn"] / r["config"]["ranks"]
               / (r["kernel_ms"] / 1e3) for r in sweep["results"])
    return fixed + launches(same[0]) * validation_set.flops(cfg) / rate


def test_the_whole_set_measures_in_three_minutes():
    sweep = json.loads(SWEEP.read_text())
    call_fixed = SWEEP_CALL_S - CALIBRATE_CALL_S - sum(r["seconds"] for r in sweep["results"])
    each = [device_seconds(c, sweep) for c in LAYERS]
    total = call_fixed + sum(each)
    assert 0 < call_fixed < 120 and max(each) < 10
    assert total < DEVICE_BUDGET_S, f"{total:.0f} s estimated (each layer {min(each):.1f} to {max(each):.1f} s)"


def _comparison(cfg: Config, latency_error: float, phase_errors: dict[str, float]) -> compare.Comparison:
    """A made-up comparison of `cfg` with these errors (bounds as compare sets them)."""
    run = compare.MeasuredRun(Path(f"h100x4-trace-{cfg.name}-p{cfg.ranks}.npz"), cfg, None, "NVIDIA H100", 132)
    rows = [compare._row("layer latency (ms)", 1 + latency_error, 1.0, compare.LATENCY_BOUND)]
    rows += [compare._row(f"{ph} busy (ms per block)", 1 + e, 1.0, compare.PHASE_BOUND)
             for ph, e in phase_errors.items()]
    rows.append(compare._row("SM utilization", 0.5, 0.6, None))
    return compare.Comparison(run, None, None, {}, {}, rows)


def test_a_run_is_a_validation_layer_only_with_the_sets_shape():
    cfg = cases.in_dtype(LAYERS[0], "bfloat16")
    assert heldout.is_validation(_comparison(cfg, 0, {}).run)
    assert not heldout.is_validation(_comparison(cfg.replace(tokens=cfg.tokens + 256), 0, {}).run)
    assert not heldout.is_validation(_comparison(cfg.replace(name="flashmoe"), 0, {}).run)


def test_the_bars_count_latency_mean_and_phases():
    layers = [cases.in_dtype(c, "bfloat16") for c in LAYERS[: heldout.MIN_LAYERS]]
    good = [_comparison(c, 0.04 * (-1) ** i, {"gemm0": 0.1}) for i, c in enumerate(layers)]
    (b,) = heldout.bars(good)
    assert (b.gpu, b.layers, b.latency_within, b.ok) == ("h100", heldout.MIN_LAYERS, heldout.MIN_LAYERS, True)
    assert b.mean_abs_error == pytest.approx(0.04)
    mean_off = [_comparison(c, 0.08, {}) for c in layers]  # each within 10%, the mean not within 5%
    assert not heldout.bars(mean_off)[0].ok
    one_phase = good[:-1] + [_comparison(layers[-1], 0.0, {"dispatch": -0.25})]
    (b,) = heldout.bars(one_phase)
    assert not b.ok and b.phase_misses == [(one_phase[-1].run.name, "dispatch", pytest.approx(-0.25))]
    assert not heldout.bars(good[:-1])[0].ok, "fewer layers than the bars need"
    assert heldout.bars([_comparison(layers[0].replace(name="flashmoe"), 0.5, {})]) == []


def test_the_report_gives_each_measured_layer_and_the_bars():
    measured = _comparison(cases.in_dtype(LAYERS[0], "bfloat16"), -0.12, {"gate": 0.05, "dispatch": -0.3})
    page = heldout.markdown([measured])
    row = next(line for line in page.splitlines() if line.startswith(f"| {LAYERS[0].name} |"))
    assert "| h100 |" in row and "-12.0% **miss**" in row and "-30.0% **miss**" in row and "+5.0% |" in row
    assert "h100: 1 layers measured (bars need 24)" in page and "NOT met" in page
    assert sum(line.startswith("| val-") for line in page.splitlines()) == len(LAYERS)
    assert "calibration-h100.json" in page and "(2, 8192, 64)" in page  # the fit set, as calibrated


def test_compare_validation_exits_non_zero_until_the_bars_are_met(capsys):
    measured = [r for r in compare.measured_runs() if heldout.is_validation(r)]
    if measured:
        pytest.skip("validation layers are measured: test_the_validation_bars holds them")
    assert main(["compare", "--validation", "--quiet"]) == 1
    assert "no validation layer is measured" in capsys.readouterr().err
    assert main(["compare", "--validation", "--quiet", "--no-fail"]) == 0


# (run, quantity) misses of the validation layers, each with its cause: the validation set is never
# fitted, so these are what the model lacks (docs/validation.md). Strict: a miss that starts to hold
# leaves this list.
VALIDATION_CAUSES = {
    "COMBINE_SHORT": (
        "the combine modelled 35% short at k 1 on four GPUs under skew 2 (H 1792, capacity 1.25; on the kernel "
        "before the gate's lists, 21-32% short at k 3-8 with E 48-160 on one GPU as well), where the "
        "calibration's in-layer layer at k 1 (H 2048, no skew) is predicted 6-11% long: not k itself"
    ),
    "COMBINE_PART_ROUND_LONG": (
        "the final combine modelled 22-24% long where capacity drops choices (k 1-4, capacity 1.0-1.25) and H "
        "leaves a part of a round (H 2560-5888; sim.costs.reduce_read_width prices it whole): a part round, or a "
        "round of few kept rows, costs less than a full one"
    ),
    "DISPATCH_ONE_GPU": (
        "on one GPU the local dispatch modelled 21-29% long where the tokens (3-11 MB) fit the L2: a share's "
        "measured fixed cost grows with H (3-10 us) and with the bytes at 0.025 ns a byte, where the fit's one "
        "fixed cost and its L2 rate (0.042) come from the calibration's layers of H 2048 alone"
    ),
    "DISPATCH_HOT_PEER": (
        "on four GPUs under skew 2 at k 1 the dispatch modelled 23-34% long: its few shares into the hot GPU (a "
        "median 57 KB, seven a GPU) took 5.7 us, where a round of 32 rows at copy_nvlink's rate and two fences "
        "give 8.6; the copy loop's pass is timed on one block alone, not with the sender's rows in the L2"
    ),
    "LAYER_SHORT": (
        "the layer modelled 12% short on four H200s at the current kernel (val-37, k 7, H 2240; val-42 and 35 "
        "at -9.5% and -7.9%) while every phase's busy time holds within 8% (the gate within 4%), and SM "
        "utilization is modelled 10 points high: the processors wait between phases longer than modelled, "
        "the first task after an expert's last tile 9-45 us after it where one GPU's waits 7-9"
    ),
    "GEMM_SHALLOW": (
        "the layer modelled 13% short on four GPUs with its GEMM tasks 1024-1792 deep (val-47; val-44, the "
        "other, holds at the current kernel, -8.3%): the fit (fixed + the multiply's and the weight slice's "
        "load's p-norm) misses its own in-layer GEMMs 512-1536 deep by -14% to +13% (each GEMM's tasks "
        "together: both of H 1024 and I 768 13-14% short, H 1536's GEMM0 12% long): a shallow task's time "
        "beside the layer's other tasks varies by more than its depth, rows and sharing say"
    ),
    "DISPATCH_ONE_GPU_DROPS": (
        "on one GPU under skew 1.5 with capacity 1.25 the local dispatch modelled 26-31% short (an H100, and an "
        "H200 since its calibration at the current kernel): no microbenchmark times the dispatch of a layer that "
        "drops rows"
    ),
    "GEMM_SKEW": (
        "GEMM busy time off by 24-37% on skewed layers with k 1, capacity 1.25 or E 8: the few rows a tile "
        "holds cost what the 64-row groups give; val-36's GEMM1 tasks are modelled 37% long, and its layer was "
        "too (+20%) while each expert's GEMM1 tasks were queued the moment its last GEMM0 task ended: the "
        "scheduler dealt them behind the long ones, into the lowest lanes' second slots. Queued one thread's "
        "writing later (costs.enqueue_ns, as the kernel does), the layer holds (-3.7%) (val-31, E 8 and skew "
        "1.5, was 18% short on the earlier kernel for the same reason; at the current one on two H200s it holds)"
    ),
}
VALIDATION_MISSES: dict[tuple[str, str], str] = {
    ("h200x1-trace-val-01-p1", "dispatch"): VALIDATION_CAUSES["DISPATCH_ONE_GPU"],
    ("h200x1-trace-val-02-p1", "dispatch"): VALIDATION_CAUSES["DISPATCH_ONE_GPU_DROPS"],
    ("h200x1-trace-val-10-p1", "combine"): VALIDATION_CAUSES["COMBINE_PART_ROUND_LONG"],
    ("h200x2-trace-val-21-p2", "combine"): VALIDATION_CAUSES["COMBINE_PART_ROUND_LONG"],
    ("h200x4-trace-val-32-p4", "combine"): VALIDATION_CAUSES["COMBINE_PART_ROUND_LONG"],
    ("h200x4-trace-val-36-p4", "combine"): VALIDATION_CAUSES["COMBINE_SHORT"],
    ("h200x4-trace-val-36-p4", "dispatch"): VALIDATION_CAUSES["DISPATCH_HOT_PEER"],
    ("h200x4-trace-val-36-p4", "gemm1"): VALIDATION_CAUSES["GEMM_SKEW"],
    ("h200x4-trace-val-37-p4", "layer"): VALIDATION_CAUSES["LAYER_SHORT"],
    ("h200x4-trace-val-40-p4", "gemm0"): VALIDATION_CAUSES["GEMM_SKEW"],
    ("h200x4-trace-val-47-p4", "layer"): VALIDATION_CAUSES["GEMM_SHALLOW"],
    ("h100x1-trace-val-02-p1", "dispatch"): VALIDATION_CAUSES["DISPATCH_ONE_GPU_DROPS"],
    ("h100x1-trace-val-02-p1", "gemm1"): VALIDATION_CAUSES["GEMM_SKEW"],
    ("h100x1-trace-val-04-p1", "dispatch"): VALIDATION_CAUSES["DISPATCH_ONE_GPU"],
    ("h100x1-trace-val-14-p1", "dispatch"): VALIDATION_CAUSES["DISPATCH_ONE_GPU"],
}


@pytest.mark.slow
def test_the_validation_bars():
    runs = compare.measured_runs()
    measured = [r for r in runs if heldout.is_validation(r)]
    if not measured:
        pytest.skip("no validation layer measured yet (benchmarks/device_run.sh ... validate)")
    predict = compare.Predictor()
    comparisons = [compare.compare(r, runs=runs, predict=predict) for r in measured]
    misses = {(c.run.name, r[0].split(" ")[0]) for c in comparisons for r in c.rows if r[5] is False}
    assert misses == set(VALIDATION_MISSES), "\n".join(b.text() for b in heldout.bars(comparisons))
    verdicts = heldout.bars(comparisons)
    if not all(b.ok for b in verdicts):
        pytest.xfail("; ".join(b.text() for b in verdicts))
