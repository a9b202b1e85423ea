// The warpgroup tile GEMM of a processor task: acc (float32) = A[rows x K] . B^T, with A row-major
// (K contiguous) and B given as its BN x K transpose (the expert weights are kept K-major for it,
// params.cuh), on Hopper's warpgroup tensor cores, for two kinds of operands (Operands below): bf16
// as stored (the bf16 kernel), or float32 split into TF32 parts, three products per pair (3xTF32,
// the tf32x3 kernel: float32's accuracy at tensor-core rates).
// Each of the block's WGS warpgroups takes a band of the tile's columns (BN / WGS of them, all BM
// rows) or, where a warpgroup's registers cannot hold all the rows of half the columns, a band of 64
// rows (all BN columns); each 16-deep k step is one wgmma.m64nNk16 per 64 rows and 128 columns (or
// fewer) of its band, both operands read straight from shared memory. Why two warpgroups on the
// 128 x 256 bench tile: they read each A slice once for both (docs/notes/tile-gemm.md).
// K is walked in slices 128 bytes deep (64 bf16 or 32 floats: one swizzle line per operand row)
// that the tensor memory accelerator (TMA) brings into STAGES stages (gpu/layout.py picks STAGES
// from the room a block's share of the SM leaves), AHEAD slices ahead of the wgmmas: one thread asks
// for a slice's boxes (64 A rows each, BN weight rows) from the operands' tensor maps (gpu/tma.py)
// and the stage's mbarrier counts its bytes in; every thread waits on that barrier. Slice kt's
// wgmmas are committed as one group and run on while the wgmmas of slice kt - 1 are waited for,
// whose stage then takes the next slice (bf16; tf32x3: split_slices). The stages' barriers are set
// once per block, their phases carried from task to task, and a task's first AHEAD slices are asked
// for as the task before it ends (prime), so they land during its bookkeeping.
// The TMA writes wgmma's 128-byte-swizzled K-major layout: 8-row groups of 1024 bytes, 16-byte chunk
// c of row r at chunk c ^ (r % 8) of its 128-byte line, so the 8 rows a tensor-core read takes at
// once fall in 8 distinct bank groups. Only the 64-row blocks of A that hold a row are copied and
// multiplied (short tiles cost less); rows past `rows` inside one (or past the operand's end, which
// the TMA fills with zeros) compute garbage that the epilogue never stores (a row of the product
// depends on that row of A only).
// Accumulator element q of 8-column group j of wgmma n of 64-row block mb is row mb*64 + 16*warp +
// lane/4 + 8*(q/2), column 128n + 8j + 2*(lane%4) + q%2 (wgmma's D fragment; warp within the
// warpgroup, rows and columns from its band's first).
#pragma once
#include <stdint.h>
#include "common.cuh"
#include "tile_gemm.cuh"

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// shared memory written through the generic proxy (the gate's phase) before the TMA (async proxy) writes it
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// shared-memory matrix descriptor, 128-byte swizzle, K-major: 8-row groups 1024 bytes apart (the
// stride offset; the leading one is unused when a k step stays inside the 128-byte line)
__device__ __forceinline__ uint64_t wgmma_desc(unsigned addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | 1ull << 16 | (uint64_t)(1024 >> 4) << 32 | 1ull << 62;
}

// wgmma's accumulator operands, D[64 x N] as N / 2 floats a thread: their places in the asm string
// and their constraints, each size the one before it and as many more
#define WGMMA_D16 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WGMMA_D16_OUT(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WGMMA_D32 WGMMA_D16 ", " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_D32_OUT(d) WGMMA_D16_OUT(d), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_D64 WGMMA_D32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_D64_OUT(d) WGMMA_D32_OUT(d), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D[64 x N] += A[64 x 16] . B[N x 16]^T, both operands bf16 in shared memory (descriptors, K-major)
template <int N>
struct Wgmma;
template <>
struct Wgmma<32> {
  __device__ static void mma(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" WGMMA_D16
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D16_OUT(d)
                 : "l"(a), "l"(b));
  }
};
template <>
struct Wgmma<64> {
  __device__ static void mma(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_D32
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D32_OUT(d)
                 : "l"(a), "l"(b));
  }
};
template <>
struct Wgmma<128> {
  __device__ static void mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_D64
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D64_OUT(d)
                 : "l"(a), "l"(b));
  }
};
// D[64 x N] += A[64 x 8] . B[N x 8]^T, both operands float32 in shared memory read as TF32 (the
// tensor core ignores each value's 13 low mantissa bits: it truncates; no transpose flags for tf32)
template <int N>
struct WgmmaTf32;
template <>
struct WgmmaTf32<64> {
  __device__ static void mma(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" WGMMA_D32
                 "}, %32, %33, p, 1, 1;\n}\n"
                 : WGMMA_D32_OUT(d)
                 : "l"(a), "l"(b));
  }
};
template <>
struct WgmmaTf32<128> {
  __device__ static void mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WGMMA_D64
                 "}, %64, %65, p, 1, 1;\n}\n"
                 : WGMMA_D64_OUT(d)
                 : "l"(a), "l"(b));
  }
};

