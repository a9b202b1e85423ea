"""benchmarks/calibrate_gpu.py without a GPU (`--from-raw`): the two builds' saved results become
one calibration file, float32 at the top level and the bf16 build under "bfloat16", which `moelab
calibrate` fits into both sections; the microbenchmark jobs take the bf16 tile from gpu/cases.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_sim_calibrate import TRUE_BF16, synthetic
from test_sim_calibrate_in_layer import _return_layer

from gpu import cases, microbench
from moelab.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_jobs_take_each_build_from_one_place():
    assert microbench.tile_options("float32", 2) == {"TILE_M": 128, "TILE_N": 64, "TILE_K": cases.FP32_TILE_K}
    m, n, k = cases.BF16_TILE
    bf16 = microbench.tile_options("bfloat16", 2)
    assert {key: bf16[key] for key in ("TILE_M", "TILE_N", "TILE_K", "MOE_BF16")} == \
        {"TILE_M": m, "TILE_N": n, "TILE_K": k, "MOE_BF16": 1}
    # the bench tile's blocks (one warpgroup, or two for 256 columns) are the microbenchmark's too
    assert bf16.get("BLOCK_WARPGROUPS", 1) == (2 if n == 256 else 1)
    assert {c["config"]["precision"] for c in microbench.job_cases(2, "bfloat16")} == {"bfloat16"}


def test_from_raw_writes_one_file_with_both_builds(tmp_path):
    for dtype, raw in (("float32", synthetic()), ("bfloat16", synthetic(t=TRUE_BF16, dtype="bfloat16"))):
        raw = {"gpu": "NVIDIA H200", "dtype": dtype, **{k: v for k, v in raw.items() if k != "meta"}}
        if dtype == "bfloat16":
            for k in microbench.BYTE_SECTIONS:
                raw.pop(k)
        else:  # the two-GPU job's layer of GEMM tasks by their tiles' source
            raw["in_layer"] = [_return_layer(200e3, 205e3, 190e3, 191e3)]
        (tmp_path / f"raw-{dtype}").mkdir()
        (tmp_path / f"raw-{dtype}" / "results.json").write_text(json.dumps(raw))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "calibrate_gpu.py"), "--from-raw", str(tmp_path),
                           "--out", str(tmp_path), "--commit", "abc"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "(float32)" in done.stdout and "(bfloat16)" in done.stdout
    assert "T=6144, 2 GPU(s): gemm1 of a peer's tile beyond own" in done.stdout
    doc = json.loads((tmp_path / "calibration-h200.json").read_text())
    assert doc["meta"]["commit"] == "abc" and doc["meta"]["gpu"] == "NVIDIA H200"
    assert "bfloat16" in doc["meta"]["producer"]
    assert "put" in doc and "put" not in doc["bfloat16"] and doc["bfloat16"]["tile"]["TILE_K"] == 32
    out = tmp_path / "calibrated.json"
    assert main(["calibrate", "--calibration", str(tmp_path / "calibration-h200.json"), "--out", str(out)]) == 0
    preset = json.loads(out.read_text())
    assert preset["dtypes"]["bfloat16"]["tile"] == [128, 64, 32]
    # the float32 job timed its stores to the peer, the bf16 job did not: one block's put rate
    # (GEMM1's 4 us beyond GEMM0's, less the fence's round trip, 2 x the ping-pong's 1.2 us)
    assert preset["return_store_ns_per_byte"] == pytest.approx(1600.0 / (100 * 64 * 4))
    assert preset["dtypes"]["bfloat16"]["return_store_ns_per_byte"] == preset["put_nvlink_ns_per_byte"]


def test_more_than_two_gpus_is_refused_naming_why():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "calibrate_gpu.py"), "--gpus", "4"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "--gpus 4: 1 or 2" in done.stderr


def test_a_job_that_dies_keeps_what_it_saved_and_says_it_failed(tmp_path, monkeypatch):
    import argparse
    import importlib.util

    from gpu import spawn

    spec = importlib.util.spec_from_file_location("calibrate_gpu", REPO / "benchmarks" / "calibrate_gpu.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)

    def dies(gpus, folder, **kwargs):  # rank 0 saved its puts, then a rank died
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({"put": [{"bytes": 1}]}))
        raise spawn.SpawnError("rank 2 exited with -6")

    monkeypatch.setattr(microbench, "collect", dies)
    args = argparse.Namespace(from_raw=None)
    got = driver.run_job(args, tmp_path, "float32", "raw-float32", 2, 10.0)
    assert got["put"] == [{"bytes": 1}] and got["failed"] == {"job": "rank 2 exited with -6"}


def test_each_jobs_configs_name_its_build():
    # a worker takes its build from its first config's GEMM precision: tf32x3 is float32 data
    from reference import Config

    for dtype in microbench.DTYPES:
        cfg = Config.from_dict(microbench.job_cases(2, dtype)[0]["config"])
        assert cfg.precision == dtype
    assert microbench.tile_options("tf32x3", 2)["MOE_TF32X3"] == 1
