// Gate and capacity, reproducing reference/routing.py exactly:
// - logits in float64 of the float32 operands (products are exact, so only the summation order
//   can differ from NumPy's, far below any gap between two experts' logits), minus the skew offset;
//   the bf16 kernel reads bf16 tokens and bf16-rounded gate weights, as the reference's bf16 path;
// - top-k best first, a tie to the lower expert index (strict > while scanning upwards);
// - weights by the config's gate variant, in float64;
// - slots per expert in priority order (choice j first, then token index), dropped at >= C.
#pragma once
#include "common.cuh"

constexpr int GATE_TOKENS = 32;       // tokens per gate work item
constexpr int GATE_EXPERTS = 64;      // experts per pass over H
constexpr int GATE_DEPTH = 32;        // slice of H held in shared memory
constexpr int GATE_SMEM_LOGITS = 64;  // experts whose logits the selection reads from shared memory
// Row strides of the staged slices, in doubles: 4 more than a multiple of 16, so the 16 lanes of a
// half-warp reading an mma fragment (4 rows x 4 columns) hit 16 different 8-byte banks.
constexpr int GATE_XS_LD = GATE_DEPTH + 4, GATE_WS_LD = GATE_EXPERTS + 4;
constexpr int GATE_SCORE_DOUBLES = GATE_TOKENS * GATE_XS_LD + GATE_DEPTH * GATE_WS_LD;
constexpr int GATE_SMEM_DOUBLES = GATE_SCORE_DOUBLES + GATE_TOKENS * GATE_SMEM_LOGITS;

// d += a . b on the FP64 tensor cores: an 8x4 by 4x8 product per warp. Lane l holds a = A[l/4][l%4],
// b = B[l%4][l/4] and d = D[l/4][2 (l%4) + {0, 1}]; every product and sum is an IEEE fp64 fma.
__device__ __forceinline__ void dmma_8x8x4(double (&d)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a), "d"(b));
}

// Logits of tokens t0.. (GATE_TOKENS of them) against every expert, GATE_EXPERTS per pass.
// Warp w computes all GATE_TOKENS tokens x experts [16 w, 16 w + 16) of the pass: 4 x 2 mma tiles.
__device__ void gate_scores(const Params& p, int t0, double* smem) {
  double* xs = smem;                          // [GATE_TOKENS][GATE_XS_LD]
  double* ws = smem + GATE_TOKENS * GATE_XS_LD; // [GATE_DEPTH][GATE_WS_LD]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row = lane / 4, quad = lane % 4;
  constexpr int MT = GATE_TOKENS / 8, NT = GATE_EXPERTS / 4 / 8;  // mma tiles per warp
  constexpr int XN = GATE_TOKENS * GATE_DEPTH / 128, WN = GATE_DEPTH * GATE_EXPERTS / 128;
  static_assert(GATE_EXPERTS == 4 * 8 * NT && GATE_TOKENS % 8 == 0 && GATE_DEPTH % 4 == 0, "gate item shape");
  float xv[XN], wv[WN];
  // a slice's loads are all issued before any use (one latency, not XN + WN), and the next
  // slice's loads are in flight while the current slice is multiplied
  auto load = [&](int e0, int h0) {
#pragma unroll
    for (int u = 0; u < XN; ++u) {
      int v = tid + 128 * u, tt = t0 + v / GATE_DEPTH, hh = h0 + v % GATE_DEPTH;
      xv[u] = (tt < p.T && hh < p.H) ? to_f32(__ldg(p.x + (long long)tt * p.H + hh)) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < WN; ++u) {
      int v = tid + 128 * u, hh = h0 + v / GATE_EXPERTS, e = e0 + v % GATE_EXPERTS;
      wv[u] = (hh < p.H && e < p.E) ? __ldg(p.wg + (long long)hh * p.E + e) : 0.f;
    }
  };
  load(0, 0);
  for (int e0 = 0; e0 < p.E; e0 += GATE_EXPERTS) {
    double acc[MT][NT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n) acc[m][n][0] = acc[m][n][1] = 0.0;
    for (int h0 = 0; h0 < p.H; h0 += GATE_DEPTH) {
#pragma unroll
      for (int u = 0; u < XN; ++u) {
        int v = tid + 128 * u;
        xs[(v / GATE_DEPTH) * GATE_XS_LD + v % GATE_DEPTH] = (double)xv[u];
      }
#pragma unroll
      for (int u = 0; u < WN; ++u) {
        int v = tid + 128 * u;
        ws[(v / GATE_EXPERTS) * GATE_WS_LD + v % GATE_EXPERTS] = (double)wv[u];
      }
      __syncthreads();
      if (h0 + GATE_DEPTH < p.H) load(e0, h0 + GATE_DEPTH);
      else if (e0 + GATE_EXPERTS < p.E) load(e0 + GATE_EXPERTS, 0);
#pragma unroll
      for (int k0 = 0; k0 < GATE_DEPTH; k0 += 4) {
        double a[MT], b[NT];
#pragma unroll
        for (int m = 0; m < MT; ++m) a[m] = xs[(8 * m + row) * GATE_XS_LD + k0 + quad];
#pragma unroll
        for (int n = 0; n < NT; ++n) b[n] = ws[(k0 + quad) * GATE_WS_LD + 16 * warp + 8 * n + row];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int n = 0; n < NT; ++n) dmma_8x8x4(acc[m][n], a[m], b[n]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int tok = 8 * m + row, t = t0 + tok, e = e0 + 16 * warp + 8 * n + 2 * quad + c;
          if (t < p.T && e < p.E) {
            double z = acc[m][n][c] - p.logit_offset[e];
            p.logits[(long long)t * p.E + e] = z;
            if (p.E <= GATE_SMEM_LOGITS) smem[GATE_SCORE_DOUBLES + tok * p.E + e] = z;
          }
        }
  }
}

__device__ __forceinline__ double sigmoid64(double z) { return 1.0 / (1.0 + exp(-z)); }

// Top-k and weights of one token from its float64 logits z (shared memory when E is small).
__device__ void gate_select(const Params& p, int t, const double* z) {
  const bool sig = p.gate_kind == GATE_SIGMOID_BIAS;
  int chosen[16];  // K <= 16, checked on the host
  for (int j = 0; j < p.K; ++j) {
    int best = -1;
    double best_score = 0.0;
    for (int e = 0; e < p.E; ++e) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= chosen[q] == e;
      if (taken) continue;
      double s = sig ? sigmoid64(z[e]) + p.gate_bias[e] : z[e];
      if (best < 0 || s > best_score) {
        best = e;
        best_score = s;
      }
    }
    chosen[j] = best;
    p.expert[(long long)t * p.K + j] = best;
  }
  double w[16], total = 0.0;
  if (p.gate_kind == GATE_SOFTMAX_TOPK || p.gate_kind == GATE_SOFTMAX_TOPK_RENORM) {
    double m = z[0];
    for (int e = 1; e < p.E; ++e) m = fmax(m, z[e]);
    double s = 0.0;
    for (int e = 0; e < p.E; ++e) s += exp(z[e] - m);
    for (int j = 0; j < p.K; ++j) w[j] = exp(z[chosen[j]] - m) / s;
    if (p.gate_kind == GATE_SOFTMAX_TOPK_RENORM) {
      for (int j = 0; j < p.K; ++j) total += w[j];
      for (int j = 0; j < p.K; ++j) w[j] /= total;
    }
  } else if (p.gate_kind == GATE_TOPK_SOFTMAX) {
    double m = z[chosen[0]];
    for (int j = 1; j < p.K; ++j) m = fmax(m, z[chosen[j]]);
    for (int j = 0; j < p.K; ++j) total += (w[j] = exp(z[chosen[j]] - m));
    for (int j = 0; j < p.K; ++j) w[j] /= total;
  } else {
    for (int j = 0; j < p.K; ++j) total += (w[j] = sigmoid64(z[chosen[j]]));
    for (int j = 0; j < p.K; ++j) w[j] /= total;
  }
  for (int j = 0; j < p.K; ++j) p.weight[(long long)t * p.K + j] = w[j];
}

