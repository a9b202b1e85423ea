// Processor blocks: dispatch this rank's routed rows (stored into the owner's inbox, or packed and
// put where it is not load/store reachable), with a signal per tile,
// then run the tasks the scheduler hands them (GEMM0, GEMM1, combine), then sum each token's
// returned rows in choice order (the fixed combine order that makes results deterministic).
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>
#include "os.cuh"
#include "tile_gemm.cuh"
#include "tile_gemm_wgmma.cuh"
#include "tile_gemm_tf32.cuh"

// The activations, a type each, so that an epilogue is compiled for the one its task applies: a
// switch per element inlines all four at every element (the bf16 128 x 128 epilogue grew to ~17k
// instructions, fetched anew by every task: GEMM0 tasks took 49 us alone against GEMM1's 25).
template <int KIND>
struct Activation;
template <>
struct Activation<ACT_RELU> {
  __device__ float operator()(float h) const { return fmaxf(h, 0.f); }
};
template <>
struct Activation<ACT_GELU_TANH> {
  __device__ float operator()(float h) const {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * h * (1.f + tanhf(c * (h + 0.044715f * h * h * h)));
  }
};
template <>
struct Activation<ACT_GELU> {
  __device__ float operator()(float h) const { return 0.5f * h * (1.f + erff(h * 0.7071067811865476f)); }
};
template <>
struct Activation<ACT_SILU> {
#if MOE_WGMMA
  // an IEEE division's slow path is a subroutine call, and a call in the function of the wgmmas
  // (gemm_task) makes ptxas serialize them; the fast division's 2 ulp vanish in bf16, and are
  // within float32's tolerance (the golden's 1e-5) in tf32x3
  __device__ float operator()(float h) const { return __fdividef(h, 1.f + expf(-h)); }
#else
  __device__ float operator()(float h) const { return h / (1.f + expf(-h)); }
#endif
};

// GEMM1's output: the bias alone
struct Identity {
  __device__ float operator()(float h) const { return h; }
};

// The gated activations (MOE_GATED) of a gate column g and its up column u: swiglu, silu(g) u;
// swiglu_oai (gpt-oss), g clamped above and u on both sides at the limit, g sigmoid(alpha g) (u + 1)
struct SwiGlu {
  __device__ float operator()(float g, float u) const { return Activation<ACT_SILU>{}(g) * u; }
};
struct SwiGluOai {
  float alpha, limit;
  __device__ float operator()(float g, float u) const {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
#if MOE_WGMMA
    return __fdividef(g, 1.f + expf(-alpha * g)) * (u + 1.f);  // as silu's: no call in gemm_task
#else
    return g / (1.f + expf(-alpha * g)) * (u + 1.f);
#endif
  }
};
#if MOE_GATED == MOELAB_ACT_SWIGLU_OAI
__device__ __forceinline__ SwiGluOai gated_activation(const Params& p) {
  return {(float)p.swiglu_alpha, (float)p.swiglu_limit};
}
#else
__device__ __forceinline__ SwiGlu gated_activation(const Params&) { return {}; }
#endif

// A task's first row of A: a routed window's in inbox (GEMM0) and hidden (GEMM1); a shared
// expert's window w: its tokens' in x (GEMM0), and its rows of hidden after the routed experts'
// E x C (GEMM0's output, GEMM1's input)
template <int BM>
__device__ __forceinline__ long long task_row(const Params& p, int kind, int le, int w) {
  if (MOE_SHARED && le >= p.L) return (kind == TASK_GEMM0 ? 0 : p.E * p.C + (le - p.L) * p.T) + (long long)w * BM;
  return window_row<BM>(p, le, w);
}
// GEMM0's first row of hidden for a task whose A starts at row s0
__device__ __forceinline__ long long hidden_row(const Params& p, int le, long long s0) {
  return MOE_SHARED && le >= p.L ? p.E * p.C + (le - p.L) * p.T + s0 : s0;
}

// f(Activation<kind>{}) for the run-time `kind`
template <class F>
__device__ __forceinline__ void with_activation(int kind, F f) {
  switch (kind) {
    case ACT_RELU: f(Activation<ACT_RELU>{}); break;
    case ACT_GELU_TANH: f(Activation<ACT_GELU_TANH>{}); break;
    case ACT_GELU: f(Activation<ACT_GELU>{}); break;
    default: f(Activation<ACT_SILU>{});
  }
}

// Row copies by warps: dst row r (H elements) = scale(r) * src(r), or src(r) where scales is null
// (bf16 rows scaled in float32 and rounded to nearest even, as the golden stores a scaled row). Each warp moves ROW_GROUP rows at a time with all of a batch's
// 16-byte loads issued before any store: these copies are bound by load latency, not bandwidth,
// when each load waits for the one before.
constexpr int ROW_GROUP = MOELAB_COPY_ROW_GROUP, ROW_BATCH = MOELAB_COPY_ROW_BATCH;  // sim.costs models them
// 16 bytes of elem_t times w
__device__ __forceinline__ float4 scaled(float4 v, float w) {
#if MOE_BF16
  __nv_bfloat162* b = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(b[q]);
    b[q] = __floats2bfloat162_rn(__fmul_rn(w, f.x), __fmul_rn(w, f.y));
  }
  return v;
