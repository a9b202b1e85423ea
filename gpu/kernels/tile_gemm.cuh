// The tile GEMM of a processor task: acc[BM x BN] = A[rows x K] . B[K x BN], float32 SIMT.
// 128 threads as 16 (rows) x 8 (columns); each thread holds a (BM/16) x (BN/8) register block.
// K is walked in BK-deep slices through two shared-memory stages: the next slice is loaded into
// registers while the current one is multiplied. Rows >= `rows` read as zero and warps whose rows
// are all past `rows` skip the arithmetic (short tiles cost less). The float32 kernel's GEMM; the
// bf16 kernel's is TcTileGemm below.
// (A cp.async 4-stage variant with row-major A tiles measured 8% slower per task on H100 at
// 247-255 registers, and slower on short tiles; this one stays until the tensor-core version.)
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

// The bf16 tile GEMM of a processor task: acc[BM x BN] (float32) = A[rows x K] . B[K x BN], both
// bf16, on tensor cores (mma.sync m16n8k16, fp32 accumulation). 4 warps stacked along M, each
// owning WM = BM/4 rows and all BN columns. K is walked in BK-deep slices staged in shared memory
// by cp.async, STAGES deep, so the next slices' loads are in flight while one is multiplied.
// Operand rows >= `rows` are zero-filled by the copy itself (no global read) and warps whose rows
// are all past `rows` skip the arithmetic. Accumulator element (mt, nt, q) is row
// mt*16 + lane/4 + 8*(q/2) of the warp's rows, column nt*8 + 2*(lane%4) + q%2.

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

template <int BM, int BN, int BK>
struct TcTileGemm {
  static constexpr int THREADS = 128, WARPS = 4, STAGES = 3;
  static constexpr int WM = BM / WARPS, MT = WM / 16, NT = BN / 8;
  // +8 bf16 (16 B) per row: the 8 rows one ldmatrix reads fall in 8 distinct 16-byte bank groups
  static constexpr int A_LD = BK + 8, B_LD = BN + 8;
  static constexpr int STAGE_ELEMS = BM * A_LD + BK * B_LD;
  static constexpr int SMEM_BYTES = STAGES * STAGE_ELEMS * 2;
  static constexpr int A_CHUNKS = BM * BK / 8, B_CHUNKS = BK * BN / 8;  // 16-byte copies per stage
  static constexpr int A_COPIES = (A_CHUNKS + THREADS - 1) / THREADS, B_COPIES = (B_CHUNKS + THREADS - 1) / THREADS;
  static_assert(WM % 16 == 0 && BN % 16 == 0 && BK % 16 == 0,
                "tensor-core tile shape: BM % 64, BN % 16 and BK % 16 must be 0");

  // A row-major (lda), written earlier in this launch by other blocks or peers: cp.async.cg reads
  // it from L2, never a stale L1 line. B row-major (ldb), the weights.
  __device__ static void run(const __nv_bfloat16* A, long long lda, int rows, const __nv_bfloat16* __restrict__ B,
                             long long ldb, int K, __nv_bfloat16* smem, float (&acc)[MT][NT][4]) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
    auto load = [&](int stage, int k0) {
      __nv_bfloat16* As = smem + stage * STAGE_ELEMS;
      __nv_bfloat16* Bs = As + BM * A_LD;
#pragma unroll
      for (int i = 0; i < A_COPIES; ++i) {
        const int v = tid + i * THREADS, m = v / (BK / 8), kc = v % (BK / 8);
        const bool in = m < rows;
        if (v < A_CHUNKS) cp_async16(As + m * A_LD + kc * 8, in ? A + m * lda + k0 + kc * 8 : A, in);
      }
#pragma unroll
      for (int i = 0; i < B_COPIES; ++i) {
        const int v = tid + i * THREADS, k = v / (BN / 8), nc = v % (BN / 8);
        if (v < B_CHUNKS) cp_async16(Bs + k * B_LD + nc * 8, B + (k0 + k) * ldb + nc * 8, true);
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
      const __nv_bfloat16* As = smem + (kt % STAGES) * STAGE_ELEMS;
      const __nv_bfloat16* Bs = As + BM * A_LD;
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        unsigned a[MT][4], b[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const __nv_bfloat16* at = As + (warp * WM + i * 16 + lane % 16) * A_LD + kk + (lane / 16) * 8;
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                       : "r"((unsigned)__cvta_generic_to_shared(at)));
        }
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          const __nv_bfloat16* bt = Bs + (kk + lane % 8 + ((lane / 8) % 2) * 8) * B_LD + j * 8 + (lane / 16) * 8;
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j + 1][0]), "=r"(b[j + 1][1])
                       : "r"((unsigned)__cvta_generic_to_shared(bt)));
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
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
