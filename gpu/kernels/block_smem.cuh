// A block's dynamic shared memory, the same in the megakernel (moe.cu) and its calibration
// microbenchmarks (microbench.cu), so both reach the same occupancy: the gate and the tile GEMM
// take turns in one buffer of moelab_smem_bytes, a constant the launcher reads from the cubin
// (gpu/layout.py SMEM_SYMBOL) to set the kernel's limit, size the grid and launch.
#pragma once
#include "gate.cuh"
#include "processor.cuh"

#ifndef TILE_M
#error "compile with -DTILE_M=.. -DTILE_N=.. -DTILE_K=.."
#endif
#if MOE_WGMMA && !defined(GEMM_STAGES)
#error "compile the bf16 and tf32x3 kernels with -DGEMM_STAGES=.. (gpu/layout.py picks it)"
#endif

#if MOE_WGMMA
constexpr int GEMM_SMEM_BYTES = TensorCoreGemm<TILE_M, TILE_N, TILE_K>::SMEM_BYTES;
#elif MOE_TF32
constexpr int GEMM_SMEM_BYTES = Tf32TileGemm<TILE_M, TILE_N, TILE_K>::SMEM_BYTES;
#else
constexpr int GEMM_SMEM_BYTES = SimtTileGemm<TILE_M, TILE_N, TILE_K>::SMEM_FLOATS * 4;
#endif
constexpr int SMEM_BYTES = GEMM_SMEM_BYTES > GATE_BLOCK_SMEM_BYTES ? GEMM_SMEM_BYTES : GATE_BLOCK_SMEM_BYTES;
static_assert(SMEM_BYTES >= BLOCK_THREADS * (int)sizeof(int), "the dispatch's deal scans its row counts in it");
extern "C" __constant__ int moelab_smem_bytes = SMEM_BYTES;
