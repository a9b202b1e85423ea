"""The bf16 kernel build's calibration: `moelab calibrate` fits a file's "bfloat16" section (made
here from known figures) beside the float32 top level and recovers both; the calibrated preset
carries each build's tile shape and the simulator runs a bf16 config on the bf16 figures; a preset
that lacks a dtype or was calibrated at another tile shape is refused with one clear error."""

import json

import pytest
from test_sim_calibrate import TRUE, TRUE_BF16, assert_calibrate_refuses, synthetic

import sim
from moelab.cli import main
from reference import presets
from sim import calibrate, compare, hardware

BF16_FIGURES = {k for k, v in TRUE_BF16.items() if TRUE[k] != v}  # what differs by build in TRUE_BF16


def both_builds() -> dict:
    """A calibration file with the float32 build at the top level and the bf16 build's section
    (without the byte moves, which the float32 job measures once)."""
    raw = synthetic()
    section = synthetic(t=TRUE_BF16, dtype="bfloat16")
    for k in ("meta", *calibrate.BYTE_SECTIONS):
        section.pop(k)
    return {**raw, "bfloat16": section}


def calibrated(tmp_path, raw: dict):
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(raw))
    return calibrate.calibrate(src, out=tmp_path / "calibrated-h200.json")


def test_fit_recovers_both_builds_figures(tmp_path):
    out, fits = calibrated(tmp_path, both_builds())
    assert list(fits) == ["float32", "bfloat16"]
    for dtype, true in (("float32", TRUE), ("bfloat16", TRUE_BF16)):
        for name, want in true.items():
            assert fits[dtype].values[name] == pytest.approx(want, rel=1e-6, abs=1e-6), (dtype, name)
    assert "bfloat16 build" in fits["bfloat16"].sources["gemm_fixed_ns"]
    assert "bfloat16 peak" in fits["bfloat16"].sources["matrix_efficiency"]
    doc = json.loads(out.read_text())
    assert doc["dtypes"]["float32"] == {"tile": [128, 64, 8]}
    assert doc["dtypes"]["bfloat16"]["tile"] == [128, 64, 32]


def test_a_bf16_config_runs_on_the_bf16_figures(tmp_path):
    out, _ = calibrated(tmp_path, both_builds())
    hw = hardware.get(str(out))
    bf16 = hw.for_dtype("bfloat16")
    for name in BF16_FIGURES:
        assert getattr(bf16, name) == pytest.approx(TRUE_BF16[name], rel=1e-6), name
    assert hw.for_dtype("float32") is hw
    assert hw.gemm_fixed_ns == pytest.approx(TRUE["gemm_fixed_ns"])
    cfg = presets.get("tiny").replace(ranks=1, precision="bfloat16", tile_k=32)
    assert sim.simulate(cfg, hardware=hw).trace.meta["hardware_figures"] == bf16.to_dict()
    hw.require_tile("bfloat16", (128, 64, 32))
    hw.require_tile("float32", (128, 64, 8))


def test_cli_prints_both_fits(tmp_path, capsys):
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(both_builds()))
    assert main(["calibrate", "--calibration", str(src), "--out", str(tmp_path / "x.json")]) == 0
    text = capsys.readouterr().out
    assert "fitted figures (float32 build)" in text and "fitted figures (bfloat16 build)" in text
    assert "residuals (bfloat16" in text


def test_a_file_without_bf16_covers_float32_only(tmp_path, capsys):
    src = tmp_path / "calibration-h200.json"
    src.write_text(json.dumps(synthetic()))
    out = tmp_path / "x.json"
    assert main(["calibrate", "--calibration", str(src), "--out", str(out)]) == 0
    assert "no bfloat16 section" in capsys.readouterr().out
    with pytest.raises(hardware.HardwareError, match=r"hardware field 'dtypes.bfloat16' = None .*calibrated: "
                                                       r"float32 at 128x64x8.*moelab calibrate"):
        hardware.get(str(out)).require_tile("bfloat16", (128, 64, 32))