// Gate work item: GATE_TOKENS tokens' logits, then their selections.
__device__ void gate_item(const Params& p, int item, double* smem) {
  int t0 = item * GATE_TOKENS;
  gate_scores(p, t0, smem);
  __syncthreads();  // the block's logits are written before its threads read them back
  if (threadIdx.x < GATE_TOKENS && t0 + threadIdx.x < p.T) {
    const double* z = p.E <= GATE_SMEM_LOGITS ? smem + GATE_SCORE_DOUBLES + threadIdx.x * p.E
                                              : p.logits + (long long)(t0 + threadIdx.x) * p.E;
    gate_select(p, t0 + threadIdx.x, z);
  }
  __syncthreads();  // the shared logits are read before the next item overwrites them
}

// Slots of expert e: scan assignments in priority order (index j * T + t), SLOT_RUN consecutive
// entries per thread, with a block prefix sum of the matches.
constexpr int SLOT_RUN = 8;
__device__ void assign_expert_slots(const Params& p, int e, int* warp_sums) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const long long n = p.T * p.K;
  int running = 0;
  for (long long base = 0; base < n; base += (long long)blockDim.x * SLOT_RUN) {
    const long long first = base + (long long)tid * SLOT_RUN;
    int ex[SLOT_RUN];
#pragma unroll
    for (int u = 0; u < SLOT_RUN; ++u) {
      long long idx = first + u;
      ex[u] = idx < n ? __ldcg(p.expert + (idx % p.T) * p.K + idx / p.T) : -1;
    }
    int mine = 0;
#pragma unroll
    for (int u = 0; u < SLOT_RUN; ++u) mine += ex[u] == e;
    int incl = mine;  // inclusive scan over the warp
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      int up = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += up;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int before = running, block_total = 0;
    for (int w = 0; w < nwarps; ++w) {
      if (w < warp) before += warp_sums[w];
      block_total += warp_sums[w];
    }
    int pos = before + incl - mine;
#pragma unroll
    for (int u = 0; u < SLOT_RUN; ++u) {
      if (ex[u] != e) continue;
      long long idx = first + u;
      int t = (int)(idx % p.T), j = (int)(idx / p.T);
      int s = pos < p.C ? pos : -1;
      p.slot[(long long)t * p.K + j] = s;
      if (s >= 0) {
        long long r = (long long)e * p.C + s;
        p.row_token[r] = t;
        p.row_choice[r] = j;
        p.row_weight[r] = (float)__ldcg(p.weight + (long long)t * p.K + j);
      }
      ++pos;
    }
    running += block_total;
    __syncthreads();  // warp_sums is rewritten by the next chunk
  }
  if (tid == 0) p.counts[e] = running < p.C ? running : (int)p.C;
}