#else
  return make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
#endif
}
template <class Src>
__device__ void copy_rows(const Params& p, elem_t* dst, int rows, Src src, const float* scales) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int H4 = (int)(p.H * sizeof(elem_t) / 16);  // 16-byte vectors per row
  for (int r0 = warp * ROW_GROUP; r0 < rows; r0 += nwarps * ROW_GROUP) {
    const float4* s[ROW_GROUP];
    float w[ROW_GROUP];
#pragma unroll
    for (int g = 0; g < ROW_GROUP; ++g) {
      bool in = r0 + g < rows;
      s[g] = in ? src(r0 + g) : nullptr;
      w[g] = in && scales ? __ldcg(scales + r0 + g) : 1.f;
    }
    for (int h = lane; h < H4; h += 32 * ROW_BATCH) {
      float4 v[ROW_GROUP][ROW_BATCH];
#pragma unroll
      for (int g = 0; g < ROW_GROUP; ++g)
#pragma unroll
        for (int u = 0; u < ROW_BATCH; ++u)
          if (s[g] && h + 32 * u < H4) v[g][u] = __ldcg(s[g] + h + 32 * u);
#pragma unroll
      for (int g = 0; g < ROW_GROUP; ++g) {
        float4* d = reinterpret_cast<float4*>(dst + (long long)(r0 + g) * p.H);
#pragma unroll
        for (int u = 0; u < ROW_BATCH; ++u)
          if (s[g] && h + 32 * u < H4)
            d[h + 32 * u] = scales ? scaled(v[g][u], w[g]) : v[g][u];
      }
    }
  }
}

// How many processors share each dispatched chunk: with direct stores, enough that every processor
// has a share when the chunk slots (E x CH) are fewer than the processors (a block alone copies a
// 128-row bf16 tile in ~100 us: its loads' latency, not the memory, bounds it), at most
// DISPATCH_MAX_PARTS; a packed chunk is put by one block. sim/costs.py dispatch_parts mirrors it.
constexpr int DISPATCH_MAX_PARTS = MOELAB_DISPATCH_MAX_PARTS;
__device__ __forceinline__ int dispatch_parts(const Params& p) {
  return p.direct_stores ? (int)max(1LL, min(p.n_proc / (p.E * p.CH), (long long)DISPATCH_MAX_PARTS)) : 1;
}

// Share `part` of `parts` of chunk j of this rank's rows for expert e (tiles.cuh). Where the owner's
// inbox is load/store reachable (this GPU or an NVLink peer) the rows are gathered straight into it,
// and the block finishing the chunk's last share counts it in at the owner; else one block gathers
// the chunk into staging and puts it with its count.
template <int BM>
__device__ void dispatch_chunk(const Params& p, int tel, int e, int j, Chunk c, int part, int parts) {
  const int rows = c.b - c.a;
  const uint64_t t0 = now_ns();
  const long long H = p.H;
  const int owner = (int)(e / p.L), le = (int)(e % p.L), w = first_window<BM>(p, (int)p.rank) + j;
  elem_t* const inbox = p.inbox + (((long long)le * p.P + p.rank) * p.C + c.a) * H;
  elem_t* const there = p.direct_stores ? static_cast<elem_t*>(nvshmem_ptr(inbox, owner)) : nullptr;
  if (!there && part > 0) return;
  const int share = there ? ceil_div(rows, parts) : rows, r0 = min(rows, part * share), r1 = min(rows, r0 + share);
  const long long from = (long long)e * p.C + c.a;  // the chunk's first slot in row_token
  elem_t* dst = (there ? there : p.staging + (__ldcg(p.count_base + e) + c.a) * H) + r0 * H;
  // scaled before the expert (Llama 4), each row leaves as its token times its routing weight
  copy_rows(p, dst, r1 - r0, [&](int r) {
    return reinterpret_cast<const float4*>(p.x + (long long)__ldcg(p.row_token + from + r0 + r) * H);
  }, MOE_SCALE_BEFORE ? p.row_weight + from + r0 : nullptr);
  __syncthreads();
  uint64_t* const landed = p.sig_tile + (long long)le * p.W + w;
  if (there && threadIdx.x == 0) {
    // A chunk for this GPU's own experts is read by this GPU's subscriber and processors only: GPU
    // scope orders the shares' stores before its count (as a GEMM1 count on this GPU).
    const bool here = owner == p.rank;
    auto fence_for_owner = [here] { here ? __threadfence() : __threadfence_system(); };
    fence_for_owner();  // this share's stores, before its count (a chunk of one share: before its signal)
    if (parts == 1 || atomicAdd(p.dispatch_done + (long long)e * p.CH + j, 1) == parts - 1) {
      if (parts > 1) fence_for_owner();  // every counted share's stores, before the chunk's count
      if (here)
        atomicAdd(reinterpret_cast<unsigned long long*>(landed), 1ull);
      else
        nvshmemx_signal_op(landed, 1, NVSHMEM_SIGNAL_ADD, owner);
    }
  } else if (!there) {
    __threadfence();
    nvshmemx_putmem_signal_nbi_block(inbox, dst, (size_t)rows * H * sizeof(elem_t), landed, 1, NVSHMEM_SIGNAL_ADD,
                                     owner);
  }
  if (threadIdx.x == 0) log_event(p, tel, blockIdx.x, EV_DISPATCH, t0, now_ns(), e, owner, r1 - r0, w, part);
}

