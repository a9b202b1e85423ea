// Tile windows (reference/plan.py windows): a local expert's slots laid out source by source,
// p.stride positions apart (C where the sources' rows share tiles, C rounded up to whole tiles
// where each source's rows have tiles of their own), and tile w is positions [w BM, (w + 1) BM).
// Position s * stride + q is source s's slot q, row (le P + s) C + q of inbox, hidden and outbuf
// ([L][P][C], so a window's positions are consecutive rows). A chunk is one source's rows inside one
// window: what a source dispatches, signals and gets back as a unit.
#pragma once
#include "common.cuh"

constexpr int MAX_TILE_SOURCES = MOELAB_MAX_TILE_SOURCES;  // sources one window may span (gpu/layout.py checks)

// Columns of GEMM0's output in W1: 2I where gated (the gate and up columns interleaved, column c
// of a task giving column c / 2 of `hidden`), else I
__device__ __forceinline__ long long gemm0_cols(const Params& p) { return MOE_GATED ? 2 * p.I : p.I; }

// Slots [a, b) of the (source s, local expert) block of n rows that lie in window w (a >= b: none).
struct Chunk {
  int a, b;
  __device__ bool empty() const { return a >= b; }
};

// Positions are ints (gpu/layout.py checks P x stride fits one): a 64-bit division is a called
// subroutine, and a call in the bf16 task's function (gemm_task) makes ptxas serialize its wgmmas.
template <int BM>
__device__ __forceinline__ int first_window(const Params& p, int s) {
  return s * (int)p.stride / BM;
}

// The last window that source s's first `rows` slots (rows > 0) touch
template <int BM>
__device__ __forceinline__ int last_window(const Params& p, int s, int rows) {
  return (s * (int)p.stride + rows - 1) / BM;
}

template <int BM>
__device__ __forceinline__ Chunk chunk_in(const Params& p, int s, int n, int w) {
  const int lo = w * BM - s * (int)p.stride;
  return {max(lo, 0), min(lo + BM, n)};
}

// Chunk j of this rank's own rows for expert e (its dispatch, count and combine slot j)
template <int BM>
__device__ __forceinline__ Chunk own_chunk(const Params& p, long long e, int j) {
  return chunk_in<BM>(p, (int)p.rank, __ldcg(p.counts + e), first_window<BM>(p, (int)p.rank) + j);
}

// The sources whose slots window w touches: s_first .. s_last
template <int BM>
__device__ __forceinline__ int window_first_source(const Params& p, int w) {
  return w * BM / (int)p.stride;
}
template <int BM>
__device__ __forceinline__ int window_last_source(const Params& p, int w) {
  return min((int)p.P - 1, (w * BM + BM - 1) / (int)p.stride);
}

// The first row of window w of local expert le in inbox, hidden and outbuf
template <int BM>
__device__ __forceinline__ long long window_row(const Params& p, int le, int w) {
  const int pos = w * BM, stride = (int)p.stride;
  return ((long long)le * p.P + pos / stride) * p.C + pos % stride;
}
