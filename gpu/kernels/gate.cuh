// Gate and capacity, reproducing reference/routing.py exactly:
// - logits in float64 of the float32 operands (products are exact, so only the summation order
//   can differ from NumPy's, far below any gap between two experts' logits), minus the skew offset;
// - top-k best first, a tie to the lower expert index (strict > while scanning upwards);
// - weights by the config's gate variant, in float64;
// - slots per expert in priority order (choice j first, then token index), dropped at >= C.
#pragma once
#include "common.cuh"

constexpr int GATE_TOKENS = 16;  // tokens per gate work item
constexpr int GATE_EXPERTS = 64; // experts per pass over H
constexpr int GATE_DEPTH = 32;   // slice of H held in shared memory
constexpr int GATE_SMEM_DOUBLES = GATE_TOKENS * GATE_DEPTH + GATE_DEPTH * GATE_EXPERTS;

__device__ void gate_scores(const Params& p, int t0, double* smem) {
  double* xs = smem;                            // [GATE_TOKENS][GATE_DEPTH]
  double* ws = smem + GATE_TOKENS * GATE_DEPTH; // [GATE_DEPTH][GATE_EXPERTS]
  const int tid = threadIdx.x, tok = tid / 8, eg = tid % 8;  // 16 tokens x 8 expert lanes
  for (int e0 = 0; e0 < p.E; e0 += GATE_EXPERTS) {
    double acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0;
    for (int h0 = 0; h0 < p.H; h0 += GATE_DEPTH) {
      for (int v = tid; v < GATE_TOKENS * GATE_DEPTH; v += blockDim.x) {
        int tt = t0 + v / GATE_DEPTH, hh = h0 + v % GATE_DEPTH;
        xs[v] = (tt < p.T && hh < p.H) ? (double)p.x[(long long)tt * p.H + hh] : 0.0;
      }
      for (int v = tid; v < GATE_DEPTH * GATE_EXPERTS; v += blockDim.x) {
        int hh = h0 + v / GATE_EXPERTS, e = e0 + v % GATE_EXPERTS;
        ws[v] = (hh < p.H && e < p.E) ? (double)p.wg[(long long)hh * p.E + e] : 0.0;
      }
      __syncthreads();
#pragma unroll 4
      for (int hh = 0; hh < GATE_DEPTH; ++hh) {
        double xv = xs[tok * GATE_DEPTH + hh];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fma(xv, ws[hh * GATE_EXPERTS + eg + 8 * i], acc[i]);
      }
      __syncthreads();
    }
    int t = t0 + tok;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int e = e0 + eg + 8 * i;
      if (t < p.T && e < p.E) p.logits[(long long)t * p.E + e] = acc[i] - p.logit_offset[e];
    }
  }
}

__device__ __forceinline__ double sigmoid64(double z) { return 1.0 / (1.0 + exp(-z)); }

// Top-k and weights of one token from its float64 logits.
__device__ void gate_select(const Params& p, int t) {
  const double* z = p.logits + (long long)t * p.E;
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
  if (threadIdx.x < GATE_TOKENS && t0 + threadIdx.x < p.T) gate_select(p, t0 + threadIdx.x);
}

// Slots of expert e: scan assignments in priority order (index j * T + t) with a block prefix sum.
__device__ void assign_expert_slots(const Params& p, int e, int* warp_sums) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const long long n = p.T * p.K;
  int running = 0;
  for (long long base = 0; base < n; base += blockDim.x) {
    long long idx = base + tid;
    int t = 0, j = 0;
    bool match = false;
    if (idx < n) {
      j = (int)(idx / p.T);
      t = (int)(idx % p.T);
      match = __ldcg(p.expert + (long long)t * p.K + j) == e;
    }
    unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_sums[warp] = __popc(ballot);
    __syncthreads();
    int before = running, block_total = 0;
    for (int w = 0; w < nwarps; ++w) {
      if (w < warp) before += warp_sums[w];
      block_total += warp_sums[w];
    }
    int pos = before + __popc(ballot & ((1u << lane) - 1u));
    if (match) {
      int s = pos < p.C ? pos : -1;
      p.slot[(long long)t * p.K + j] = s;
      if (s >= 0) {
        long long r = (long long)e * p.C + s;
        p.row_token[r] = t;
        p.row_choice[r] = j;
        p.row_weight[r] = (float)__ldcg(p.weight + (long long)t * p.K + j);
      }
    }
    running += block_total;
    __syncthreads();  // warp_sums is rewritten by the next chunk
  }
  if (tid == 0) p.counts[e] = running < p.C ? running : (int)p.C;
}