// Deals this rank's dispatch shares to blocks b of nb: the non-empty chunks of experts
// expert_at(0..ne-1), in that order and window order within each, each cut into `parts` shares,
// numbered consecutively, share u to block u mod nb. Only non-empty chunks are counted: a dropless
// layer's chunk slots (C = T) are mostly empty, and dealing the slots gave a few blocks every
// expert's first chunks. The block's threads load BLOCK_THREADS experts' row counts at once and
// scan their shares into `ends` (shared memory, BLOCK_THREADS ints): one dependent load an expert
// passed made a block wait between its shares (docs/notes/dispatch.md).
template <int BM, class ExpertAt>
__device__ void deal_chunks(const Params& p, int tel, int ne, ExpertAt expert_at, int parts, int b, int nb,
                            int* ends) {
  __shared__ int warp_sums[BLOCK_THREADS / 32];
  const int rank = (int)p.rank, first = first_window<BM>(p, rank), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int u = 0;
  for (int i0 = 0; i0 < ne; i0 += BLOCK_THREADS) {
    const int n = min(BLOCK_THREADS, ne - i0), i = i0 + (int)threadIdx.x;
    const int rows = i < ne ? __ldcg(p.counts + expert_at(i)) : 0;
    int shares = warp_inclusive_sum(rows == 0 ? 0 : (last_window<BM>(p, rank, rows) - first + 1) * parts);
    if (lane == 31) warp_sums[warp] = shares;
    __syncthreads();
    for (int w = 0; w < warp; ++w) shares += warp_sums[w];
    ends[threadIdx.x] = shares;  // the shares of experts i0 .. i, inclusive
    __syncthreads();
    const int total = ends[n - 1];
    int g = 0;  // the expert of share v, i0 + g: v only grows
    for (int v = u + ((b - u) % nb + nb) % nb; v < u + total; v += nb) {
      while (ends[g] <= v - u) ++g;
      const long long e = expert_at(i0 + g);
      const int k = v - u - (g ? ends[g - 1] : 0);
      dispatch_chunk<BM>(p, tel, (int)e, k / parts, own_chunk<BM>(p, e, k / parts), k % parts, parts);
    }
    u += total;
    __syncthreads();  // ends and warp_sums are read before the next group's scan writes them
  }
}

// This block's dispatch shares. Flat (staged_blocks 0, or one GPU): every expert's chunks dealt to
// all n blocks. Staged: blocks 0..R-1 send the peers' chunks, local expert by local expert, in the
// same order on every GPU with the owners staggered by rank, so the owners' experts complete in
// waves; blocks R.. store this GPU's own chunks and go on to the tasks that those waves queue while
// the rest is in flight (R = the host's layout.STAGED_BLOCKS; measurements: docs/notes/dispatch.md).
template <int BM>
__device__ void dispatch_chunks(const Params& p, int tel, int n, unsigned char* smem) {
  const int R = p.P > 1 ? (int)min(p.staged_blocks, (long long)n - 1) : 0, b = (int)blockIdx.x;
  const int P = (int)p.P, L = (int)p.L, rank = (int)p.rank;
  int* const ends = reinterpret_cast<int*>(smem);  // the gate is done with it, no task has begun
  if (R == 0) {
    deal_chunks<BM>(p, tel, (int)p.E, [](int i) { return (long long)i; }, dispatch_parts(p), b, n, ends);
  } else if (b >= R) {
    deal_chunks<BM>(p, tel, L, [=](int i) { return (long long)rank * L + i; }, 1, b - R, n - R, ends);
  } else {
    // a local expert's chunks on each peer k = 0.. counted from rank + 1 on
    auto peer_expert = [=](int i) { return (long long)((rank + 1 + i % (P - 1)) % P) * L + i / (P - 1); };
    deal_chunks<BM>(p, tel, L * (P - 1), peer_expert, 1, b, R, ends);
  }
}

// Where a GEMM task's output row r goes: GEMM0's into `hidden`, consecutive rows ld apart; GEMM1's
// into the combox of each row's source (SourceRows), through a table of the window's sources' row
// bases that the processor fills before the task (the bf16 task may call nothing to work it out).
// A source's combox holds only its rows (count_base), so a window's rows past a source's count (a
// merged window's gap before the next source's rows) go to the owner's own outbuf rows instead.
struct ConsecutiveRows {
  elem_t* base;
  long long ld;
  __device__ __forceinline__ elem_t* operator()(int r) const { return base + r * ld; }
};
struct SourceRows {
  elem_t* const* base;  // [MAX_TILE_SOURCES] slot 0 of source first + i's rows
  elem_t* const* spare;  // [MAX_TILE_SOURCES] slot 0 of its rows in outbuf, for the slots past its rows
  const int* n;  // [MAX_TILE_SOURCES] its rows
  int pos0, stride, first, H;  // ints: tiles.cuh says why
  __device__ __forceinline__ elem_t* operator()(int r) const {
    const int pos = pos0 + r, i = pos / stride - first, q = pos % stride;
    return (q < n[i] ? base[i] : spare[i]) + (long long)q * H;
  }
};

