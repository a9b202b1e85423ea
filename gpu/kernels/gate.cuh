// Gate and capacity, reproducing reference/routing.py exactly:
// - logits in float64 of the float32 operands on the FP64 tensor cores (products are exact, so only
//   the summation order can differ from NumPy's, far below any gap between two experts' logits),
//   plus the gate's bias (router_bias), minus the skew offset;
//   the bf16 kernel reads bf16 tokens and bf16-rounded gate weights, as the reference's bf16 path;
// - top-k best first, a tie to the lower expert index (4 lanes per token each keep their best
//   experts in order as they read them once, then merge their lists by shuffles; 8 choices a
//   round); group-limited
//   (n_group > 1): only inside the topk_group best groups, a group scored by its best expert's score
//   (the sum of its best two for sigmoid_bias, where groups have two), a tie to the lower group;
// - weights by the config's gate variant, in float64, times routed_scaling;
// - slots per expert in priority order (choice j first, then token index), dropped at >= C
//   (capacity_phase, from each item's row counts).
#pragma once
#include "common.cuh"
#include "tile_gemm.cuh"  // cp_async16, cp_async_commit, cp_async_wait, smem_addr

constexpr int GATE_TOKENS = MOELAB_GATE_TOKENS;    // tokens per gate work item (sim.costs owns these four)
constexpr int GATE_EXPERTS = MOELAB_GATE_EXPERTS;  // experts per pass over H
constexpr int GATE_DEPTH = MOELAB_GATE_DEPTH;      // slice of H per pipeline stage (gate_scores says why 64)
constexpr int GATE_STAGES = 3;        // slices in shared memory: two in flight while one is multiplied
constexpr int GATE_SMEM_LOGITS = MOELAB_GATE_SMEM_LOGITS;  // experts whose logits selection reads from smem
constexpr int GATE_MAX_SPLITS = MOELAB_GATE_MAX_SPLITS;  // blocks that may share one item's H (few tokens)
constexpr int GATE_MAX_GROUPS = MOELAB_MAX_GROUPS;  // n_group of group-limited top-k, at most (a bit each in a mask)
constexpr int MAX_TOP_K = MOELAB_MAX_TOP_K;  // top_k, at most (gpu/layout.py checks both)
static_assert(GATE_MAX_GROUPS <= 32, "a group is a bit of a 32-bit mask");
// Stages hold the operands as stored (elem_t tokens, float gate weights; converted to double as
// the mma fragments are read). Row strides, in elements, make a fragment read (8 rows x 4 columns
// of A, 4 rows x 8 columns of B) hit 32 different banks, and keep rows 16-byte aligned for cp.async.
constexpr int GATE_XS_LD = GATE_DEPTH + (sizeof(elem_t) == 4 ? 4 : 8);
constexpr int GATE_WS_LD = GATE_EXPERTS + 8;
constexpr int GATE_STAGE_BYTES = GATE_TOKENS * GATE_XS_LD * (int)sizeof(elem_t) + GATE_DEPTH * GATE_WS_LD * 4;
constexpr int GATE_LOGIT_BYTES = GATE_TOKENS * GATE_SMEM_LOGITS * 8;  // after the stages are drained
constexpr int GATE_SMEM_BYTES = GATE_STAGES * GATE_STAGE_BYTES > GATE_LOGIT_BYTES ? GATE_STAGES * GATE_STAGE_BYTES
                                                                                   : GATE_LOGIT_BYTES;
constexpr int GATE_SMEM_DOUBLES = (GATE_SMEM_BYTES + 7) / 8;
// each 128-thread unit of a block (common.cuh) has a slice of the block's buffer of its own
constexpr int GATE_BLOCK_SMEM_BYTES = GATE_SMEM_DOUBLES * 8 * BLOCK_WARPGROUPS;
__device__ __forceinline__ unsigned char* gate_unit_smem(unsigned char* smem) {
  return smem + threadIdx.x / UNIT_THREADS * (GATE_SMEM_DOUBLES * 8);
}

