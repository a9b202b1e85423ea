// Tile windows (reference/plan.py windows): a local expert's slots laid out source by source,
// p.stride positions apart (C where the sources' rows share tiles, C rounded up to whole tiles
// where each source's rows have tiles of their own), and tile w is positions [w BM, (w + 1) BM).
// Position s * stride + q is source s's slot q, row (le P + s) C + q of inbox, hidden and outbuf
// ([L][P][C], so a window's positions are consecutive rows). A chunk is one source's rows inside one
// window: what a source dispatches, signals and gets back as a unit.
#pragma once
#include "common.cuh"

// Slots [a, b) of the (source s, local expert) block of n rows that lie in window w (a >= b: none).
struct Chunk {
  int a, b;
  __device__ bool empty() const { return a >= b; }
};

template <int BM>
__device__ __forceinline__ int first_window(const Params& p, int s) {
  return (int)(s * p.stride / BM);
}

template <int BM>
__device__ __forceinline__ Chunk chunk_in(const Params& p, int s, int n, int w) {
  const long long base = s * p.stride, lo = (long long)w * BM - base;
  return {(int)max(lo, 0LL), (int)min(lo + BM, (long long)n)};
}

// The sources whose slots window w touches: s_first .. s_last
template <int BM>
__device__ __forceinline__ int window_first_source(const Params& p, int w) {
  return (int)((long long)w * BM / p.stride);
}
template <int BM>
__device__ __forceinline__ int window_last_source(const Params& p, int w) {
  return (int)min(p.P - 1, ((long long)w * BM + BM - 1) / p.stride);
}

// The first row of window w of local expert le in inbox, hidden and outbuf
template <int BM>
__device__ __forceinline__ long long window_row(const Params& p, int le, int w) {
  const long long pos = (long long)w * BM, s = pos / p.stride;
  return ((long long)le * p.P + s) * p.C + pos % p.stride;
}