// The operands a WgmmaTileGemm multiplies. Either way a slice row is the 128 bytes one swizzle
// line spans, and a k step 32 of them.
// Bf16Operands: bf16 as stored, one wgmma.k16 per k step.
// Tf32x3Operands: float32, each split as x = hi + lo with hi = x truncated to TF32 (what the tensor
// core reads of x itself) and lo = x - hi (exact in float32) rounded to TF32 as cvt.rna.tf32.f32
// rounds; a k step is three wgmma.k8, lo_a.hi_b + hi_a.lo_b + hi_a.hi_b (lo_a.lo_b, below 2^-20 of
// the product, is left out): each product's relative error is ~2^-21 where TF32's alone is 2^-11.
// The lo parts are written into LO_BUFFERS copies of a stage beside the ring by the block's
// threads as each slice lands, while the slice before it multiplies.
struct Bf16Operands {
  using T = __nv_bfloat16;
  static constexpr int LO_BUFFERS = 0;
  template <int N>
  __device__ static void mma(float (&d)[N / 2], uint64_t a, uint64_t a_lo, uint64_t b, uint64_t b_lo) {
    Wgmma<N>::mma(d, a, b);
  }
};
struct Tf32x3Operands {
  using T = float;
  // slice kt's lo parts are written while slice kt - 1's wgmmas run, which read the other copy
  static constexpr int LO_BUFFERS = 2;
  template <int N>
  __device__ static void mma(float (&d)[N / 2], uint64_t a, uint64_t a_lo, uint64_t b, uint64_t b_lo) {
    WgmmaTf32<N>::mma(d, a_lo, b);
    WgmmaTf32<N>::mma(d, a, b_lo);
    WgmmaTf32<N>::mma(d, a, b);
  }
  // the lo parts of `bytes` of a stage at src into dst (shared::cta addresses), 16 bytes a thread
  // at a time
  __device__ static void split(unsigned src, unsigned dst, int bytes, int tid, int threads) {
    for (int at = tid * 16; at < bytes; at += threads * 16) {
      float4 v;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                   : "r"(src + at)
                   : "memory");
      const unsigned l0 = lo_part(v.x), l1 = lo_part(v.y), l2 = lo_part(v.z), l3 = lo_part(v.w);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst + at), "r"(l0), "r"(l1), "r"(l2), "r"(l3)
                   : "memory");
    }
  }
  __device__ static unsigned lo_part(float x) {
    return to_tf32(x - __uint_as_float(__float_as_uint(x) & 0xffffe000u));
  }
};

// mbarrier and TMA helpers (shared::cta addresses; a CTA launched without a cluster is its own)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// the one arrival of a stage's phase, with the bytes its copies will bring
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done;
}
// rows row.. of the box at column k of the tensor map `map` (global memory), into shared memory at dst
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* map, int k, int row, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(map), "r"(k), "r"(row), "r"(bar)
      : "memory");
}
// what this thread wrote (or saw written) through the generic proxy is seen by its later TMA reads
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// What a tile GEMM reads: rows a_row.. of the tensor map map_a (A, K wide) and rows b_row.. of
// map_b (the column block's BN weight rows, K each)
struct GemmOperands {
  const void* map_a;
  int a_row;
  const void* map_b;
  int b_row;
  int K;
};