#if MOE_BF16 + MOE_TF32 + MOE_TF32X3 > 1
#error "build one of MOE_BF16, MOE_TF32 (float32 data) and MOE_TF32X3 (float32 data)"
#elif !MOE_WGMMA && BLOCK_WARPGROUPS != 1
#error "only the warpgroup tile GEMM splits a tile over warpgroups: build float32 and tf32 with BLOCK_WARPGROUPS=1"
#elif MOE_WGMMA || MOE_TF32
#if MOE_WGMMA
// GEMM_STAGES (TMA stages) and BLOCK_WARPGROUPS come with the tile shape from the build (gpu/layout.py)
template <int BM, int BN, int BK>
using TensorCoreGemm = WgmmaTileGemm<BM, BN, BK, GEMM_STAGES, BLOCK_WARPGROUPS,
#if MOE_BF16
                                     Bf16Operands>;
#else
                                     Tf32x3Operands>;
#endif
#define TENSOR_TASK __noinline__
// what a task's tile GEMM reads through the TMA: A is rows s0.. of inbox (GEMM0) or hidden
// (GEMM1); the weights are K-major ([L][N][K], params.cuh), so column block col0 of expert le
// is rows le * N + col0.. of its tensor map
__device__ __forceinline__ GemmOperands task_operands(const Params& p, bool first, long long s0, int le, int col0) {
  const long long N = first ? gemm0_cols(p) : p.H;
  const int a = first ? (MOE_SHARED && le >= p.L ? TMAP_X : TMAP_INBOX) : TMAP_HIDDEN;
  return {p.tmaps + a * TMAP_BYTES, (int)s0,
          p.tmaps + (first ? TMAP_W1 : TMAP_W2) * TMAP_BYTES, (int)(le * N + col0), (int)(first ? p.H : p.I)};
}
// the task's tile GEMM; false if a slice never landed
template <class Gemm>
__device__ __forceinline__ bool tile_gemm(const Params& p, bool first, long long s0, int rows, int le, int col0,
                                          void* smem, typename Gemm::Acc& acc) {
  return Gemm::run(p, task_operands(p, first, s0, le, col0), rows, smem, acc);
}
#else
template <int BM, int BN, int BK>
using TensorCoreGemm = Tf32TileGemm<BM, BN, BK>;
#define TENSOR_TASK
// the task's tile GEMM: A is rows s0.. of inbox or hidden, the weights [L][K][N]; always true
template <class Gemm>
__device__ __forceinline__ bool tile_gemm(const Params& p, bool first, long long s0, int rows, int le, int col0,
                                          void* smem, typename Gemm::Acc& acc) {
  const long long K = first ? p.H : p.I, N = first ? gemm0_cols(p) : p.H;
  const elem_t* w = (first ? p.w1 : p.w2) + (long long)le * K * N + col0;
  const elem_t* a = first ? (MOE_SHARED && le >= p.L ? p.x : p.inbox) : p.hidden;
  Gemm::run(a + s0 * K, K, rows, w, N, (int)K, smem, acc);
  return true;
}
#endif
// A task's output tile, element (r, c) = act(acc + bias[c]) at out(r) + c for the columns c < cols;
// GATED: columns c, c + 1 (gate, up) give act(gate, up) at out(r) + c / 2. bf16 (rounded to
// nearest even) through shared memory in whole rows (WgmmaTileGemm::store); tf32's and tf32x3's
// float32 straight from the fragments
template <class Gemm, bool GATED, class Rows, class Act>
__device__ __forceinline__ void store_tile(const typename Gemm::Acc& acc, int rows, int cols, void* smem, Rows out,
                                           const float* bias, Act act) {
#if MOE_BF16
  Gemm::template store<GATED>(acc, rows, cols, smem, out, bias, act);
#else
  Gemm::epilogue(acc, rows, [&](int r, int c, float v0, float v1) {
    if (MOE_RAGGED && c >= cols) return;
    if constexpr (GATED)
      out(r)[c / 2] = act(v0 + bias[c], v1 + bias[c + 1]);
    else
      *reinterpret_cast<float2*>(out(r) + c) = make_float2(act(v0 + bias[c]), act(v1 + bias[c + 1]));
  });
#endif
}


// A GEMM0 or GEMM1 task of a tensor-core kernel, as the reference's bf16 or tf32 path computes
// it: float32 accumulation, bias and activation in float32. bf16: bf16 operands, the activation
// rounded to bf16 (round to nearest even) into `hidden`, and the GEMM1 output rounded to bf16 too,
// for the trip home (half the bytes; one more rounding than the reference, whose combine reads
// float32 rows). tf32: float32 operands rounded to TF32 inside the tile GEMM, float32 stored.
// tf32x3: float32 operands split into TF32 parts inside the tile GEMM, float32 stored.
// (wgmma: a function of its own, called: ptxas keeps wgmma asynchronous only in a function that
// calls nothing it cannot see, and the kernel calls NVSHMEM's device library, linked in later)
template <int BM, int BN, int BK, class Out1>
__device__ TENSOR_TASK void gemm_task(const Params& p, int kind, long long s0, int rows, int le, int col0, Out1 out1,
                                      void* smem) {
  using Gemm = TensorCoreGemm<BM, BN, BK>;
  typename Gemm::Acc acc;
  const int act = (int)p.act_kind;
  // one GEMM for both kinds (one copy of the main loop in the code), two epilogues
  const bool first = kind == TASK_GEMM0;
  if (!tile_gemm<Gemm>(p, first, s0, rows, le, col0, smem, acc)) return;
  const long long N = first ? gemm0_cols(p) : p.H;
  const int cols = (int)min((long long)BN, N - col0);  // fewer in a ragged last column block
  const float* b = (first ? p.b1 : p.b2) + (long long)le * N + col0;
  if (first) {
    const ConsecutiveRows to{p.hidden + hidden_row(p, le, s0) * p.I + (MOE_GATED ? col0 / 2 : col0), p.I};
#if MOE_GATED
    store_tile<Gemm, true>(acc, rows, cols, smem, to, b, gated_activation(p));
#else
    with_activation(act, [&](auto activate) {
      store_tile<Gemm, false>(acc, rows, cols, smem, to, b, activate);
    });
#endif
    fence_async_global();  // GEMM1 tasks read these rows through the TMA (the async proxy)
  } else {
    const SourceRows to = out1();
    store_tile<Gemm, false>(acc, rows, cols, smem, [&](int r) { return to(r) + col0; }, b, Identity{});
  }
}
#else
// A GEMM0 or GEMM1 task of the float32 kernel: SIMT, bias and activation in float32.
template <int BM, int BN, int BK, class Out1>
__device__ void gemm_task(const Params& p, int kind, long long s0, int rows, int le, int col0, Out1 out1,
                          void* smem) {
  using Gemm = SimtTileGemm<BM, BN, BK>;
  float acc[Gemm::TM][Gemm::TN];
  // one GEMM for both kinds (one copy of the main loop in the code), two epilogues
  const bool first = kind == TASK_GEMM0;
  const long long K = first ? p.H : p.I, N = first ? gemm0_cols(p) : p.H;
  const elem_t* a = first ? (MOE_SHARED && le >= p.L ? p.x : p.inbox) : p.hidden;
  Gemm::run(a + s0 * K, K, rows, (first ? p.w1 : p.w2) + (long long)le * K * N + col0, N,
            (int)K, reinterpret_cast<float*>(smem), acc);
  if (first) {
    const long long h0 = hidden_row(p, le, s0);
#if MOE_GATED
    // a thread's columns come in even-odd pairs (its groups of CG are even: layout checks TN)
    const auto act = gated_activation(p);
#pragma unroll
    for (int i = 0; i < Gemm::TM; ++i) {
      int r = Gemm::row_of(i);
      if (r >= rows) continue;
#pragma unroll
      for (int j = 0; j < Gemm::TN; j += 2) {
        int c = col0 + Gemm::col_of(j);
        if (MOE_RAGGED && c >= N) continue;
        const float* b = p.b1 + (long long)le * N + c;
        p.hidden[(h0 + r) * p.I + c / 2] = act(acc[i][j] + b[0], acc[i][j + 1] + b[1]);
      }
    }
#else
    with_activation((int)p.act_kind, [&](auto activate) {
#pragma unroll
      for (int i = 0; i < Gemm::TM; ++i) {
        int r = Gemm::row_of(i);
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < Gemm::TN; ++j) {
          int c = col0 + Gemm::col_of(j);
          if (MOE_RAGGED && c >= N) continue;
          p.hidden[(h0 + r) * p.I + c] = activate(acc[i][j] + p.b1[(long long)le * N + c]);
        }
      }
    });
#endif
  } else {
    const SourceRows to = out1();
#pragma unroll
    for (int i = 0; i < Gemm::TM; ++i) {
      int r = Gemm::row_of(i);
      if (r >= rows) continue;
      elem_t* out = to(r);
#pragma unroll
      for (int j = 0; j < Gemm::TN; ++j) {
        int c = col0 + Gemm::col_of(j);
        if (MOE_RAGGED && c >= N) continue;
        out[c] = acc[i][j] + p.b2[(long long)le * p.H + c];
      }
    }
  }
}
#endif

// Processor `me`'s command after number `seq`, if the scheduler has sent it: its task (TASK_STOP
// for the stop command) into *task, its number into *got. Never waits; *got is the number seen.
__device__ __forceinline__ bool take_command(const Params& p, int me, int seq, int* got, int4* task) {
  const unsigned long long cmd = ld_acquire_gpu(p.mailbox + mailbox_slot(me, seq + 1));
  *got = (int)(cmd >> 32);
  if (*got <= seq) return false;
  const unsigned idx = (unsigned)cmd;
  *task = idx == STOP_INDEX ? make_int4(TASK_STOP, 0, 0, 0) : __ldcg(p.queue + idx);
  return true;
}