// d += a . b on the FP64 tensor cores: a 16x8 by 8x8 product per warp, one of sm_90's own shapes (on
// one H100 the bf16 default's gate phase took 82 us with it, 115 with Ampere's m8n8k4 and 86 with
// m16n8k16; 1K tokens 49 against 54, 16K 156 against 224). With g = lane / 4 and q = lane % 4, lane holds
// a = A[g + 8 {0, 1}][q + 4 {0, 0, 1, 1}] (a[h + 2 j] at row g + 8 h, column q + 4 j),
// b = B[q + 4 {0, 1}][g] and d = D[g + 8 {0, 0, 1, 1}][2 q + {0, 1, 0, 1}]; every product and sum
// is an IEEE fp64 fma.
__device__ __forceinline__ void dmma_16x8x8(double (&d)[4], const double (&a)[4], const double (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
}

__device__ __forceinline__ void cp_async4(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem), "l"(gmem), "r"(valid ? 4 : 0));
}

// Logits of tokens t0.. (GATE_TOKENS of them) against every expert, GATE_EXPERTS per pass, over
// the hidden range [h_lo, h_hi): with `partial` null that is all of H and the logits (offset
// subtracted) go to p.logits; else the raw sums over the range go to partial[t][e] (split-K).
// Warp w computes all GATE_TOKENS tokens x experts [16 w, 16 w + 16) of the pass: 2 x 2 mma tiles.
// The slices of every pass form one cp.async pipeline, GATE_STAGES deep: the phase is bound by load
// latency, not arithmetic, so slices are 64 deep (half the syncs and waits of 32; docs/notes/gate.md).
// Copies past T, H or E are zero-filled by the copy itself. The logits of E <= GATE_SMEM_LOGITS
// experts are also left in shared memory (over the drained stages) for the selection.
__device__ void gate_scores(const Params& p, int t0, int h_lo, int h_hi, unsigned char* smem, double* partial) {
  const int tid = unit_tid(), lane = tid % 32, warp = tid / 32;
  const int row = lane / 4, quad = lane % 4;
  constexpr int MT = GATE_TOKENS / 16, NT = GATE_EXPERTS / 4 / 8;  // mma tiles per warp
  constexpr int XV = 16 / (int)sizeof(elem_t);                       // tokens' elements per 16-byte copy
  constexpr int X_COPIES = GATE_TOKENS * GATE_DEPTH / XV / UNIT_THREADS;
  constexpr int W_COPIES = GATE_DEPTH * GATE_EXPERTS / 4 / UNIT_THREADS;
  static_assert(GATE_EXPERTS == 4 * 8 * NT && GATE_TOKENS % 16 == 0 && GATE_DEPTH % 8 == 0, "gate item shape");
  static_assert(X_COPIES * XV * UNIT_THREADS == GATE_TOKENS * GATE_DEPTH &&
                    W_COPIES * 4 * UNIT_THREADS == GATE_DEPTH * GATE_EXPERTS,
                "every thread issues the same number of copies");
  // H is a multiple of tile_n (8 for float32, 16 for bf16), so a token row's 16-byte chunks are
  // whole and aligned; gate weight rows are only when E % 4 == 0 (else 4-byte copies)
  const int T = (int)p.T, H = (int)p.H, E = (int)p.E;  // each fits an int; offsets are taken in 64 bits
  const elem_t* __restrict__ x = p.x;
  const float* __restrict__ wg = p.wg;
  const bool w_vec = E % 4 == 0;
  const int per_pass = ceil_div(h_hi - h_lo, GATE_DEPTH), slices = per_pass * ceil_div(E, GATE_EXPERTS);
  auto xs_of = [&](int stage) { return reinterpret_cast<elem_t*>(smem + stage * GATE_STAGE_BYTES); };
  auto ws_of = [&](int stage) {
    return reinterpret_cast<float*>(smem + stage * GATE_STAGE_BYTES + GATE_TOKENS * GATE_XS_LD * sizeof(elem_t));
  };
  auto issue = [&](int slice) {
    if (slice < slices) {
      const int e0 = slice / per_pass * GATE_EXPERTS, h0 = h_lo + slice % per_pass * GATE_DEPTH;
      const int stage = slice % GATE_STAGES;
      elem_t* xs = xs_of(stage);
      float* ws = ws_of(stage);
#pragma unroll
      for (int u = 0; u < X_COPIES; ++u) {
        const int v = tid + UNIT_THREADS * u, tok = v / (GATE_DEPTH / XV), h = (v % (GATE_DEPTH / XV)) * XV;
        const bool in = t0 + tok < T && h0 + h < h_hi;
        cp_async16(smem_addr(xs + tok * GATE_XS_LD + h), in ? x + (long long)(t0 + tok) * H + h0 + h : x, in);
      }
      if (w_vec) {
#pragma unroll
        for (int u = 0; u < W_COPIES; ++u) {
          const int v = tid + UNIT_THREADS * u, k = v / (GATE_EXPERTS / 4), e = (v % (GATE_EXPERTS / 4)) * 4;
          const bool in = h0 + k < h_hi && e0 + e < E;
          cp_async16(smem_addr(ws + k * GATE_WS_LD + e), in ? wg + (long long)(h0 + k) * E + e0 + e : wg, in);
        }
      } else {
#pragma unroll 4
        for (int u = 0; u < 4 * W_COPIES; ++u) {
          const int v = tid + UNIT_THREADS * u, k = v / GATE_EXPERTS, e = v % GATE_EXPERTS;
          const bool in = h0 + k < h_hi && e0 + e < E;
          cp_async4(smem_addr(ws + k * GATE_WS_LD + e), in ? wg + (long long)(h0 + k) * E + e0 + e : wg, in);
        }
      }
    }
    cp_async_commit();  // empty groups keep the count uniform, so wait_group<STAGES-2> is exact
  };
  for (int s = 0; s < GATE_STAGES - 1; ++s) issue(s);
  double acc[MT][NT][4];
  for (int s = 0; s < slices; ++s) {
    if (s % per_pass == 0)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0;
    cp_async_wait<GATE_STAGES - 2>();
    unit_sync();  // slice s has landed for all threads; slice s - 1's stage is free to refill
    issue(s + GATE_STAGES - 1);
    const elem_t* xs = xs_of(s % GATE_STAGES);
    const float* ws = ws_of(s % GATE_STAGES);
#pragma unroll
    for (int k0 = 0; k0 < GATE_DEPTH; k0 += 8) {
      double a[MT][4], b[NT][2];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          a[m][i] = (double)to_f32(xs[(16 * m + row + 8 * (i % 2)) * GATE_XS_LD + k0 + quad + 4 * (i / 2)]);
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) b[n][j] = (double)ws[(k0 + quad + 4 * j) * GATE_WS_LD + 16 * warp + 8 * n + row];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n) dmma_16x8x8(acc[m][n], a[m], b[n]);
    }
    if (s % per_pass == per_pass - 1) {
      const int e0 = s / per_pass * GATE_EXPERTS;
      const bool keep = !partial && E <= GATE_SMEM_LOGITS;  // the only pass: drain before reusing smem
      if (keep) {
        cp_async_wait<0>();
        unit_sync();
      }
      double* logits_smem = reinterpret_cast<double*>(smem);
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int tok = 16 * m + row + 8 * (c / 2), t = t0 + tok, e = e0 + 16 * warp + 8 * n + 2 * quad + c % 2;
            if (t < T && e < E && partial) {
              partial[(long long)t * E + e] = acc[m][n][c];
            } else if (t < T && e < E) {
              const double z = acc[m][n][c] + p.wg_bias[e] - p.logit_offset[e];
              p.logits[(long long)t * E + e] = z;
              if (keep) logits_smem[tok * E + e] = z;
            }
          }
    }
  }
  cp_async_wait<0>();
}