@pytest.mark.parametrize("change, field", [
    (lambda d: d["bfloat16"].pop("gemm"), "bfloat16.gemm"),
    (lambda d: d["bfloat16"].update(gate=d["bfloat16"]["gate"][:2]), "bfloat16.gate"),
    (lambda d: d["bfloat16"].pop("tile"), "bfloat16.tile"),
    (lambda d: d.update(bfloat16=[]), "bfloat16"),
])
def test_a_bf16_section_lacking_what_a_fit_needs_names_the_field(tmp_path, capsys, change, field):
    raw = both_builds()
    change(raw)
    assert_calibrate_refuses(raw, field, tmp_path, capsys)


def test_another_tile_shape_is_refused(tmp_path):
    out, _ = calibrated(tmp_path, both_builds())
    with pytest.raises(hardware.HardwareError, match=r"'dtypes.bfloat16.tile' = '128x128x16' .*: 128x64x32"):
        hardware.get(str(out)).require_tile("bfloat16", (128, 128, 16))


@pytest.mark.parametrize("dtypes, field", [
    ({"float16": {"tile": [128, 64, 8]}}, "dtypes"),
    ({"bfloat16": {"tile": [128, 64]}}, "dtypes.bfloat16.tile"),
    ({"bfloat16": {"tile": [128, 64, 32], "warp_speed": 9}}, "dtypes.bfloat16.warp_speed"),
    ({"bfloat16": {"tile": [128, 64, 32], "gemm_fixed_ns": -1.0}}, "gemm_fixed_ns"),
    ([1], "dtypes"),
])
def test_a_bad_dtype_section_names_the_field(dtypes, field):
    with pytest.raises(hardware.HardwareError, match=f"hardware field '{field}'"):
        hardware.from_dict({"base": "h200-sxm", "dtypes": dtypes})


def test_compare_refuses_a_bf16_run_the_calibration_does_not_cover():
    runs = [r for r in compare.measured_runs(calibrated_only=False) if r.config.dtype == "bfloat16"]
    assert runs, "no bf16 run under measurements/gpu/"
    uncovered = [r for r in runs if compare.uncovered(r)]
    if not uncovered:
        pytest.skip("the committed calibration covers every bf16 run")
    with pytest.raises(compare.CompareError, match=r"compare option 'measured' = .*dtypes.bfloat16"):
        compare.compare(uncovered[0])


def test_the_bf16_combine_task_only_marks_the_arrival():
    """processor.cuh: only the float32 kernel weights a tile's rows in its combine task; the bf16
    kernel weights them in the final combine, which reads 2-byte rows and writes float32 y."""
    import numpy as np

    from reference.plan import COMBINE, GEMM0
    from sim import costs

    hw = hardware.PRESETS["h200-sxm"].replace(copy_ns_per_byte=0.05, reduce_ns_per_byte=0.1)
    kind, flops, nbytes = np.array([COMBINE, GEMM0]), np.array([1e6, 1e9]), np.array([1e6, 1e6])
    for dtype, weighted in (("float32", True), ("bfloat16", False)):
        cfg = presets.get("tiny").replace(precision=dtype)
        combine, gemm = costs.task_ns(hw, cfg, kind, flops, nbytes)
        assert (combine > hw.task_overhead_ns) == weighted, dtype
        assert gemm > hw.task_overhead_ns
    # rows read in whole rounds of 32 lanes x REDUCE_BATCH 16-byte loads (1024 bf16 values), y by its bytes
    assert costs.reduce_bytes(10, 2, 1024, 2) == 10 * (2 * 2 + 4) * 1024
    assert costs.reduce_bytes(10, 0.5, 1024, 2) == 10 * (0.5 * 2 + 4) * 1024  # a mean of kept rows
    assert costs.reduce_bytes(10, 2, 64, 2) == 10 * (2 * 2 * 1024 + 4 * 64)
