// Gate and capacity, reproducing reference/routing.py exactly:
// - logits in float64 of the float32 operands (products are exact, so only the summation order
//   can differ from NumPy's, far below any gap between two experts' logits), minus the skew offset;
//   the bf16 kernel reads bf16 tokens and bf16-rounded gate weights, as the reference's bf16 path;
// - top-k best first, a tie to the lower expert index (strict > while scanning upwards);
// - weights by the config's gate variant, in float64;
// - slots per expert in priority order (choice j first, then token index), dropped at >= C.
#pragma once
#include "common.cuh"

constexpr int GATE_TOKENS = 16;  // tokens per gate work item
constexpr int GATE_EXPERTS = 64; // experts per pass over H
constexpr int GATE_DEPTH = 32;   // slice of H held in shared memory
constexpr int GATE_SMEM_LOGITS = 128;  // experts whose logits the selection reads from shared memory
constexpr int GATE_SCORE_DOUBLES = GATE_TOKENS * GATE_DEPTH + GATE_DEPTH * GATE_EXPERTS;
constexpr int GATE_SMEM_DOUBLES = GATE_SCORE_DOUBLES + GATE_TOKENS * GATE_SMEM_LOGITS;

__device__ void gate_scores(const Params& p, int t0, double* smem) {
  double* xs = smem;                            // [GATE_TOKENS][GATE_DEPTH]
  double* ws = smem + GATE_TOKENS * GATE_DEPTH; // [GATE_DEPTH][GATE_EXPERTS]
  const int tid = threadIdx.x, tok = tid / 8, eg = tid % 8;  // 16 tokens x 8 expert lanes
  constexpr int XN = GATE_TOKENS * GATE_DEPTH / 128, WN = GATE_DEPTH * GATE_EXPERTS / 128;
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
    double acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0;
    for (int h0 = 0; h0 < p.H; h0 += GATE_DEPTH) {
#pragma unroll
      for (int u = 0; u < XN; ++u) xs[tid + 128 * u] = (double)xv[u];
#pragma unroll
      for (int u = 0; u < WN; ++u) ws[tid + 128 * u] = (double)wv[u];
      __syncthreads();
      if (h0 + GATE_DEPTH < p.H) load(e0, h0 + GATE_DEPTH);
      else if (e0 + GATE_EXPERTS < p.E) load(e0 + GATE_EXPERTS, 0);
#pragma unroll 4
      for (int hh = 0; hh < GATE_DEPTH; ++hh) {
        double xd = xs[tok * GATE_DEPTH + hh];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fma(xd, ws[hh * GATE_EXPERTS + eg + 8 * i], acc[i]);
      }
      __syncthreads();
    }
    int t = t0 + tok;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int e = e0 + eg + 8 * i;
      if (t < p.T && e < p.E) {
        double z = acc[i] - p.logit_offset[e];
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