__device__ __forceinline__ double sigmoid64(double z) { return 1.0 / (1.0 + exp(-z)); }

constexpr int SELECT_LANES = MOELAB_SELECT_LANES;  // lanes that share one token's selection
static_assert(SELECT_LANES * GATE_TOKENS == UNIT_THREADS, "a gate unit's threads: SELECT_LANES per token");
static_assert((SELECT_LANES & (SELECT_LANES - 1)) == 0, "the selection's shuffles halve the lanes");

// Whether candidate a (score sa) ranks before b (score sb): the higher score, a tie to the lower
// index; -1 is no candidate, ranked after every one. The one order of the selection and the groups.
__device__ __forceinline__ bool ranks_before(int a, double sa, int b, double sb) {
  return a >= 0 && (b < 0 || sa > sb || (sa == sb && a < b));
}

// The better of two candidates into (best, score)
__device__ __forceinline__ void keep_better(int& best, double& score, int other, double other_score) {
  if (ranks_before(other, other_score, best, score)) {
    best = other;
    score = other_score;
  }
}

// An expert's selection score: its logit for the softmax gates and sigmoid_topk (softmax and sigmoid
// keep the logits' order), sigmoid(logit) + its selection bias for sigmoid_bias.
__device__ __forceinline__ double gate_score(const Params& p, const double* z, int e) {
  return p.gate_kind == GATE_SIGMOID_BIAS ? sigmoid64(z[e]) + p.gate_bias[e] : z[e];
}

// Across the SELECT_LANES lanes of a token: the best (score, expert) of the lanes' candidates.
__device__ __forceinline__ void combine_best(int& best, double& score) {
#pragma unroll
  for (int d = 1; d < SELECT_LANES; d *= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, best, d);
    const double other_score = __shfl_xor_sync(0xffffffffu, score, d);
    keep_better(best, score, other, other_score);
  }
}

// Group-limited top-k: the mask of the topk_group best of n_group groups of E / n_group experts, a
// group scored by its best score (the sum of its best two for sigmoid_bias where groups have two,
// DeepSeek-V3), a tie to the lower group. Every lane of the token ends with the same mask: the max
// and the best two of the lanes' shares combine to the same values on each.
__device__ unsigned gate_groups(const Params& p, const double* z, int part) {
  const int G = (int)p.n_group, per = (int)(p.E / p.n_group);
  const bool two = p.gate_kind == GATE_SIGMOID_BIAS && per > 1;
  double group_score[GATE_MAX_GROUPS];
  for (int g = 0; g < G; ++g) {
    double a1 = -INFINITY, a2 = -INFINITY;  // this lane's best two scores of the group
    for (int e = g * per + part; e < (g + 1) * per; e += SELECT_LANES) {
      const double s = gate_score(p, z, e);
      if (s > a1) {
        a2 = a1;
        a1 = s;
      } else if (s > a2) {
        a2 = s;
      }
    }
#pragma unroll
    for (int d = 1; d < SELECT_LANES; d *= 2) {
      const double b1 = __shfl_xor_sync(0xffffffffu, a1, d), b2 = __shfl_xor_sync(0xffffffffu, a2, d);
      a2 = fmax(fmin(a1, b1), fmax(a2, b2));
      a1 = fmax(a1, b1);
    }
    group_score[g] = two ? a1 + a2 : a1;
  }
  unsigned mask = 0;
  for (int r = 0; r < (int)p.topk_group; ++r) {
    int best = -1;
    double best_score = 0.0;
    for (int g = 0; g < G; ++g)
      if (!(mask >> g & 1u)) keep_better(best, best_score, g, group_score[g]);
    if (best >= 0) mask |= 1u << best;  // none only for a lane past T, whose logits are not a token's
  }
  return mask;
}

