"""The calibration microbenchmarks compile for sm_90 and device-link against NVSHMEM's device
library (CI: nvcc 13 and nvidia-nvshmem-cu13 from the test extra; skipped where nvcc is missing),
in both builds (float32, and bf16 at the bench's tile), and every kernel the host code launches is
in the cubin."""

import pytest

from gpu import build, microbench

pytestmark = pytest.mark.skipif(build.nvcc_path() is None, reason="nvcc not installed")


@pytest.mark.slow  # a minute a build on two cores
@pytest.mark.parametrize("dtype", microbench.DTYPES)
def test_microbench_compiles_and_device_links(cubin_cache, dtype):
    built = build.build(microbench.tile_options(dtype, 1), cache=cubin_cache, unit="microbench.cu")
    data = built.cubin.read_bytes()
    assert data[:4] == b"\x7fELF"
    for name in microbench.KERNELS:
        assert name.encode() in data
    assert b"nvshmem" in data
    assert built.cubin.name.startswith("microbench-")