template <int BM, int BN, int BK, int STAGES, int WGS = 1, class Op = Bf16Operands>
struct WgmmaTileGemm {
  // A block's warpgroups split the tile's columns in two where one holds all BM rows of half of
  // them (BM <= 128: 128 x 256 as two of 128 x 128), else its rows, 64 each (192 x 256 as three
  // of 64 x 256: 112 FLOPs per L2 byte). A warpgroup's 64 x WN block is WN / MMA_N wgmmas wide.
  static constexpr int WGS_N = WGS > 1 && BM <= 128 ? WGS : 1, WGS_M = WGS / WGS_N;
  static constexpr int ELEM = sizeof(typename Op::T), ROW_BYTES = BK * ELEM;
  static constexpr int THREADS = 128 * WGS, WM = BM / WGS_M, WN = BN / WGS_N, MB = WM / 64, KS = ROW_BYTES / 32;
  static constexpr int MMA_N = WN < 128 ? WN : 128, NB_N = WN / MMA_N, NREG = MMA_N / 2;
  static constexpr int A_BOX_BYTES = 64 * ROW_BYTES;  // one TMA box: 64 rows of A (gpu/tma.py A_BOX_ROWS)
  static constexpr int A_BYTES = BM * ROW_BYTES, B_BYTES = BN * ROW_BYTES, STAGE_BYTES = A_BYTES + B_BYTES;
  // the stages, the lo parts' copies of a stage after them, and room to start both on 1024 bytes
  static constexpr int SMEM_BYTES = (STAGES + Op::LO_BUFFERS) * STAGE_BYTES + 1024;
  static_assert(WGS_M * WGS_N == WGS && WM % 64 == 0 && (MMA_N == 32 || MMA_N == 64 || MMA_N == 128) &&
                    WN % MMA_N == 0 && BN <= 256 && ROW_BYTES == 128 && STAGES >= 3,
                "wgmma tile shape: whole 64-row blocks per warpgroup, columns per warpgroup of 32, 64 or a multiple "
                "of 128 (a TMA box of at most 256 rows), slices 128 bytes deep (BK = 64 bf16, 32 float), 3 stages "
                "or more");
  using Acc = float[MB][NB_N][NREG];
  // slices asked for ahead of the one multiplied: bf16 keeps slice kt - 1's wgmmas in flight while
  // slice kt's run, so its stage is free one slice later; tf32x3 waits for slice kt's wgmmas
  // before the next, so its stage takes slice kt + STAGES at once. (tf32x3 asked for STAGES - 1
  // too, a stage idle a slice long: at 64 x 256 x 32, three stages, slice kt + 1 was asked for
  // half a slice before it was awaited. One ahead more took 6-7% off the 1K and 2K layers on
  // one GPU and 1K on two, side by side on two H100s; the default within its spread.)
  static constexpr int AHEAD = Op::LO_BUFFERS > 0 ? STAGES : STAGES - 1;

