// Clock, memory-ordering helpers, the error record, bounded waits, telemetry and the grid barrier.
// Every wait in the kernel goes through `Waiter`: it gives up after p.timeout_ns, records who
// waited for what in the error record, raises the abort flag and makes every other wait return.
#pragma once
#include "params.cuh"

// The block: BLOCK_WARPGROUPS warpgroups of 128 threads (gpu/layout.py passes it with the tile
// shape). One warpgroup, two blocks per SM, everywhere but the bf16 128 x 256 tile, whose two
// warpgroups share each A slice in one block per SM (more multiply per byte read from L2).
#ifndef BLOCK_WARPGROUPS
#define BLOCK_WARPGROUPS 1
#endif
constexpr int UNIT_THREADS = 128, BLOCK_THREADS = UNIT_THREADS * BLOCK_WARPGROUPS;

// The gate and capacity phases are written for 128-thread units (4 warps of FP64 mma tiles, 4
// lanes per token): each warpgroup of a block is a unit of its own, with its own work items, its
// own slice of the shared memory and its own barrier (named barrier 2 + w; 1 is the subscriber's).
__device__ __forceinline__ int unit_tid() { return threadIdx.x % UNIT_THREADS; }
__device__ __forceinline__ int unit_index() { return blockIdx.x * BLOCK_WARPGROUPS + threadIdx.x / UNIT_THREADS; }
__device__ __forceinline__ int unit_count() { return gridDim.x * BLOCK_WARPGROUPS; }
__device__ __forceinline__ void unit_sync() {
  if constexpr (BLOCK_WARPGROUPS == 1)
    __syncthreads();
  else
    asm volatile("bar.sync %0, %1;" ::"r"(2 + (int)threadIdx.x / UNIT_THREADS), "n"(UNIT_THREADS) : "memory");
}

// v summed over this lane and the lanes below it in its warp (every lane of the warp calls it)
__device__ __forceinline__ int warp_inclusive_sum(int v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// a relaxed load: several in a row are in flight together (acquire loads wait for each other);
// a fence.acq_rel after them makes what they observed an acquire
__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// a relaxed store: after one fence, a run of them publishes what the fence ordered (a release store is
// a fence of its own, MEMBAR.ALL.GPU in the SASS: a thread's run of them waits a memory round trip each)
__device__ __forceinline__ void st_relaxed_gpu(int* p, int v) {
  asm volatile("st.relaxed.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_gpu(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ bool aborted(const Params& p) {
  return ld_acquire_gpu(p.state + ST_ABORT) != 0;
}

// First failure wins the record; everyone else only sees the abort flag.
__device__ void record_error(const Params& p, int what, long long a, long long b, long long c,
                             long long value, long long expected, long long waited_ns) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(p.error), 0ull, 1ull) == 0ull) {
    p.error[1] = p.rank;
    p.error[2] = blockIdx.x;
    p.error[3] = threadIdx.x;
    p.error[4] = what;
    p.error[5] = a;
    p.error[6] = b;
    p.error[7] = c;
    p.error[8] = value;
    p.error[9] = expected;
    p.error[10] = waited_ns;
    __threadfence_system();
  }
  atomicExch(p.state + ST_ABORT, 1);
}

// A bounded wait: call `expired()` in the polling loop; true once the budget is spent (and then
// the error is recorded) or once another thread has aborted.
// `patience` multiplies the budget: waits that depend on other waits (the scheduler on the
// subscriber, processors on the scheduler) wait longer, so the most specific wait reports first.
struct Waiter {
  uint64_t start;
  unsigned spins;
  int patience;
  __device__ explicit Waiter(int patience_ = 1) : start(now_ns()), spins(0), patience(patience_) {}
  __device__ void restart() { start = now_ns(); }
  __device__ bool expired(const Params& p, int what, long long a, long long b, long long c,
                          long long value, long long expected) {
    if (!spent(p)) return false;
    if (!aborted(p)) record_error(p, what, a, b, c, value, expected, (long long)(now_ns() - start));
    return true;
  }
  // true once the budget is spent or another thread has aborted, recording nothing: for a loop that
  // must call nothing (the bf16 tile GEMM's, whose accumulators would be spilled around the call),
  // which records the error after it
  __device__ bool spent(const Params& p) {
    if ((++spins & 63u) != 0) return false;  // read the clock and the abort flag now and then
    return aborted(p) || (long long)(now_ns() - start) > p.timeout_ns * patience;
  }
};

// Telemetry: one log per processor block and per OS warp; 4 words per event.
// w2 = kind | (expert & 0xffff) << 8 | (peer & 0xffff) << 24 | rows << 40; w3 = tile | col << 32
// (col: a GEMM task's first column, a dispatch's share of its tile)
__device__ __forceinline__ void log_event(const Params& p, int enabled, int log, int kind,
                                          uint64_t t0, uint64_t t1, int expert, int peer, int rows,
                                          int tile, int col) {
  if (!enabled) return;
  int i = atomicAdd(p.tlog_count + log, 1);
  if (i >= p.tlog_cap) return;  // counted, not stored: the host reports the overflow
  unsigned long long* e = p.tlog + ((long long)log * p.tlog_cap + i) * 4;
  e[0] = t0;
  e[1] = t1;
  e[2] = (unsigned long long)(kind & 0xff) | ((unsigned long long)(expert & 0xffff) << 8) |
         ((unsigned long long)(peer & 0xffff) << 24) | ((unsigned long long)(rows & 0xffff) << 40);
  e[3] = (unsigned long long)(unsigned)tile | ((unsigned long long)(unsigned)col << 32);
}

// All blocks of the (co-resident, cooperative) grid meet; false if the wait was given up.
__device__ bool grid_barrier(const Params& p, int index) {
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = 1;
    __threadfence();
    atomicAdd(p.state + ST_BARRIER, 1);
    int target = (index + 1) * gridDim.x;
    Waiter w(2);  // after the start wait of block 0, which names the rank that did not start
    int seen;
    while ((seen = ld_acquire_gpu(p.state + ST_BARRIER)) < target) {
      if (w.expired(p, WAIT_BARRIER, index, 0, 0, seen, target)) {
        ok = 0;
        break;
      }
    }
  }
  __syncthreads();
  return ok;
}

// Block 0 waits until every rank's kernel of this epoch has started (then passes barrier 1).
__device__ bool wait_all_started(const Params& p, uint64_t epoch) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    for (int q = 0; q < p.P && ok; ++q) {
      Waiter w;
      uint64_t v;
      while ((v = ld_acquire_sys(p.sig_start + q)) < epoch) {
        if (w.expired(p, WAIT_START, q, 0, 0, (long long)v, (long long)epoch)) {
          ok = 0;
          break;
        }
      }
    }
  }
  __syncthreads();  // on failure the other blocks leave barrier 1 through the abort flag
  return ok;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }
