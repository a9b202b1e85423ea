"""The kernel compiles for sm_90 and device-links against NVSHMEM's device library (CI: nvcc 13,
nvidia-nvshmem-cu13 3.4.5 from the test extra; skipped only where nvcc itself is missing)."""

import pytest

from gpu import build

pytestmark = pytest.mark.skipif(build.nvcc_path() is None, reason="nvcc not installed")


def test_kernel_compiles_and_device_links(tmp_path):
    built = build.build({"TILE_M": 64, "TILE_N": 32, "TILE_K": 8}, cache=tmp_path)
    data = built.cubin.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert b"moelab_moe_fp32" in data
    assert b"nvshmem" in data  # the device library was linked in
    again = build.build({"TILE_M": 64, "TILE_N": 32, "TILE_K": 8}, cache=tmp_path)
    assert again.cached and again.cubin == built.cubin


def test_bf16_kernel_compiles_and_device_links(tmp_path):
    # the tensor-core tile GEMM at the bench's shape and at the checks' narrower ones
    for tile in ((128, 64, 32), (64, 32, 16)):
        opts = {"TILE_M": tile[0], "TILE_N": tile[1], "TILE_K": tile[2], "MOE_BF16": 1}
        data = build.build(opts, cache=tmp_path).cubin.read_bytes()
        assert data[:4] == b"\x7fELF" and b"moelab_moe_bf16" in data and b"nvshmem" in data


def test_tf32_kernel_compiles_and_device_links(tmp_path):
    # the TF32 tile GEMM at the bench's shape, the checks' narrower one and the wide variant
    for tile in ((128, 64, 16), (64, 32, 16), (128, 128, 8)):
        opts = {"TILE_M": tile[0], "TILE_N": tile[1], "TILE_K": tile[2], "MOE_TF32": 1}
        data = build.build(opts, cache=tmp_path).cubin.read_bytes()
        assert data[:4] == b"\x7fELF" and b"moelab_moe_tf32" in data and b"nvshmem" in data


def test_nvshmem_is_the_gpu_machines_version():
    assert build.nvshmem_version(build.nvshmem_dir()) == "3.4.5"
