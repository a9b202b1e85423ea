"""The kernel compiles for sm_90 and device-links against NVSHMEM's device library (CI: nvcc 13,
nvidia-nvshmem-cu13 3.4.5 from the test extra; skipped only where nvcc itself is missing). The
fast suite builds the float32 kernel once; every other build (a minute each on two cores) is `slow`."""

import subprocess

import pytest

from gpu import build, cases, layout
from reference import presets

pytestmark = pytest.mark.skipif(build.nvcc_path() is None, reason="nvcc not installed")


FLOAT32_SMALL = {"TILE_M": 64, "TILE_N": 32, "TILE_K": 8}


def test_kernel_compiles_and_device_links(cubin_cache):
    built = build.build(FLOAT32_SMALL, cache=cubin_cache)
    data = built.cubin.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert b"moelab_moe_fp32" in data
    assert b"nvshmem" in data  # the device library was linked in
    again = build.build(FLOAT32_SMALL, cache=cubin_cache)
    assert again.cached and again.cubin == built.cubin


@pytest.mark.slow
def test_bf16_kernel_compiles_and_device_links(cubin_cache):
    # the tensor-core tile GEMM at the bench's shape (128 x 256: two warpgroups, one block per SM,
    # 4 stages) and at the checks' narrow one (the most stages, 8): the cubin's shared memory per
    # block is the GEMM's stages and their alignment room, as layout sizes them (more than the
    # gate's 68 KiB a warpgroup)
    flash = presets.get("flashmoe").replace(precision="bfloat16")
    smem = {}
    for tile in (cases.BF16_TILE, (64, 32, 64)):
        cfg = flash.replace(tile_m=tile[0], tile_n=tile[1], tile_k=tile[2])
        cubin = build.build(layout.compile_options(cfg), cache=cubin_cache).cubin
        data = cubin.read_bytes()
        assert data[:4] == b"\x7fELF" and b"moelab_moe_bf16" in data and b"nvshmem" in data
        smem[tile] = (build.cubin_constant(cubin, layout.SMEM_SYMBOL), layout.wgmma_smem_bytes(cfg))
    got, gemm = smem[cases.BF16_TILE]
    assert got == gemm == 4 * 2 * (128 + 256) * 64 + 1024
    got, gemm = smem[(64, 32, 64)]
    assert got == gemm == layout.BF16_MAX_STAGES * 2 * (64 + 32) * 64 + 1024


@pytest.mark.slow
def test_tf32x3_kernel_compiles_and_device_links(cubin_cache):
    # the split TF32 GEMM at the bench's tile (two warpgroups, one block per SM): the cubin's shared
    # memory per block is its 5 stages, the lo parts' 2 copies and the alignment room
    cfg = presets.get("flashmoe").replace(precision="tf32x3", tile_m=cases.TF32X3_TILE[0], tile_n=cases.TF32X3_TILE[1],
                                          tile_k=cases.TF32X3_TILE[2])
    cubin = build.build(layout.compile_options(cfg), cache=cubin_cache).cubin
    data = cubin.read_bytes()
    assert data[:4] == b"\x7fELF" and b"moelab_moe_tf32x3" in data and b"nvshmem" in data
    got = build.cubin_constant(cubin, layout.SMEM_SYMBOL)
    assert got == layout.wgmma_smem_bytes(cfg) == (5 + 2) * 4 * (128 + 128) * 32 + 1024


def test_cubin_constant_names_a_missing_symbol(cubin_cache):
    cubin = build.build(FLOAT32_SMALL, cache=cubin_cache).cubin
    # float32 at a small tile: the gate's three stages of 32 tokens x 64 deep (rows padded to 68) and
    # 64 deep x 64 experts (rows padded to 72), float32, more than the tile GEMM's
    assert build.cubin_constant(cubin, layout.SMEM_SYMBOL) == 3 * (32 * 68 * 4 + 64 * 72 * 4)
    with pytest.raises(build.BuildError, match="no constant moelab_nothing"):
        build.cubin_constant(cubin, "moelab_nothing")


@pytest.mark.slow
def test_tf32_kernel_compiles_and_device_links(cubin_cache):
    # the TF32 tile GEMM at the bench's shape, the checks' narrower one and the wide variant
    for tile in ((128, 64, 16), (64, 32, 16), (128, 128, 8)):
        opts = {"TILE_M": tile[0], "TILE_N": tile[1], "TILE_K": tile[2], "MOE_TF32": 1}
        data = build.build(opts, cache=cubin_cache).cubin.read_bytes()
        assert data[:4] == b"\x7fELF" and b"moelab_moe_tf32" in data and b"nvshmem" in data


def test_nvshmem_is_the_gpu_machines_version():
    assert build.nvshmem_version(build.nvshmem_dir()) == "3.4.5"


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["moe.cu", "microbench.cu"])
def test_the_bf16_tasks_wgmmas_stay_asynchronous(tmp_path, unit):
    """ptxas serializes a function's wgmmas where it calls a subroutine (C7509), and it makes a
    64-bit division one: with the next task's expert index worked out as a 64-bit remainder inside
    gemm_task every bf16 layer ran 11-32% slower on one H200. The bench tile's build of
    the megakernel and of its microbenchmarks."""
    options = layout.compile_options(cases.in_dtype(presets.get("flashmoe"), "bfloat16"))
    compile_cmd = build.nvcc_commands(build.nvcc_path(), build.ARCH, options, build.nvshmem_dir(),
                                      tmp_path / "k.o", tmp_path / "k.cubin", unit=unit)[0]
    done = subprocess.run([*compile_cmd, "-Xptxas", "-v"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "gemm_task" in done.stderr  # ptxas reported on the task function
    assert "C7509" not in done.stderr, [line for line in done.stderr.splitlines() if "C7509" in line]
