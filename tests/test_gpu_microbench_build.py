"""The calibration microbenchmarks compile for sm_90 and device-link against NVSHMEM's device
library (CI: nvcc 13 and nvidia-nvshmem-cu13 from the test extra; skipped where nvcc is missing),
and every kernel the host code launches is in the cubin."""

import pytest

from gpu import build, microbench

pytestmark = pytest.mark.skipif(build.nvcc_path() is None, reason="nvcc not installed")


def test_microbench_compiles_and_device_links(tmp_path):
    built = build.build({"TILE_M": 128, "TILE_N": 64, "TILE_K": 8}, cache=tmp_path, unit="microbench.cu")
    data = built.cubin.read_bytes()
    assert data[:4] == b"\x7fELF"
    for name in microbench.KERNELS:
        assert name.encode() in data
    assert b"nvshmem" in data
    assert built.cubin.name.startswith("microbench-")