// A lane's best L candidates, best first (the higher score, a tie to the lower expert; -1: none),
// in registers: an offered candidate sinks past the better ones and pushes the rest down one place.
template <int L>
struct TopList {
  int expert[L];
  double score[L];
  __device__ TopList() {
#pragma unroll
    for (int i = 0; i < L; ++i) expert[i] = -1, score[i] = 0.0;
  }
  __device__ void offer(int e, double s) {
#pragma unroll
    for (int i = 0; i < L; ++i) {
      const int b = expert[i];
      const double bs = score[i];
      if (ranks_before(e, s, b, bs)) {
        expert[i] = e, score[i] = s;
        e = b, s = bs;
      }
    }
  }
  // the head has been chosen: the rest move up
  __device__ void pop() {
#pragma unroll
    for (int i = 0; i + 1 < L; ++i) expert[i] = expert[i + 1], score[i] = score[i + 1];
    expert[L - 1] = -1;
  }
};

// A chosen expert's weight before the variant's normalization: its softmax over all E logits
// (max m, sum s), its exp against the best chosen logit (top) for topk_softmax, its sigmoid else
__device__ __forceinline__ double gate_raw_weight(const Params& p, double z, double m, double s, double top) {
  if (p.gate_kind == GATE_SOFTMAX_TOPK || p.gate_kind == GATE_SOFTMAX_TOPK_RENORM) return exp(z - m) / s;
  if (p.gate_kind == GATE_TOPK_SOFTMAX) return exp(z - top);
  return sigmoid64(z);
}

// Top-k and weights of one token from its float64 logits z (shared memory when E is small), by
// SELECT_LANES neighbouring lanes, in rounds of up to L choices: lane `part` reads its experts part,
// part + 4, ... once a round, keeping its best L of those ranked after the last choice, then the
// round takes the best head of the lanes' lists by shuffles, one choice after another (the order
// is total, so the lists' merge is the top of all) into choices (-1 past T); the first lane then
// weighs them. All lanes of the warp take part (`valid` false: nothing else written).
template <int L>
__device__ void gate_select_top(const Params& p, int t, const double* z, int part, bool valid, int* choices) {
  const int E = (int)p.E, K = (int)p.K, per = (int)(p.E / p.n_group);
  const unsigned groups = p.n_group > 1 ? gate_groups(p, z, part) : 1u;
  int last = -1;  // the last choice, and its score: a later round's candidates rank after it
  double last_score = 0.0;
  for (int done = 0; done < K; done += L) {
    TopList<L> mine;
#pragma unroll 4
    for (int e = part; e < E; e += SELECT_LANES)
      if (groups >> (e / per) & 1u) {
        const double sc = gate_score(p, z, e);
        if (last < 0 || ranks_before(last, last_score, e, sc)) mine.offer(e, sc);
      }
#pragma unroll
    for (int j = 0; j < L; ++j)
      if (done + j < K) {  // K is the warp's: the shuffles stay converged
        int best = mine.expert[0];
        double best_score = mine.score[0];
        combine_best(best, best_score);
        if (part == 0) choices[done + j] = best;  // the same on every lane of the token
        if (best >= 0 && mine.expert[0] == best) mine.pop();
        last = best, last_score = best_score;
      }
  }
  double m = -INFINITY, s = 0.0;
  if (p.gate_kind == GATE_SOFTMAX_TOPK || p.gate_kind == GATE_SOFTMAX_TOPK_RENORM) {
    for (int e = part; e < E; e += SELECT_LANES) m = fmax(m, z[e]);
#pragma unroll
    for (int d = 1; d < SELECT_LANES; d *= 2) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, d));
    for (int e = part; e < E; e += SELECT_LANES) s += exp(z[e] - m);
#pragma unroll
    for (int d = 1; d < SELECT_LANES; d *= 2) s += __shfl_xor_sync(0xffffffffu, s, d);
  }
  if (part != 0) return;
  if (!valid) {
    for (int j = 0; j < K; ++j) choices[j] = -1;
    return;
  }
  double top = z[choices[0]], total = 0.0;
  for (int j = 1; j < K; ++j) top = fmax(top, z[choices[j]]);
  for (int j = 0; j < K; ++j) total += gate_raw_weight(p, z[choices[j]], m, s, top);
  for (int j = 0; j < K; ++j) {
    double w = gate_raw_weight(p, z[choices[j]], m, s, top);
    if (p.gate_kind == GATE_SOFTMAX_TOPK_RENORM || p.gate_kind == GATE_TOPK_SOFTMAX)
      w /= total;
    else if (p.gate_kind == GATE_SIGMOID_BIAS)
      w /= total + 1e-20;  // as Hugging Face's DeepSeek-V3
    p.expert[(long long)t * K + j] = choices[j];
    p.weight[(long long)t * K + j] = w * p.routed_scaling;
  }
}

// The selection with the shortest list that holds k, or rounds of the longest (each expert read is
// compared at every place of the list, and a longer list costs the whole kernel registers)
constexpr int SELECT_LIST_0 = MOELAB_SELECT_LIST_0, SELECT_LIST_1 = MOELAB_SELECT_LIST_1;
constexpr int SELECT_ROUND = MOELAB_SELECT_LIST_2;  // sim.costs.SELECT_LISTS
static_assert(SELECT_LIST_0 < SELECT_LIST_1 && SELECT_LIST_1 < SELECT_ROUND, "lists of growing places");
__device__ void gate_select(const Params& p, int t, const double* z, int part, bool valid, int* choices) {
  if (p.K <= SELECT_LIST_0)
    gate_select_top<SELECT_LIST_0>(p, t, z, part, valid, choices);
  else if (p.K <= SELECT_LIST_1)
    gate_select_top<SELECT_LIST_1>(p, t, z, part, valid, choices);
  else
    gate_select_top<SELECT_ROUND>(p, t, z, part, valid, choices);
}

// The item's choices, token-major (K per token, -1 past T), in shared memory past the logits
constexpr int GATE_CHOICE_OFFSET = GATE_LOGIT_BYTES;
static_assert(GATE_CHOICE_OFFSET + GATE_TOKENS * MAX_TOP_K * 4 <= GATE_SMEM_BYTES, "the choices of K <= MAX_TOP_K fit");

// A gate work item's selections (SELECT_LANES threads per token) from its logits (in shared memory
// for E <= GATE_SMEM_LOGITS, else in p.logits), then its row counts: p.slot_base[(e K + j) items
// + item] = the item's tokens whose choice j is expert e (the capacity phase's scan input).
__device__ void gate_choose(const Params& p, int item, unsigned char* smem) {
  const int t0 = item * GATE_TOKENS, tok = unit_tid() / SELECT_LANES, t = t0 + tok;
  const bool valid = t < p.T;
  const int E = (int)p.E, K = (int)p.K, items = ceil_div((int)p.T, GATE_TOKENS);
  const double* z = p.E <= GATE_SMEM_LOGITS ? reinterpret_cast<const double*>(smem) + tok * p.E
                                            : p.logits + (long long)(valid ? t : t0) * p.E;
  int* choices = reinterpret_cast<int*>(smem + GATE_CHOICE_OFFSET);
  gate_select(p, t, z, unit_tid() % SELECT_LANES, valid, choices + tok * K);
  unit_sync();
  for (int q = unit_tid(); q < K * E; q += UNIT_THREADS) {
    const int j = q / E, e = q % E;
    int n = 0;
    for (int i = 0; i < GATE_TOKENS; ++i) n += choices[i * K + j] == e;
    p.slot_base[((long long)e * K + j) * items + item] = n;
  }
  unit_sync();  // the shared logits and choices are read before the next item overwrites them
}

// How many units (common.cuh) share one item's H: enough that every unit has a share when the
// tokens are few (at most the capacity of p.gate_partial), each an equal number of whole GATE_DEPTH slices,
// none empty.
__device__ __forceinline__ int gate_splits(const Params& p, int items) {
  const int slices = ceil_div(p.H, GATE_DEPTH);
  const int want = max(1, min(min(unit_count() / items, slices), (int)p.gate_splits));
  return ceil_div(slices, ceil_div(slices, want));
}

// The partial logits' sums (split order, the same every run), plus the gate's bias, minus the skew
// offset, into p.logits:
// every thread of the grid a few (token, expert) entries, all their splits' loads in flight together.
// Against one unit per item adding its tokens' partials, one split after another, the 1K-token gate
// phase went 50 -> 40 us (float32) and 46 -> 41 (bf16) on one H200, 4K 67 -> 59 (float32).
__device__ void gate_sum_partials(const Params& p, int splits) {
  const long long TE = p.T * p.E, step = (long long)gridDim.x * blockDim.x;
  for (long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x; at < TE; at += step) {
    double part[GATE_MAX_SPLITS];
#pragma unroll
    for (int s = 0; s < GATE_MAX_SPLITS; ++s) part[s] = s < splits ? __ldcg(p.gate_partial + s * TE + at) : 0.0;
    double z = 0.0;
#pragma unroll
    for (int s = 0; s < GATE_MAX_SPLITS; ++s)
      if (s < splits) z += part[s];
    p.logits[at] = z + p.wg_bias[at % p.E] - p.logit_offset[at % p.E];
  }
}

// The gate of every token, on all units: each GATE_TOKENS-token item's logits, then its top-k.
// With few items the H range of an item is split over units, whose partial sums meet after a
// grid barrier (gate_sum_partials), and after a second one each item is selected from.
// Returns the grid barriers it passed (0 or 2), -1 if a barrier was given up.
__device__ int gate_phase(const Params& p, unsigned char* block_smem) {
  unsigned char* smem = gate_unit_smem(block_smem);
  const int items = ceil_div(p.T, GATE_TOKENS), splits = gate_splits(p, items);
  const int depth = ceil_div(ceil_div(p.H, GATE_DEPTH), splits) * GATE_DEPTH;  // H per split
  const long long TE = p.T * p.E;
  // one loop for both cases: the gate's scores are inlined once (a second copy spilled registers)
  for (int u = unit_index(); u < items * splits; u += unit_count()) {
    const int item = u / splits, part = u % splits;
    const int h_lo = min(part * depth, (int)p.H), h_hi = min(h_lo + depth, (int)p.H);
    gate_scores(p, item * GATE_TOKENS, h_lo, h_hi, smem, splits > 1 ? p.gate_partial + part * TE : nullptr);
    unit_sync();  // the unit's logits are written before its threads read them back
    if (splits == 1) gate_choose(p, item, smem);
  }
  if (splits == 1) return 0;
  if (!grid_barrier(p, 0)) return -1;
  gate_sum_partials(p, splits);
  if (!grid_barrier(p, 1)) return -1;
  const int E = (int)p.E;
  double* logits_smem = reinterpret_cast<double*>(smem);
  for (int item = unit_index(); item < items; item += unit_count()) {
    if (E <= GATE_SMEM_LOGITS) {
      const long long t0 = (long long)item * GATE_TOKENS, n = min((long long)GATE_TOKENS, p.T - t0) * E;
      for (int i = unit_tid(); i < n; i += UNIT_THREADS) logits_smem[i] = __ldcg(p.logits + t0 * E + i);
      unit_sync();
    }
    gate_choose(p, item, smem);
  }
  return 2;
}

// out[i] = in[0] + ... + in[i - 1] for i < n, by one unit (out may be in): 128 at a time, a warp
// scan each, the unit's carry between them. Returns the total.
__device__ int unit_exclusive_scan(const int* in, int* out, int n, int* warp_sums, int& carry) {
  const int tid = unit_tid(), lane = tid % 32, warp = tid / 32;
  if (tid == 0) carry = 0;
  unit_sync();
  for (int i0 = 0; i0 < n; i0 += UNIT_THREADS) {
    const int i = i0 + tid, v = i < n ? __ldcg(in + i) : 0;
    const int incl = warp_inclusive_sum(v);
    if (lane == 31) warp_sums[warp] = incl;
    unit_sync();
    int before = carry;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    if (i < n) out[i] = before + incl - v;
    unit_sync();  // every thread has read carry and warp_sums
    if (tid == 0) carry += warp_sums[0] + warp_sums[1] + warp_sums[2] + warp_sums[3];
    unit_sync();
  }
  return carry;
}

// Capacity: slots per expert in priority order (choice j first, then token index), from the
// items' row counts (gate_choose), in two steps between grid barriers:
// 1. per expert e (one block each): the exclusive scan of its counts over (j, item), in place,
//    so p.slot_base[(e K + j) items + item] becomes the slots of e taken before that item's
//    tokens of choice j; p.counts[e] = the total, at most C;
// 2. per item (the block of its gate item): each token's slot = that base + the item's earlier
//    tokens with the same choice j of the same expert; dropped (-1) at >= C. The last unit first
//    scans the counts into p.count_base (the experts' rows in staging and combox, read after the
//    grid barrier that follows).
// (One block scanning every (token, choice) per expert took ~50 us at 8K tokens, ~100 at 16K.)
// Returns the grid barriers passed in all, -1 if one was given up.
__device__ int capacity_phase(const Params& p, unsigned char* smem, int barriers) {
  __shared__ int unit_warp_sums[BLOCK_WARPGROUPS][4];
  __shared__ int unit_carry[BLOCK_WARPGROUPS];
  int* warp_sums = unit_warp_sums[threadIdx.x / UNIT_THREADS];
  int& carry = unit_carry[threadIdx.x / UNIT_THREADS];
  const int tid = unit_tid();
  const int E = (int)p.E, K = (int)p.K, items = ceil_div((int)p.T, GATE_TOKENS), n = K * items;
  if (!grid_barrier(p, barriers++)) return -1;
  for (int e = unit_index(); e < E; e += unit_count()) {
    int* base = p.slot_base + (long long)e * n;
    const int total = unit_exclusive_scan(base, base, n, warp_sums, carry);
    if (tid == 0) p.counts[e] = total < p.C ? total : (int)p.C;
  }
  if (!grid_barrier(p, barriers++)) return -1;
  if (unit_index() == unit_count() - 1) unit_exclusive_scan(p.counts, p.count_base, E, warp_sums, carry);
  int* choices = reinterpret_cast<int*>(gate_unit_smem(smem));
  for (int item = unit_index(); item < items; item += unit_count()) {
    const long long t0 = (long long)item * GATE_TOKENS;
    for (int i = tid; i < GATE_TOKENS * K; i += UNIT_THREADS)
      choices[i] = t0 + i / K < p.T ? __ldcg(p.expert + t0 * K + i) : -1;
    unit_sync();
    for (int i = tid; i < GATE_TOKENS * K; i += UNIT_THREADS) {
      const int tok = i / K, j = i % K, e = choices[i];
      if (e < 0) continue;
      int rank = 0;
      for (int u = 0; u < tok; ++u) rank += choices[u * K + j] == e;
      const long long t = t0 + tok, pos = __ldcg(p.slot_base + ((long long)e * K + j) * items + item) + rank;
      const int s = pos < p.C ? (int)pos : -1;
      p.slot[t * K + j] = s;
      if (s >= 0) {
        const long long r = (long long)e * p.C + s;
        p.row_token[r] = (int)t;
        p.row_choice[r] = j;
        p.row_weight[r] = (float)__ldcg(p.weight + t * K + j);
      }
    }
    unit_sync();  // the choices are read before the next item's overwrite them
  }
  return barriers;
}
