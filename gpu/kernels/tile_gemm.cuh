// The tile GEMM of a processor task: acc[BM x BN] = A[rows x K] . B[K x BN], float32 SIMT: the
// float32 kernel's (the bf16 and tf32x3 kernels' is WgmmaTileGemm, tile_gemm_wgmma.cuh; the tf32
// option's Tf32TileGemm).
// 128 threads as 16 (rows) x 8 (columns); each thread holds a (BM/16) x (BN/8) register block, its
// columns in groups of four spaced 32 apart, so the eight threads that share a 16-byte shared-memory
// read of B touch 128 contiguous bytes (one wavefront, no bank conflict), and its rows in groups of
// four spaced 64 apart (one 16-byte read of A each), so a tile of 64 rows or fewer keeps every warp
// busy on the first group alone and skips the second.
// K is walked in BK-deep slices. The weights (B, streamed from HBM: the long wait) come through
// B_STAGES cp.async stages, B_STAGES - 1 slices ahead of the multiply; A (the tokens, in L2) is
// loaded one slice ahead into registers and stored transposed, so a thread's rows are one 16-byte
// read per k. Rows >= `rows` are neither loaded (the loads are predicated: a zero default would make
// ptxas serialize them) nor read (stored as zero); threads whose rows are all past `rows` skip the
// arithmetic. The measurements behind this shape and the variants it beat: docs/notes/tile-gemm.md.
#pragma once
#include <cuda_bf16.h>

// cp.async helpers, shared by the tile GEMMs and the gate
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// A float32 rounded to TF32 as cvt.rna.tf32.f32 rounds (nearest, ties away from zero;
// reference.numerics.round_tf32 emulates it bit for bit), for the tf32 and tf32x3 GEMMs
// (sm_90 SASS: finite values get 0x1000 added to their bits, Inf and NaN pass as they are; the
// tensor core ignores the 13 low bits, which makes the sum a round to nearest, ties away)
__device__ __forceinline__ unsigned to_tf32(float v) {
  unsigned t;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(t) : "f"(v));
  return t;
}

template <int BM, int BN, int BK>
struct SimtTileGemm {
  static constexpr int THREADS = 128, TY = 16, TX = 8;
  static constexpr int TM = BM / TY, TN = BN / TX;
  static constexpr int CG = TN % 4 == 0 ? 4 : TN;  // a thread's columns per group (16-byte reads where 4)
  static constexpr int RG = TM % 4 == 0 ? 4 : TM;  // a thread's rows per group (16-byte reads where 4)
  static constexpr int ROW_GROUPS = TM / RG;
  static constexpr int B_STAGES = 4;
  static constexpr int AS_LD = BM + 4;  // padding: the transposed A stores hit different banks
  static constexpr int A_STAGE = BK * AS_LD, B_STAGE = BK * BN;
  static constexpr int SMEM_FLOATS = 2 * A_STAGE + B_STAGES * B_STAGE;
  static constexpr int A_VECS = BM * BK / 4, B_VECS = BK * BN / 4;
  static constexpr int A_LOADS = (A_VECS + THREADS - 1) / THREADS;
  static constexpr int B_COPIES = (B_VECS + THREADS - 1) / THREADS;
  static_assert(BM % TY == 0 && BN % TX == 0 && BK % 4 == 0 && BN % 4 == 0,
                "tile shape: BM % 16, BN % 8 and BK % 4 must be 0");

  // row of a thread's i-th output in the tile: the multiply's A reads and the epilogue's stores agree
  __device__ static int row_in_tile(int ty, int i) { return (i / RG) * (TY * RG) + ty * RG + i % RG; }
  __device__ static int row_of(int i) { return row_in_tile(threadIdx.x / TX, i); }