template <int BM, int BN, int BK>
__device__ void processor(const Params& p, int tel, void* smem) {
  __shared__ int4 task, next;
  __shared__ int task_seq, next_seq, last;
  __shared__ bool ahead;  // `next` was taken during the task before it: nothing to wait for
  // a GEMM1 task's destinations: each source's rows in its combox where that is load/store
  // reachable (this GPU or an NVLink peer), so no block spends a task putting the rows afterwards;
  // else outbuf's, put home by the tile's last task
  __shared__ elem_t* dst_base[MAX_TILE_SOURCES];
  __shared__ elem_t* dst_spare[MAX_TILE_SOURCES];
  __shared__ int dst_rows[MAX_TILE_SOURCES];
  __shared__ bool dst_direct[MAX_TILE_SOURCES];
  const int me = blockIdx.x, tid = threadIdx.x;
  const int n0 = (int)((gemm0_cols(p) + BN - 1) / BN), n1 = (int)((p.H + BN - 1) / BN);
  // The scheduler sends a busy processor its next command (MAILBOX_SLOTS), so it is usually there
  // when a task's work is done: warp 1 takes it then, its two dependent loads (mailbox, queue) in
  // flight while thread 0's fence and atomics finish the task. Taken after them, they left ~2 us
  // between tasks (telemetry, one H100), the SM's tensor cores idle at one block per SM.
  // The bf16 GEMM's next task then has its first slices asked for by the same thread (it saw
  // their rows written), and they land while this task's bookkeeping and the call go on.
  auto take_ahead = [&](int seq) {
    if (tid != 32) return;
    ahead = take_command(p, me, seq, &next_seq, &next);
#if MOE_WGMMA
    if (ahead && (next.x == TASK_GEMM0 || next.x == TASK_GEMM1))
      TensorCoreGemm<BM, BN, BK>::prime(
          task_operands(p, next.x == TASK_GEMM0, task_row<BM>(p, next.x, next.y, next.z), next.y, next.w), smem);
#endif
  };
  if (tid == 0) {
    task_seq = 0;
    ahead = false;
  }
#if MOE_WGMMA
  TensorCoreGemm<BM, BN, BK>::prepare();
#endif
  for (;;) {
    if (tid == 0 && ahead) {
      task = next;
      task_seq = next_seq;
      ahead = false;
    } else if (tid == 0) {
      Waiter w(3);
      int got;
      while (!take_command(p, me, task_seq, &got, &task)) {
        if (w.expired(p, WAIT_COMMAND, me, task_seq + 1, 0, got, task_seq + 1)) {
          task = make_int4(TASK_STOP, 0, 0, 0);
          break;
        }
      }
      task_seq = got;
    }
    if (MOE_SHARED && tid == 0 && task.x == TASK_GEMM1 && task.y >= p.L) {
      dst_base[0] = p.shared_out + (task.y - p.L) * p.T * p.H;  // a shared expert's rows stay here
      dst_rows[0] = (int)p.T;
    } else if (tid == 0 && task.x == TASK_GEMM1) {
      const int le = task.y, s_first = window_first_source<BM>(p, task.z);
      for (int s = s_first; s <= window_last_source<BM>(p, task.z); ++s) {
        elem_t* home = p.combox + __ldcg(p.in_base + s * p.L + le) * p.H;
        elem_t* there = p.direct_stores ? static_cast<elem_t*>(nvshmem_ptr(home, s)) : nullptr;
        elem_t* own = p.outbuf + ((long long)le * p.P + s) * p.C * p.H;
        dst_direct[s - s_first] = there != nullptr;
        dst_base[s - s_first] = there ? there : own;
        dst_spare[s - s_first] = own;
        dst_rows[s - s_first] = __ldcg(p.in_count + s * p.L + le);
      }
    }
    __syncthreads();
    const int4 tk = task;
    const int seq = task_seq;
    if (tk.x == TASK_STOP) break;
    const uint64_t t0 = now_ns();
    if (tk.x == TASK_COMBINE) {
      const int e = tk.y, j = tk.z;
      const Chunk c = own_chunk<BM>(p, e, j);
#if !MOE_BF16
      // weight the returned rows of the chunk in place: combox row = weight * row
      const long long s0 = (long long)e * p.C + c.a;
      elem_t* rows_at = p.combox + (__ldcg(p.count_base + e) + c.a) * p.H;
      copy_rows(
          p, rows_at, c.b - c.a, [&](int r) { return reinterpret_cast<const float4*>(rows_at + (long long)r * p.H); },
          MOE_SCALE_BEFORE ? nullptr : p.row_weight + s0);  // scaled before the expert: weight 1 here
#endif
      // (bf16: the returned bf16 rows are weighted in float32 by the final combine; this task only
      // marks the chunk's arrival, which the scheduler waits for before it stops the processors)
      take_ahead(seq);
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        log_event(p, tel, me, EV_COMBINE, t0, now_ns(), e, (int)(e / p.L), c.b - c.a,
                  first_window<BM>(p, (int)p.rank) + j, 0);
        st_release_gpu(p.mailbox_done + me, seq);
      }
      continue;
    }
    const int le = tk.y, tile = tk.z, col0 = tk.w;
    const bool shared = MOE_SHARED && le >= p.L;  // a shared expert's tile: this rank's tokens tile * BM..
    const int rows = shared ? (int)min((long long)BM, p.T - tile * BM) : __ldcg(p.window_rows + le * p.W + tile);
    const long long s0 = task_row<BM>(p, tk.x, le, tile);
    // the destinations are worked out after the GEMM, so that they hold no registers through it
    // (built before it, the float32 layer was 4% slower, one H200); the bf16 task, which must call
    // nothing, is handed them
    auto out1 = [&] {
      if (MOE_SHARED && shared)  // one source: all rows
        return SourceRows{dst_base, dst_base, dst_rows, tile * BM, 1 << 30, 0, (int)p.H};
      return SourceRows{dst_base, dst_spare, dst_rows, tile * BM, (int)p.stride, window_first_source<BM>(p, tile),
                        (int)p.H};
    };
#if MOE_WGMMA
    const SourceRows to = out1();
    gemm_task<BM, BN, BK>(p, tk.x, s0, rows, le, col0, [to] { return to; }, smem);
#else
    gemm_task<BM, BN, BK>(p, tk.x, s0, rows, le, col0, out1, smem);
#endif
    __syncthreads();
    take_ahead(seq);
    // a shared expert's tiles are counted after the routed experts' L x W
    const long long tile_id = shared ? p.L * p.W + (le - p.L) * p.WS + tile : le * p.W + tile;
    if (tid == 0) {
      __threadfence();
      if (tk.x == TASK_GEMM0) {
        last = atomicAdd(p.tile_done0 + tile_id, 1) == n0 - 1;
        if (last && shared) {
          enqueue(p, TASK_GEMM1, le, tile, n1, BN);
        } else if (last && QUEUE_BY_EXPERT) {
          // the tile's GEMM0 tasks (seen done by the count) before the expert's count: the task
          // ending the expert's last tile sees every tile's hidden rows written
          __threadfence();
          if (atomicAdd(p.expert_tiles + 2 * p.L + le, 1) + 1 == __ldcg(p.expert_tiles + le))
            enqueue_expert<BM>(p, TASK_GEMM1, le, n1, BN);
        } else if (last) {
          enqueue(p, TASK_GEMM1, le, tile, n1, BN);
        }
      } else {
        last = atomicAdd(p.tile_done1 + tile_id, 1) == n1 - 1;
      }
    }
    __syncthreads();
    if (tk.x == TASK_GEMM1 && !shared) {
      // each chunk's source counts GEMM1 column blocks: its combine task starts once all n1 have
      // landed. A stored chunk counts this task in; a chunk in outbuf is put home by the last task.
      bool fenced = false;
      const int s_first = window_first_source<BM>(p, tile);
      for (int s = s_first; s <= window_last_source<BM>(p, tile); ++s) {
        const Chunk c = chunk_in<BM>(p, s, __ldcg(p.in_count + s * p.L + le), tile);
        if (c.empty()) continue;
        const long long count = (p.rank * p.L + le) * p.CH + (tile - first_window<BM>(p, s));
        if (dst_direct[s - s_first] && tid == 0) {
#if MOE_BF16
          // A count on this GPU needs no system-scope fence: thread 0's fence above ordered the
          // block's stores before it at the scope of the subscriber that reads it. That fence cost a
          // bf16 GEMM1 task 1-4 us (its layers 1-6% slower, two H100s). The float32 build keeps one
          // path: with two, ptxas spilled 16 more bytes and its layers were 2-4% slower.
          const bool count_here = s == p.rank;
#else
          const bool count_here = false;
#endif
          if (count_here) {
            atomicAdd(reinterpret_cast<unsigned long long*>(p.sig_comb + count), 1ull);
          } else {
            if (!fenced) __threadfence_system();
            fenced = true;
            nvshmemx_signal_op(p.sig_comb + count, 1, NVSHMEM_SIGNAL_ADD, s);
          }
        } else if (!dst_direct[s - s_first] && last) {
          // the chunk's output is complete: send it home, into the (expert, slot) rows of its source
          __threadfence();
          const long long from = ((long long)le * p.P + s) * p.C + c.a;
          nvshmemx_putmem_signal_nbi_block(p.combox + (__ldcg(p.in_base + s * p.L + le) + c.a) * p.H,
                                           p.outbuf + from * p.H, (size_t)(c.b - c.a) * p.H * sizeof(elem_t),
                                           p.sig_comb + count, n1, NVSHMEM_SIGNAL_ADD, s);
        }
      }
      __syncthreads();  // every thread is done with the destinations before thread 0 fills the next task's
    }
    if (tid == 0) {
      // a shared expert is expert E + s, as in the plan
      log_event(p, tel, me, tk.x == TASK_GEMM0 ? EV_GEMM0 : EV_GEMM1, t0, now_ns(),
                shared ? (int)(p.E + le - p.L) : (int)(p.rank * p.L + le),
                shared ? (int)p.rank : window_first_source<BM>(p, tile), rows, tile, col0);
      st_release_gpu(p.mailbox_done + me, seq);
    }
  }
}

