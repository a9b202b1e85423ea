"""benchmarks/weight_stream.py: the weight-stream benchmark compiles for sm_90a, its runner reads
the binary's JSON lines and refuses a failed run, and the committed measurements bound the bf16
kernel's tasks that load their weight slices alone."""

import json
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import weight_stream  # noqa: E402
from gpu import build  # noqa: E402
from sim.trace import Trace  # noqa: E402

MEASURED = Path(__file__).resolve().parent.parent / "measurements" / "gpu"


def _fake_binary(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.skipif(build.nvcc_path() is None, reason="nvcc not installed")
def test_the_benchmark_compiles_for_hopper(tmp_path):
    binary = weight_stream.compile_binary(build.nvcc_path(), tmp_path / "ws")
    assert binary.stat().st_size > 0


def test_the_runner_reads_the_header_and_each_variant(tmp_path):
    head = {"gpu": "NVIDIA H200", "sms": 132, "memcpy_read_write_gbps": 4200.0, "tasks": 2048, "task_bytes": 1 << 20,
            "stages": 4, "multiply_ns": 920}
    variant = {"a": True, "layout": "k-major", "multiply_ns": 920, "ms": 0.55, "weight_gbps": 3900.0,
               "us_per_task": 35.4}
    binary = _fake_binary(tmp_path, f"echo '{json.dumps(head)}'\necho '{json.dumps(variant)}'\n")
    got_head, got = weight_stream.run(binary, 920)
    assert got_head == head and got == [variant]
    text = weight_stream.table(got_head, got)
    # 2048 tasks of 2 x 128 x 256 x 2048 FLOPs in 0.55 ms: 500 TFLOP/s at best
    assert "35.4" in text and " 500" in text and "A + k-major weights, 920 ns sleep a slice" in text


def test_a_failed_run_is_an_error_with_its_message(tmp_path):
    binary = _fake_binary(tmp_path, "echo 'cudaMalloc failed' >&2\nexit 1\n")
    with pytest.raises(weight_stream.StreamError, match="cudaMalloc failed"):
        weight_stream.run(binary, 0)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_no_weight_bound_task_beats_the_stream_of_its_slices(gpu):
    """The 128-expert bf16 layer on one GPU: each task's weight slice is its tile's alone, so its
    median task takes at least the kernel's ring streaming the same slices with a stand-in for
    the multiply (both measured on that GPU)."""
    path = MEASURED / f"{gpu}x1-weight-stream.json"
    if not path.exists():
        pytest.skip(f"{path.name} not measured")
    ring = json.loads(path.read_text())
    kernel_like = next(v for v in ring["variants"] if v["a"] and v["layout"] == "k-major" and v["multiply_ns"])
    # the one-GPU runs of the machines that measured the GPU (h100x2-, h200x2-, h200x4-)
    runs = sorted(MEASURED.glob(f"{gpu}x*-trace-flashmoe-experts-128-bf16-p1.npz"))
    assert runs, f"no one-GPU 128-expert bf16 run of the {gpu}"
    for run in runs:
        trace = Trace.load(run)
        for kind in ("gemm0", "gemm1"):
            tasks = trace.where(role="processor", kind=kind)
            assert np.median(tasks["end"] - tasks["start"]) / 1e3 >= kernel_like["us_per_task"], (run.name, kind)