  // The stages' barriers live as long as the block: a task's slice kt is in stage kt % STAGES and
  // waits for the phase of that stage's bit in `phase` (flipped by each wait), and its first
  // `primed` slices may have been asked for already, as the task before ended (prime).
  struct Ring {
    uint64_t landed[STAGES];
    unsigned phase;
    int primed;
  };
  __device__ static Ring& ring() {
    __shared__ Ring r;
    return r;
  }
  // once per block, before its first task
  __device__ static void prepare() {
    Ring& r = ring();
    if (thread_index() == 0) {
      for (int s = 0; s < STAGES; ++s) mbar_init(smem_addr(&r.landed[s]), 1);
      r.phase = 0;
      r.primed = 0;
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }

  // this thread's warpgroup's row band and column band of the tile (written so that a split of
  // one kind leaves no arithmetic for the other)
  __device__ static int band_m(int tid) { return WGS_M > 1 ? tid / 128 / WGS_N : 0; }
  __device__ static int band_n(int tid) { return WGS_M > 1 ? tid / 128 % WGS_N : tid / 128; }
  __device__ static unsigned stages_base(void* smem) {
    // the swizzle is of address bits: its 1024-byte pattern starts on a 1024-byte boundary
    return (smem_addr(smem) + 1023) & ~1023u;
  }

  // A's rows were written earlier in this launch by other blocks or peers (the TMA reads L2,
  // never a stale L1 line). False if a slice never landed (the error is recorded).
  __device__ static bool run(const Params& p, const GemmOperands& op, int rows, void* smem, Acc& acc) {
    zero(acc);
    // the tile's 64-row blocks that hold a row, and of them this warpgroup's (none: it only waits)
    const int nb = (rows + 63) / 64, mine = WGS_M > 1 ? min(max(nb - band_m(thread_index()) * MB, 0), MB) : nb;
    return blocks_of<MB>(mine, nb, p, op, smem, acc);
  }

  // One thread, as the block's task before this one has ended and its next GEMM is known: asks
  // for that GEMM's first AHEAD slices (all of A's 64-row boxes: its rows are not known
  // here), so that they land during the task's bookkeeping and the call. A's rows were seen
  // written by this thread (it took the command that names them). The block meets before the
  // next task starts: its thread 0 reads `primed`.
  __device__ static void prime(const GemmOperands& op, void* smem) {
    fence_async_shared();  // the epilogue wrote the stages through the generic proxy
    fence_async_global();
    const int n = min(AHEAD, op.K / BK);
    for (int s = 0; s < n; ++s) load(op, stages_base(smem), BM / 64, s, s);
    ring().primed = n;
  }

  // one thread: slice kt of op (`boxes` 64-row boxes of A and the B box) into `stage`
  __device__ static void load(const GemmOperands& op, unsigned base, int boxes, int stage, int kt) {
    const unsigned s = base + stage * STAGE_BYTES, bar = smem_addr(&ring().landed[stage]);
    mbar_expect_tx(bar, boxes * A_BOX_BYTES + B_BYTES);
    for (int m = 0; m < boxes; ++m) tma_load_2d(s + m * A_BOX_BYTES, op.map_a, kt * BK, op.a_row + m * 64, bar);
    tma_load_2d(s + A_BYTES, op.map_b, kt * BK, op.b_row, bar);
  }

  // the main loop of a warpgroup with NB 64-row blocks to compute, each NB compiled on its own:
  // ptxas serializes wgmmas that sit behind a branch
  template <int NB>
  __device__ static bool blocks_of(int mine, int nb, const Params& p, const GemmOperands& op, void* smem, Acc& acc) {
    if constexpr (NB > (WGS_M > 1 ? 0 : 1))
      if (mine < NB) return blocks_of<NB - 1>(mine, nb, p, op, smem, acc);
    const int tid = thread_index();
    const unsigned base = stages_base(smem);
    // one thread asks the copy engine for a slice: a box of A per 64-row block that holds a row
    // (NB of them where one warpgroup takes all the rows), and one of B
    const int boxes = WGS_M > 1 ? nb : NB;
    const int KT = op.K / BK;
    Ring& r = ring();
    if (tid == 0) {
      // the stages were last written through the generic proxy (the gate, the last epilogue), A too
      fence_async_shared();
      fence_async_global();
      for (int s = r.primed; s < AHEAD && s < KT; ++s) load(op, base, boxes, s, s);
    }
    Slices in(r.phase);
    int kt;
    if constexpr (Op::LO_BUFFERS > 0)
      kt = split_slices<NB>(p, op, base, boxes, KT, in, acc);
    else
      kt = slices<NB>(p, op, base, boxes, KT, in, acc);
    wgmma_wait<0>();
    if (kt < KT) {
      if (!aborted(p))
        record_error(p, WAIT_SLICE, op.a_row, op.b_row, kt, 0, 1, (long long)(now_ns() - in.waiter.start));
      return false;
    }
    __syncthreads();  // every warp is done with the stages
    if (tid == 0) {
      r.phase = in.phase;
      r.primed = 0;
    }
    return true;
  }

  // The landing of slices in order: slice kt is in stage kt % STAGES, and waits for the phase of
  // that stage's bit in `phase` (flipped by each wait)
  struct Slices {
    unsigned phase;
    Waiter waiter;
    __device__ explicit Slices(unsigned phase_) : phase(phase_) {}
    // false if slice kt never landed (the budget is spent; the caller records it)
    __device__ bool await(const Params& p, int kt) {
      const int st = kt % STAGES;
      // try_wait suspends the thread a while in hardware: the clock starts only if that was not enough
      const unsigned bar = smem_addr(&ring().landed[st]), parity = (phase >> st) & 1;
      if (!mbar_try_wait(bar, parity)) {
        waiter.restart();
        while (!mbar_try_wait(bar, parity))
          if (waiter.spent(p)) return false;
      }
      phase ^= 1u << st;
      return true;
    }
  };

  // this warpgroup's part of slice kt's products into d: A blocks from band_m * MB on, B rows from
  // band_n * WN, whole 8-row groups of 1024 bytes (lo: the copy holding the slice's lo parts)
  template <int NB>
  __device__ static void multiply(unsigned base, int kt, unsigned lo, Acc& d) {
    const int tid = thread_index();
    const unsigned a_wg = band_m(tid) * MB * 8 * 1024, b_wg = band_n(tid) * (WN / 8) * 1024;
    const unsigned stage = base + kt % STAGES * STAGE_BYTES;
    const unsigned a = stage + a_wg, b = stage + A_BYTES + b_wg, a_lo = lo + a_wg, b_lo = lo + A_BYTES + b_wg;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int n = 0; n < NB_N; ++n) {
        const unsigned bn = n * (MMA_N / 8) * 1024 + ks * 32;
        const uint64_t db = wgmma_desc(b + bn), db_lo = wgmma_desc(b_lo + bn);
#pragma unroll
        for (int m = 0; m < NB; ++m) {
          const unsigned am = m * 8 * 1024 + ks * 32;
          Op::template mma<MMA_N>(d[m][n], wgmma_desc(a + am), wgmma_desc(a_lo + am), db, db_lo);
        }
      }
    wgmma_commit();
  }