#if MOE_BF16
// y[t] = sum over kept choices j = 0..k-1, in that order, of weight_j * returned row_j, then the
// shared experts' rows (choices k..k+S-1, weight 1): the bf16
// rows widened to float32, each product rounded to float32 and then added (no fused multiply-add),
// as the reference's ordered sum of float32 contributions. (Scaled before the expert, a routed
// row's weight is 1 here.)
__device__ void combine_tokens(const Params& p, int tel) {
  const uint64_t t0 = now_ns();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int H8 = (int)(p.H / 8);  // 16-byte vectors of 8 bf16 per row
  constexpr int BATCH = MOELAB_REDUCE_BATCH;  // loads in flight per lane and row: the sum is bound by their latency
  for (long long t = (long long)blockIdx.x * nwarps + warp; t < p.T; t += p.n_proc * nwarps) {
    // lane j < K holds choice j's returned row (nullptr where dropped) and its combine weight
    const uint4* mine = nullptr;
    float w_mine = 0.f;
    if (lane < p.K) {
      int s = __ldcg(p.slot + t * p.K + lane);
      if (s >= 0) {
        const int e = __ldcg(p.expert + t * p.K + lane);
        const long long r = (long long)e * p.C + s;
        mine = reinterpret_cast<const uint4*>(p.combox + (__ldcg(p.count_base + e) + s) * p.H);
        w_mine = MOE_SCALE_BEFORE ? 1.f : __ldcg(p.row_weight + r);
      }
    } else if (MOE_SHARED && lane < p.K + p.S) {
      mine = reinterpret_cast<const uint4*>(p.shared_out + ((lane - p.K) * p.T + t) * p.H);
      w_mine = 1.f;
    }
    float4* out = reinterpret_cast<float4*>(p.y + t * p.H);
    for (int h0 = 0; h0 < H8; h0 += 32 * BATCH) {  // warp-uniform bounds: every lane reaches each shuffle
      const int h = h0 + lane;
      float acc[BATCH][8];
#pragma unroll
      for (int u = 0; u < BATCH; ++u)
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[u][q] = 0.f;
      for (int j = 0; j < p.K + (MOE_SHARED ? p.S : 0); ++j) {  // choice order: the fixed order of the golden
        const uint4* row = reinterpret_cast<const uint4*>(__shfl_sync(0xffffffffu, (unsigned long long)mine, j));
        const float w = __shfl_sync(0xffffffffu, w_mine, j);
        if (!row) continue;
        uint4 v[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u)
          if (h + 32 * u < H8) v[u] = __ldcg(row + h + 32 * u);
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 f = __bfloat1622float2(b2[q]);
            acc[u][2 * q] = __fadd_rn(acc[u][2 * q], __fmul_rn(w, f.x));
            acc[u][2 * q + 1] = __fadd_rn(acc[u][2 * q + 1], __fmul_rn(w, f.y));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < BATCH; ++u)
        if (h + 32 * u < H8) {
          out[2 * (h + 32 * u)] = make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
          out[2 * (h + 32 * u) + 1] = make_float4(acc[u][4], acc[u][5], acc[u][6], acc[u][7]);
        }
    }
  }
  if (threadIdx.x == 0) log_event(p, tel, blockIdx.x, EV_COMBINE, t0, now_ns(), -1, (int)p.rank, 0, -1, 0);
}
#else
// y[t] = sum over kept choices j = 0..k-1, in that order, of the weighted returned rows, then the
// shared experts' rows (choices k..k+S-1, weight 1).
__device__ void combine_tokens(const Params& p, int tel) {
  const uint64_t t0 = now_ns();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int H4 = (int)(p.H / 4);
  constexpr int BATCH = MOELAB_REDUCE_BATCH;
  for (long long t = (long long)blockIdx.x * nwarps + warp; t < p.T; t += p.n_proc * nwarps) {
    // lane j < K holds choice j's returned row (nullptr where dropped)
    const float4* mine = nullptr;
    if (lane < p.K) {
      int s = __ldcg(p.slot + t * p.K + lane);
      if (s >= 0) {
        const int e = __ldcg(p.expert + t * p.K + lane);
        mine = reinterpret_cast<const float4*>(p.combox + (__ldcg(p.count_base + e) + s) * p.H);
      }
    } else if (MOE_SHARED && lane < p.K + p.S) {
      mine = reinterpret_cast<const float4*>(p.shared_out + ((lane - p.K) * p.T + t) * p.H);
    }
    float4* out = reinterpret_cast<float4*>(p.y + t * p.H);
    for (int h0 = 0; h0 < H4; h0 += 32 * BATCH) {  // warp-uniform bounds: every lane reaches each shuffle
      const int h = h0 + lane;
      float4 acc[BATCH];
#pragma unroll
      for (int u = 0; u < BATCH; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < p.K + (MOE_SHARED ? p.S : 0); ++j) {  // choice order: the fixed order of the golden
        const float4* row = reinterpret_cast<const float4*>(__shfl_sync(0xffffffffu, (unsigned long long)mine, j));
        if (!row) continue;
        float4 v[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u)
          if (h + 32 * u < H4) v[u] = __ldcg(row + h + 32 * u);
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          acc[u].x += v[u].x;
          acc[u].y += v[u].y;
          acc[u].z += v[u].z;
          acc[u].w += v[u].w;
        }
      }
#pragma unroll
      for (int u = 0; u < BATCH; ++u)
        if (h + 32 * u < H4) out[h + 32 * u] = acc[u];
    }
  }
  if (threadIdx.x == 0) log_event(p, tel, blockIdx.x, EV_COMBINE, t0, now_ns(), -1, (int)p.rank, 0, -1, 0);
}
#endif
