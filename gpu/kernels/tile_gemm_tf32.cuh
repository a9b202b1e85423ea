// The TF32 tile GEMM of a processor task (the kernel built with -DMOE_TF32=1): acc[BM x BN]
// (float32) = A[rows x K] . B[K x BN], both float32 in memory, on tensor cores (mma.sync m16n8k8
// .tf32, fp32 accumulation). Every operand is rounded to TF32 by cvt.rna.tf32.f32 (nearest, ties
// away from zero; reference.numerics.round_tf32 emulates it bit for bit) as it is read into a
// fragment, so the float32 data in memory stays as stored. 4 warps stacked along M, each owning
// WM = BM/4 rows and all BN columns. K is walked in BK-deep float slices staged in shared memory
// by cp.async (tile_gemm.cuh's copy helpers), STAGES deep. Operand rows >= `rows` are zero-filled by
// the copy itself and warps whose rows are all past `rows` skip the arithmetic. Accumulator
// element (mt, nt, q) is row mt*16 + lane/4 + 8*(q/2) of the warp's rows, column
// nt*8 + 2*(lane%4) + q%2 (the m16n8k8 C fragment).
#pragma once
#include "tile_gemm.cuh"

template <int BM, int BN, int BK>
struct Tf32TileGemm {
  static constexpr int THREADS = 128, WARPS = 4, STAGES = 3;
  static constexpr int WM = BM / WARPS, MT = WM / 16, NT = BN / 8;
  using Acc = float[MT][NT][4];
  // Padding in floats, so that a fragment read (lane reads row lane/4, column lane%4 of an 8 x 4
  // block) hits 32 distinct banks: A rows start A_LD = 4 (mod 8) banks apart, B rows an odd
  // multiple of 8 banks apart.
  static constexpr int A_LD = BK + 4, B_LD = (BN / 8) % 2 ? BN : BN + 8;
  static constexpr int STAGE_FLOATS = BM * A_LD + BK * B_LD;
  static constexpr int SMEM_BYTES = STAGES * STAGE_FLOATS * 4;
  // 16-byte copies: a slice's rows of A (of B) are split over the threads A_STEP (B_STEP) rows at a time
  static constexpr int A_STEP = THREADS / (BK / 4), B_STEP = THREADS / (BN / 4);
  static constexpr int B_COPIES = (BK + B_STEP - 1) / B_STEP;
  static_assert(WM % 16 == 0 && BN % 8 == 0 && BK % 8 == 0 && THREADS % (BK / 4) == 0 && THREADS % (BN / 4) == 0,
                "TF32 tile shape: BM % 64 == 0, BN and BK powers of two from 8 to 512");

  // A row-major (lda), written earlier in this launch by other blocks or peers: cp.async.cg reads
  // it from L2, never a stale L1 line. B row-major (ldb), the weights.
  __device__ static void run(const float* A, long long lda, int rows, const float* __restrict__ B, long long ldb,
                             int K, void* smem_raw, Acc& acc) {
    float* smem = static_cast<float*>(smem_raw);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
    // Each thread copies the same 16-byte column of rows r0, r0 + A_STEP, .. of A (and of B) in
    // every slice: four 32-bit offsets live across the K loop instead of a 64-bit pointer per copy,
    // which made the 128 x 64 x 16 kernel spill (gpu/layout.py keeps BM x lda below 2^31).
    const int a_row = tid / (BK / 4), a_col = tid % (BK / 4) * 4, b_row = tid / (BN / 4), b_col = tid % (BN / 4) * 4;
    const int a_off = a_row * (int)lda + a_col, a_step = A_STEP * (int)lda;
    const int b_off = b_row * (int)ldb + b_col, b_step = B_STEP * (int)ldb;
    auto load = [&](int stage, int k0) {
      float* As = smem + stage * STAGE_FLOATS;
      float* Bs = As + BM * A_LD;
      const float* Ak = A + k0;
      const float* Bk = B + (long long)k0 * ldb;
#pragma unroll
      for (int i = 0; i < BM / A_STEP; ++i) {
        const int m = a_row + i * A_STEP;
        cp_async16(smem_addr(As + m * A_LD + a_col), m < rows ? Ak + (a_off + i * a_step) : A, m < rows);
      }
#pragma unroll
      for (int i = 0; i < B_COPIES; ++i) {
        const int k = b_row + i * B_STEP;
        if (k < BK) cp_async16(smem_addr(Bs + k * B_LD + b_col), Bk + (b_off + i * b_step), true);
      }
    };
    const int KT = K / BK;
    const bool active = warp * WM < rows;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load(s, s * BK);
      cp_async_commit();  // empty groups keep the count uniform, so wait_group<STAGES-2> is exact
    }
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // slice kt is visible to all; every warp is done with slice kt-1's stage
      if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, (kt + STAGES - 1) * BK);
      cp_async_commit();
      if (!active) continue;
      const float* As = smem + (kt % STAGES) * STAGE_FLOATS + (warp * WM + g) * A_LD + t;
      const float* Bs = smem + (kt % STAGES) * STAGE_FLOATS + BM * A_LD + t * B_LD + g;
#pragma unroll
      for (int kk = 0; kk < BK; kk += 8) {
        unsigned a[MT][4], b[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const float* at = As + i * 16 * A_LD + kk;
          a[i][0] = to_tf32(at[0]);
          a[i][1] = to_tf32(at[8 * A_LD]);
          a[i][2] = to_tf32(at[4]);
          a[i][3] = to_tf32(at[8 * A_LD + 4]);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float* bt = Bs + kk * B_LD + j * 8;
          b[j][0] = to_tf32(bt[0]);
          b[j][1] = to_tf32(bt[4 * B_LD]);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            asm volatile(
                "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};"
                : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next task's first copies may overwrite any stage
  }

  // f(row, col, v0, v1) for each pair of adjacent output columns this thread holds (rows < `rows`)
  template <class F>
  __device__ static void epilogue(const float (&acc)[MT][NT][4], int rows, F f) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp * WM + i * 16 + lane / 4 + 8 * h;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < NT; ++j) f(r, j * 8 + 2 * (lane % 4), acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
  }
};