  // bf16: slice kt's wgmmas run on while slice kt - 1's are waited for, whose stage then takes
  // slice kt + AHEAD (STAGES - 1), so the copies run AHEAD slices ahead, as L2 and HBM latency need.
  // Returns the slices multiplied (KT, or the one that never landed).
  template <int NB>
  __device__ static int slices(const Params& p, const GemmOperands& op, unsigned base, int boxes, int KT, Slices& in,
                               Acc& acc) {
    const int tid = thread_index();
    for (int kt = 0; kt < KT; ++kt) {
      if (!in.await(p, kt)) return kt;
      multiply<NB>(base, kt, 0, acc);
      wgmma_wait<1>();
      __syncthreads();  // every warp is past slice kt - 1's wgmmas
      const int next = kt + AHEAD;
      if (tid == 0 && next < KT) load(op, base, boxes, next % STAGES, next);
    }
    return KT;
  }

  // tf32x3: the tensor core adds each wgmma's products into its accumulators rounding toward
  // zero, so a float32 sum over K in them drifts (3 x K / 8 such additions: 3e-5 of the default
  // layer's output, measured, where float32's tolerance is 1e-5). Each slice's products are
  // summed from zero in `part` and added into acc rounding to nearest. Slice kt + 1 lands and is
  // split (into the lo copy slice kt - 1 used) while slice kt's wgmmas run; then they are waited
  // for and summed, and slice kt's own stage takes slice kt + AHEAD (STAGES). (Two parts taking turns,
  // so that slice kt's wgmmas could run on while slice kt - 1's part is summed, spilled 452 bytes
  // of gemm_task and made the default layer 25% slower, one H200.)
  template <int NB>
  __device__ static int split_slices(const Params& p, const GemmOperands& op, unsigned base, int boxes, int KT,
                                     Slices& in, Acc& acc) {
    const int tid = thread_index();
    Acc part;
    zero(part);
    if (KT > 0 && !in.await(p, 0)) return 0;
    split_into(base, boxes, 0);
    for (int kt = 0; kt < KT; ++kt) {
      multiply<NB>(base, kt, lo_copy(base, kt), part);
      if (kt + 1 < KT) {
        if (!in.await(p, kt + 1)) return kt + 1;
        split_into(base, boxes, kt + 1);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int n = 0; n < NB_N; ++n)
#pragma unroll
          for (int q = 0; q < NREG; ++q) {
            acc[m][n][q] += part[m][n][q];
            part[m][n][q] = 0.f;
          }
      __syncthreads();  // every warp is past slice kt's wgmmas
      const int next = kt + AHEAD;
      if (tid == 0 && next < KT) load(op, base, boxes, next % STAGES, next);
    }
    return KT;
  }

  // (tf32x3 only, as split_slices and split_into: bf16 never instantiates them)
  __device__ static unsigned lo_copy(unsigned base, int kt) {
    return base + (STAGES + kt % Op::LO_BUFFERS) * STAGE_BYTES;
  }

  // slice kt's lo parts (the A boxes that landed, and B) by the whole block, into its copy; the
  // wgmmas read them through the async proxy, and every warpgroup reads rows others split
  __device__ static void split_into(unsigned base, int boxes, int kt) {
    const int tid = thread_index();
    const unsigned stage = base + kt % STAGES * STAGE_BYTES, lo = lo_copy(base, kt);
    Op::split(stage, lo, boxes * A_BOX_BYTES, tid, THREADS);
    Op::split(stage + A_BYTES, lo + A_BYTES, B_BYTES, tid, THREADS);
    fence_async_shared();
    __syncthreads();
  }

