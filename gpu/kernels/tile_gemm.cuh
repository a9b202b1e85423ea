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


// The bf16 tile GEMM of a processor task: acc (float32) = A[rows x K] . B[K x BN], both bf16, on
// tensor cores (mma.sync m16n8k16, fp32 accumulation). The 4 warps tile the output 2 x 2, each
// owning WM = BM/2 rows and WN = BN/2 columns: per 16-deep k step a 64 x 64 warp tile loads 4 A
// and 4 B ldmatrix.x4 fragments for 32 mma, where 4 warps stacked along M (32 x 128 each) loaded
// 2 + 8 for the same work, and shared memory bandwidth is what the operand copies and the
// fragment loads share. K is walked in BK-deep slices that cp.async stages STAGES deep in the
// kernel's dynamic shared memory (gpu/layout.py picks STAGES from the room two blocks per SM
// leave): one barrier per slice, and the next 16-deep step's fragments are loaded while the
// current one multiplies, across the slice boundary too (two register sets, so BK % 32 == 0).
// Operand rows >= `rows` are zero-filled by the copy itself (no global read), and a warp's 16-row
// groups past `rows` skip their loads and mma (short tiles cost less). Accumulator element
// (mt, nt, q) is row mt*16 + lane/4 + 8*(q/2) of the warp's rows, column nt*8 + 2*(lane%4) + q%2
// of its columns.

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
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&lo)[2], unsigned (&hi)[2], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(lo[0]), "=r"(lo[1]), "=r"(hi[0]), "=r"(hi[1]) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int BM, int BN, int BK, int STAGES>
struct TcTileGemm {
  static constexpr int THREADS = 128, WARPS_M = 2, WARPS_N = 2;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MT = WM / 16, NT = WN / 8, KS = BK / 16;
  // +8 bf16 (16 B) per row: the 8 rows one ldmatrix reads fall in 8 distinct 16-byte bank groups
  static constexpr int A_LD = BK + 8, B_LD = BN + 8;
  static constexpr int A_BYTES = BM * A_LD * 2, STAGE_BYTES = A_BYTES + BK * B_LD * 2;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
  // 16-byte chunks per operand row, and rows one pass of the 128 threads copies
  static constexpr int CA = BK / 8, RA = THREADS / CA, CB = BN / 8, RB = THREADS / CB;
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 32 == 0 && STAGES >= 2,
                "tensor-core tile shape: BM % 32, BN % 32 and BK % 32 must be 0, at least 2 stages");
  static_assert(THREADS % CA == 0 && THREADS % CB == 0 && BM % RA == 0 && BK % RB == 0,
                "tensor-core tile shape: BN and BK powers of 2 (the threads split a slice's rows evenly)");

  struct Frags {
    unsigned a[MT][4], b[NT][2];
  };

  // A row-major (lda), written earlier in this launch by other blocks or peers: cp.async.cg reads
  // it from L2, never a stale L1 line. B row-major (ldb), the weights.
  __device__ static void run(const __nv_bfloat16* A, long long lda, int rows, const __nv_bfloat16* __restrict__ B,
                             long long ldb, int K, void* smem, float (&acc)[MT][NT][4]) {
    const int tid = thread_index(), lane = tid % 32, warp = tid / 32;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int live = rows - wm * WM;  // rows of this warp's band that exist (none if <= 0)
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
    // thread tid copies 16-byte chunk tid % CA of the A rows tid / CA + i * RA and chunk tid % CB of
    // the B rows tid / CB + i * RB of each slice
    const int am = tid / CA;
    const __nv_bfloat16* a_src = A + am * lda + (tid % CA) * 8;
    const __nv_bfloat16* b_src = B + (tid / CB) * ldb + (tid % CB) * 8;
    const unsigned a_dst = (am * A_LD + (tid % CA) * 8) * 2, b_dst = A_BYTES + ((tid / CB) * B_LD + (tid % CB) * 8) * 2;
    auto load = [&](int stage, int kt) {
      const unsigned s = base + stage * STAGE_BYTES;
      const __nv_bfloat16* a = a_src + kt * BK;
#pragma unroll
      for (int i = 0; i < BM / RA; ++i, a += RA * lda) {
        const bool in = am + i * RA < rows;
        cp_async16(s + a_dst + i * RA * A_LD * 2, in ? a : A, in);
      }
      const __nv_bfloat16* b = b_src + (long long)kt * BK * ldb;
#pragma unroll
      for (int i = 0; i < BK / RB; ++i, b += RB * ldb) cp_async16(s + b_dst + i * RB * B_LD * 2, b, true);
    };
    // this lane's ldmatrix row addresses: A rows (lane % 16) at k half lane / 16; B k rows
    // (lane % 16) at column half lane / 16 (x4.trans: two 8-column tiles of k 0-7 and 8-15)
    const unsigned a_lane = ((wm * WM + lane % 16) * A_LD + (lane / 16) * 8) * 2;
    const unsigned b_lane = A_BYTES + ((lane % 16) * B_LD + wn * WN + (lane / 16) * 8) * 2;
    auto fragments = [&](int stage, int kk, Frags& f) {
      const unsigned s = base + stage * STAGE_BYTES;
#pragma unroll
      for (int i = 0; i < MT; ++i)
        if (i * 16 < live) ldmatrix_x4(f.a[i], s + a_lane + (i * 16 * A_LD + kk) * 2);
      if (live > 0)
#pragma unroll
        for (int j = 0; j < NT; j += 2) ldmatrix_x4_trans(f.b[j], f.b[j + 1], s + b_lane + (kk * B_LD + j * 8) * 2);
    };
    const int KT = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load(s, s);
      cp_async_commit();  // empty groups keep the count uniform, so wait_group<STAGES-2> is exact
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    Frags f[2];
    fragments(0, 0, f[0]);
    int rd = 0, wr = STAGES - 1;  // the stage being multiplied, the stage the next copy fills
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        if (ks == 0) {
          // slice kt - 1's stage is free: every warp loaded its last fragments before the barrier
          if (kt + STAGES - 1 < KT) load(wr, kt + STAGES - 1);
          cp_async_commit();
          wr = wr + 1 == STAGES ? 0 : wr + 1;
        }
        if (ks == KS - 1) {
          cp_async_wait<STAGES - 2>();
          __syncthreads();  // slice kt + 1 has landed for all, and every warp has read all of slice kt
          rd = rd + 1 == STAGES ? 0 : rd + 1;
        }
        if (ks < KS - 1 || kt + 1 < KT) fragments(rd, ((ks + 1) % KS) * 16, f[(ks + 1) % 2]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
          if (i * 16 < live)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_bf16(acc[i][j], f[ks % 2].a[i], f[ks % 2].b[j]);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next task's first copies may overwrite any stage
  }

  // f(row, col, v0, v1) for each pair of adjacent output columns this thread holds (rows < `rows`)
  template <class F>
  __device__ static void epilogue(const float (&acc)[MT][NT][4], int rows, F f) {
    const int tid = thread_index(), lane = tid % 32, warp = tid / 32;
    const int r0 = (warp % WARPS_M) * WM + lane / 4, c0 = (warp / WARPS_M) * WN + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + i * 16 + 8 * h;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < NT; ++j) f(r, c0 + j * 8, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
  }
};
