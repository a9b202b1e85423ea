// The tile GEMM of a processor task: acc[BM x BN] = A[rows x K] . B[K x BN], float32 SIMT.
// 128 threads as 16 (rows) x 8 (columns); each thread holds a (BM/16) x (BN/8) register block.
// K is walked in BK-deep slices through two shared-memory stages: the next slice is loaded into
// registers while the current one is multiplied. Rows >= `rows` read as zero and warps whose rows
// are all past `rows` skip the arithmetic (short tiles cost less). The float32 kernel's GEMM; the
// bf16 kernel's is WgmmaTileGemm (tile_gemm_bf16.cuh), the tf32 option's Tf32TileGemm.
// (A cp.async 4-stage variant with row-major A tiles measured 8% slower per task on H100 at
// 247-255 registers, and slower on short tiles; this one stays until the tensor-core version.
// Splitting a short tile's k steps over its idle warps (2e21fdc, H100) took the 1K- and 2K-token
// layers 6% and 12% down but the rest 2-4% up, with 12 bytes of spills at 255 registers: a short
// task waits on its one slice of loads in flight, about 650 ns a slice, more than on idle warps.)
#pragma once
#include <cuda_bf16.h>

template <int BM, int BN, int BK>
struct SimtTileGemm {
  static constexpr int THREADS = 128, TY = 16, TX = 8;
  static constexpr int TM = BM / TY, TN = BN / TX;
  static constexpr int AS_LD = BM + 4;  // padding: the transposed A stores hit different banks
  static constexpr int STAGE = BK * AS_LD + BK * BN;
  static constexpr int SMEM_FLOATS = 2 * STAGE;
  static constexpr int A_VECS = BM * BK / 4, B_VECS = BK * BN / 4;
  static constexpr int A_LOADS = (A_VECS + THREADS - 1) / THREADS;
  static constexpr int B_LOADS = (B_VECS + THREADS - 1) / THREADS;
  static_assert(BM % TY == 0 && BN % TX == 0 && BK % 4 == 0 && BN % 4 == 0,
                "tile shape: BM % 16, BN % 8 and BK % 4 must be 0");

  __device__ static int row_of(int i) { return (threadIdx.x / TX) * TM + i; }
  __device__ static int col_of(int j) { return (threadIdx.x % TX) * TN + j; }

  // A row-major with leading dimension lda (operand rows may have been written by other blocks in
  // this launch: loaded around L1); B row-major with leading dimension ldb (weights: read-only).
  __device__ static void run(const float* A, long long lda, int rows, const float* __restrict__ B,
                             long long ldb, int K, float* smem, float (&acc)[TM][TN]) {
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
    float4 ra[A_LOADS], rb[B_LOADS];
    auto load = [&](int k0) {
#pragma unroll
      for (int i = 0; i < A_LOADS; ++i) {
        int v = tid + i * THREADS;
        if (v < A_VECS) {
          int m = v / (BK / 4), kq = v % (BK / 4);
          ra[i] = m < rows ? __ldcg(reinterpret_cast<const float4*>(A + m * lda + k0 + kq * 4))
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int i = 0; i < B_LOADS; ++i) {
        int v = tid + i * THREADS;
        if (v < B_VECS) {
          int k = v / (BN / 4), nq = v % (BN / 4);
          rb[i] = __ldg(reinterpret_cast<const float4*>(B + (k0 + k) * ldb + nq * 4));
        }
      }
    };
    auto store = [&](int buf) {
      float* As = smem + buf * STAGE;
      float* Bs = As + BK * AS_LD;
#pragma unroll
      for (int i = 0; i < A_LOADS; ++i) {
        int v = tid + i * THREADS;
        if (v < A_VECS) {
          int m = v / (BK / 4), kq = v % (BK / 4);
          As[(kq * 4 + 0) * AS_LD + m] = ra[i].x;
          As[(kq * 4 + 1) * AS_LD + m] = ra[i].y;
          As[(kq * 4 + 2) * AS_LD + m] = ra[i].z;
          As[(kq * 4 + 3) * AS_LD + m] = ra[i].w;
        }
      }
#pragma unroll
      for (int i = 0; i < B_LOADS; ++i) {
        int v = tid + i * THREADS;
        if (v < B_VECS) {
          int k = v / (BN / 4), nq = v % (BN / 4);
          *reinterpret_cast<float4*>(Bs + k * BN + nq * 4) = rb[i];
        }
      }
    };
    const bool active = ty * TM < rows;
    load(0);
    store(0);
    __syncthreads();
    for (int k0 = 0, buf = 0; k0 < K; k0 += BK, buf ^= 1) {
      const bool more = k0 + BK < K;
      if (more) load(k0 + BK);
      if (active) {
        const float* As = smem + buf * STAGE;
        const float* Bs = As + BK * AS_LD;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
          float a[TM], b[TN];
#pragma unroll
          for (int i = 0; i < TM; ++i) a[i] = As[k * AS_LD + ty * TM + i];
#pragma unroll
          for (int j = 0; j < TN; ++j) b[j] = Bs[k * BN + tx * TN + j];
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
      }
      if (more) store(buf ^ 1);
      __syncthreads();
    }
  }
};

// cp.async helpers, shared by the tensor-core tile GEMMs and the gate
// threadIdx.x read anew (volatile): the persistent task loop would otherwise keep every per-lane
// offset of the GEMM and its epilogue in registers across all tasks, and spill
__device__ __forceinline__ int thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