  __device__ static void zero(Acc& d) {
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int n = 0; n < NB_N; ++n)
#pragma unroll
        for (int q = 0; q < NREG; ++q) d[m][n][q] = 0.f;
  }

  // The tile's rows < `rows` into out (row r at out(r)) as bf16, element (r, c) =
  // act(acc + bias[c]) in float32, rounded to nearest even, through shared memory: each thread puts
  // its accumulators into the stages (idle now) as they are, then every thread takes 8 columns of
  // a row at a time, the same 8 in every row it takes, so it loads their biases once, and stores
  // them as 16 bytes (gated: their 4 outputs as 8), 512 contiguous bytes a warp (fewer, wider
  // stores: the pass is about a tenth of a fine-grained layer, docs/notes/tile-gemm.md). Applied
  // pair by pair from the fragments, each bias load waited behind the store before it, which might
  // have written it. A row is 8 floats longer than the tile's, so the 4 rows a half-warp's 8-byte
  // fragment stores fall on take 32 banks.
  // Only the columns < cols are stored (a ragged last column block: a multiple of 64, layout.py's
  // RAGGED_MULTIPLE). GATED: the columns come in (gate, up) pairs, and columns c, c + 1 give
  // act(gate, up) at out(r) + c / 2.
  template <bool GATED, class Rows, class Act>
  __device__ static void store(const Acc& acc, int rows, int cols, void* smem, Rows out, const float* bias, Act act) {
    constexpr int ROW_FLOATS = BN + 8, OCTETS = BN / 8;
    static_assert(BM * ROW_FLOATS * 4 <= STAGES * STAGE_BYTES && THREADS % OCTETS == 0,
                  "the float32 tile fits the stages, and every thread keeps its 8 columns");
    float* s = static_cast<float*>(smem);
    epilogue(acc, rows, [&](int r, int c, float v0, float v1) {
      *reinterpret_cast<float2*>(s + r * ROW_FLOATS + c) = make_float2(v0, v1);
    });
    __syncthreads();
    const int tid = thread_index(), c = 8 * (tid % OCTETS);
    if (c >= cols) return;
    const float4 b0 = *reinterpret_cast<const float4*>(bias + c), b1 = *reinterpret_cast<const float4*>(bias + c + 4);
    for (int r = tid / OCTETS; r < rows; r += THREADS / OCTETS) {
      const float4 v0 = *reinterpret_cast<const float4*>(s + r * ROW_FLOATS + c);
      const float4 v1 = *reinterpret_cast<const float4*>(s + r * ROW_FLOATS + c + 4);
      if constexpr (GATED)
        *reinterpret_cast<uint2*>(out(r) + c / 2) =
            make_uint2(bf16x2(act(v0.x + b0.x, v0.y + b0.y), act(v0.z + b0.z, v0.w + b0.w)),
                       bf16x2(act(v1.x + b1.x, v1.y + b1.y), act(v1.z + b1.z, v1.w + b1.w)));
      else
        *reinterpret_cast<uint4*>(out(r) + c) =
            make_uint4(bf16x2(act(v0.x + b0.x), act(v0.y + b0.y)), bf16x2(act(v0.z + b0.z), act(v0.w + b0.w)),
                       bf16x2(act(v1.x + b1.x), act(v1.y + b1.y)), bf16x2(act(v1.z + b1.z), act(v1.w + b1.w)));
    }
  }

  // lo and hi rounded to bf16 (nearest even), lo in the low half: two adjacent columns as stored
  __device__ static unsigned bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }

  // f(row, col, v0, v1) for each pair of adjacent output columns this thread holds (rows < `rows`)
  template <class F>
  __device__ static void epilogue(const Acc& acc, int rows, F f) {
    const int tid = thread_index(), lane = tid % 32;
    const int r0 = band_m(tid) * WM + (tid % 128 / 32) * 16 + lane / 4, c0 = band_n(tid) * WN + 2 * (lane % 4);
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m * 64 + r0 + 8 * h;
        if (r >= rows) continue;
#pragma unroll
        for (int n = 0; n < NB_N; ++n)
#pragma unroll
          for (int j = 0; j < MMA_N / 8; ++j)
            f(r, c0 + n * MMA_N + j * 8, acc[m][n][4 * j + 2 * h], acc[m][n][4 * j + 2 * h + 1]);
      }
  }
};