  // slice k-steps of the thread's first `GROUPS` row groups (the rest stay zero)
  template <int GROUPS>
  __device__ static void multiply(const float* a_s, const float* b_s, int tx, int ty, float (&acc)[TM][TN]) {
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[GROUPS * RG], b[TN];
#pragma unroll
      for (int i = 0; i < GROUPS * RG; ++i) a[i] = a_s[k * AS_LD + row_in_tile(ty, i)];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = b_s[k * BN + col_in_tile(tx, j)];
#pragma unroll
      for (int i = 0; i < GROUPS * RG; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
  // column of a thread's j-th output in the tile: the multiply's B reads and the epilogue's stores agree
  __device__ static int col_in_tile(int tx, int j) { return (j / CG) * (TX * CG) + tx * CG + j % CG; }
  __device__ static int col_of(int j) { return col_in_tile(threadIdx.x % TX, j); }

  // A row-major with leading dimension lda (operand rows may have been written by other blocks in
  // this launch: loaded around L1); B row-major with leading dimension ldb (weights: read-only).
  __device__ static void run(const float* A, long long lda, int rows, const float* __restrict__ B,
                             long long ldb, int K, float* smem, float (&acc)[TM][TN]) {
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int slices = K / BK;
    float* As = smem;
    float* Bs = smem + 2 * A_STAGE;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
    auto copy_b = [&](int s) {  // slice s of the weights into its stage; a commit group even when empty
      if (s < slices) {
        float* dst = Bs + (s % B_STAGES) * B_STAGE;
#pragma unroll
        for (int i = 0; i < B_COPIES; ++i) {
          int v = tid + i * THREADS;
          if (v < B_VECS) {
            int k = v / (BN / 4), nq = v % (BN / 4);
            cp_async16(smem_addr(dst + k * BN + nq * 4), B + (long long)(s * BK + k) * ldb + nq * 4, true);
          }
        }
      }
      cp_async_commit();
    };
    float4 ra[A_LOADS];  // a row past `rows` is neither loaded nor read (stored as zero)
    auto load_a = [&](int s) {
#pragma unroll
      for (int i = 0; i < A_LOADS; ++i) {
        int v = tid + i * THREADS;
        if (v < A_VECS) {
          int m = v / (BK / 4), kq = v % (BK / 4);
          if (m < rows) ra[i] = __ldcg(reinterpret_cast<const float4*>(A + m * lda + s * BK + kq * 4));
        }
      }
    };
    auto store_a = [&](int buf) {
      float* dst = As + buf * A_STAGE;
#pragma unroll
      for (int i = 0; i < A_LOADS; ++i) {
        int v = tid + i * THREADS;
        if (v < A_VECS) {
          int m = v / (BK / 4), kq = v % (BK / 4);
          const bool in = m < rows;
          dst[(kq * 4 + 0) * AS_LD + m] = in ? ra[i].x : 0.f;
          dst[(kq * 4 + 1) * AS_LD + m] = in ? ra[i].y : 0.f;
          dst[(kq * 4 + 2) * AS_LD + m] = in ? ra[i].z : 0.f;
          dst[(kq * 4 + 3) * AS_LD + m] = in ? ra[i].w : 0.f;
        }
      }
    };
    const bool active = ty * RG < rows, first_group_only = rows <= TY * RG;
#pragma unroll
    for (int s = 0; s < B_STAGES - 1; ++s) copy_b(s);
    load_a(0);
    store_a(0);
    for (int s = 0; s < slices; ++s) {
      // slice s's weights have landed (this thread's copies), then every thread's copies and A
      // stores are visible, and every thread is done with the stages this iteration overwrites
      cp_async_wait<B_STAGES - 2>();
      __syncthreads();
      copy_b(s + B_STAGES - 1);
      const bool more = s + 1 < slices;
      if (more) load_a(s + 1);
      if (active) {
        const float* a_s = As + (s & 1) * A_STAGE;
        const float* b_s = Bs + (s % B_STAGES) * B_STAGE;
        if (ROW_GROUPS > 1 && first_group_only)
          multiply<1>(a_s, b_s, tx, ty, acc);
        else
          multiply<ROW_GROUPS>(a_s, b_s, tx, ty, acc);
      }
      if (more) store_a((s + 1) & 1);
    }
    cp_async_wait<0>();  // the empty tail groups, so no copy is outstanding when the caller reuses smem
    __syncthreads();
  }
};

// threadIdx.x read anew (volatile): the persistent task loop would otherwise keep every per-lane
// offset of the GEMM and its epilogue in registers across all tasks, and spill
__device__ __forceinline__ int thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
