// Calibration microbenchmarks: the megakernel's own device code (gate.cuh, tile_gemm.cuh,
// processor.cuh) run piece by piece in persistent kernels of the megakernel's block size and
// launch bounds, timed with %globaltimer, so the simulator's figures come from the code it models.
// gpu/microbench.py launches them and turns the clocks into measurements/calibration-<gpu>.json.
// Built like moe.cu for each kernel: float32, with -DMOE_BF16=1 the bf16 one (bf16 tokens,
// weights and moved rows, tensor-core tile GEMM), or with -DMOE_TF32X3=1 the split TF32 one
// (float32 data, the warpgroup tile GEMM), so each build times its own element type and GEMM.
//   mb_gemm      tile GEMM tasks (processor.cuh's gemm_task: GEMM0 or GEMM1), per block
//   mb_copy      copy_rows gathers (dispatch packing, combine weighting), per block
//   mb_put       put-with-signal of `bytes` by each of `gridDim` blocks to one PE
//   mb_pingpong  put-with-signal (or a bare signal) round trips between two PEs
//   mb_gate      the gate phase exactly as moe.cu runs it: gate items, capacity (slots), barrier
//   mb_dispatch  dispatch_chunks over this rank's routed chunks (telemetry logs per share)
//   mb_combine   the per-token ordered combine of the processors (telemetry logs per block)
#include <nvshmem.h>
#include <nvshmemx.h>
#include "block_smem.cuh"

#ifndef MIN_BLOCKS_PER_SM
#define MIN_BLOCKS_PER_SM 2
#endif

#define MB_KERNEL extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS_PER_SM)

// Tasks in queue order g = j * gridDim + block (as a FIFO scheduler hands them out): the column
// block varies fastest, then the tile (a_tiles distinct row tiles of A), then the expert
// (`tiles_per_expert` tiles each: 2 at the FlashMoE default), so concurrent tasks share operands
// as in a layer: the tiles of one expert share each weight slice.
// Each task is the megakernel's own gemm_task on a Params pointing at these buffers: kind 0
// (GEMM0) out = act(A.W + bias) with A as inbox (K = H) and out as hidden (N = I); kind 1
// (GEMM1) out = A.W + bias with A as hidden (K = I) and out as outbuf (N = H). ns[block] = total.
// The bf16 build reads A and W through the TMA tensor maps at tmaps (gpu/tma.py OPERANDS order).
MB_KERNEL mb_gemm(int kind, int act, const elem_t* A, int a_tiles, int rows, const elem_t* __restrict__ W,
                  const float* __restrict__ bias, int experts, int tiles_per_expert, int K, int N, elem_t* out,
                  int reps, const unsigned char* tmaps, unsigned long long* ns) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Params q;
  q.act_kind = act;
  q.tmaps = tmaps;  // bf16: A's map as both inbox's and hidden's, W's as both w1's and w2's
  if (kind == TASK_GEMM0) {
    q.H = K, q.I = N, q.inbox = const_cast<elem_t*>(A), q.w1 = W, q.b1 = bias, q.hidden = out;
  } else {
    q.I = K, q.H = N, q.hidden = const_cast<elem_t*>(A), q.w2 = W, q.b2 = bias, q.outbuf = out;
  }
  const int ncol = N / TILE_N;
  // this block's task j: its first row of A, expert and first column
  auto task_of = [&](int j, long long* s0, int* le, int* col0) {
    const long long g = (long long)j * gridDim.x + blockIdx.x, tile = g / ncol;
    *col0 = (int)(g % ncol) * TILE_N;
    *s0 = (tile % a_tiles) * TILE_M;
    *le = (int)((tile / tiles_per_expert) % experts);
  };
#if MOE_WGMMA
  TensorCoreGemm<TILE_M, TILE_N, TILE_K>::prepare();
#endif
  // GEMM1's rows all go to `out`, as to one source whose slots span every position
  __shared__ elem_t* out_rows[1];
  constexpr int ONE_SOURCE = 1 << 30;
  __shared__ int out_count[1];  // every slot is one of the source's rows: none goes to the spare
  if (threadIdx.x == 0) out_rows[0] = out, out_count[0] = ONE_SOURCE;
  __syncthreads();
  const uint64_t t0 = now_ns();
  for (int j = 0; j < reps; ++j) {
    long long s0;
    int le, col0;
    task_of(j, &s0, &le, &col0);
    gemm_task<TILE_M, TILE_N, TILE_K>(q, kind, s0, rows, le, col0,
                                      [&] { return SourceRows{out_rows, out_rows, out_count, (int)s0, ONE_SOURCE, 0, N}; }, smem_raw);
    __syncthreads();
    if (threadIdx.x == 0) __threadfence();  // the task's completion flag follows its stores
#if MOE_WGMMA
    // the next task's first slices, as the megakernel's processor asks for them once it has
    // taken its next command
    if (threadIdx.x == 32 && j + 1 < reps) {
      long long s1;
      int le1, col1;
      task_of(j + 1, &s1, &le1, &col1);
      TensorCoreGemm<TILE_M, TILE_N, TILE_K>::prime(task_operands(q, kind == TASK_GEMM0, s1, le1, col1), smem_raw);
    }
    __syncthreads();  // thread 0 reads how many slices were primed as the next task starts
#endif
  }
  if (threadIdx.x == 0) ns[blockIdx.x] = now_ns() - t0;
}

// Each block gathers `rows` rows of H elements (a scattered permutation of src's rows, as tokens
// are gathered per expert) into its own region of dst with the megakernel's copy_rows, `reps` times.
MB_KERNEL mb_copy(const elem_t* src, int src_rows, elem_t* dst, int rows, int H, const float* scales, int reps,
                  unsigned long long* ns) {
  Params q;
  q.H = H;  // copy_rows reads only the row width
  elem_t* mine = dst + (long long)blockIdx.x * rows * H;
  __syncthreads();
  const uint64_t t0 = now_ns();
  for (int j = 0; j < reps; ++j) {
    const long long first = ((long long)blockIdx.x * reps + j) * rows;
    copy_rows(q, mine, rows, [&](int r) {
      return reinterpret_cast<const float4*>(src + ((first + r) * 7919 % src_rows) * (long long)H);
    }, scales);
    __syncthreads();
  }
  if (threadIdx.x == 0) ns[blockIdx.x] = now_ns() - t0;
}

// Block b puts `bytes` from src + b * bytes to dst + b * bytes on PE `peer` with a signal, `reps`
// times, then waits for completion (quiet). ns[2b] = time to issue, ns[2b + 1] = time to complete.
MB_KERNEL mb_put(float* dst, const float* src, long long bytes, uint64_t* sig, int reps, int peer, uint64_t value,
                 unsigned long long* ns) {
  const long long off = (long long)blockIdx.x * (bytes / 4);
  __syncthreads();
  const uint64_t t0 = now_ns();
  for (int j = 0; j < reps; ++j)
    nvshmemx_putmem_signal_nbi_block(dst + off, src + off, (size_t)bytes, sig + blockIdx.x, value + j,
                                     NVSHMEM_SIGNAL_SET, peer);
  __syncthreads();
  const uint64_t t1 = now_ns();
  if (threadIdx.x == 0) nvshmem_quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    ns[2 * blockIdx.x] = t1 - t0;
    ns[2 * blockIdx.x + 1] = now_ns() - t0;
  }
}

// One block on each of two PEs: PE `leader` sends (put of `bytes` with its signal, or a bare
// signal when bytes == 0), the other waits for it and answers the same way; `iters` round trips.
// The first trip also absorbs the two launches' skew, so the clock starts after it.
// Signal values base + i grow across launches, so no reset is needed.
// out = {ns of round trips 2..iters, failed}.
MB_KERNEL mb_pingpong(float* buf, long long bytes, uint64_t* sig, int iters, int me, int peer, int leader,
                      uint64_t base, long long timeout_ns, long long* out) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  auto send = [&](uint64_t v) {
    if (bytes > 0)
      nvshmemx_putmem_signal_nbi_block(buf, buf, (size_t)bytes, sig, v, NVSHMEM_SIGNAL_SET, peer);
    else if (threadIdx.x == 0)
      nvshmemx_signal_op(sig, v, NVSHMEM_SIGNAL_SET, peer);
  };
  auto wait = [&](uint64_t v) {
    if (threadIdx.x == 0) {
      const uint64_t w0 = now_ns();
      while (ld_acquire_sys(sig) < v)
        if ((long long)(now_ns() - w0) > timeout_ns) {
          failed = 1;
          break;
        }
    }
    __syncthreads();
  };
  uint64_t t1 = now_ns();
  for (int i = 1; i <= iters && !failed; ++i) {
    if (me == leader) {
      send(base + i);
      wait(base + i);
    } else {
      wait(base + i);
      send(base + i);
    }
    if (i == 1) t1 = now_ns();
  }
  if (threadIdx.x == 0) nvshmem_quiet();
  __syncthreads();
  if (threadIdx.x == 0) {
    out[0] = (long long)(now_ns() - t1);
    out[1] = failed;
  }
}

// The gate phase as moe.cu runs it (without the cross-rank start wait): gate_phase on every block,
// capacity_phase (its barriers and slots), grid barrier. ns[2b], ns[2b + 1] = block b's start, end.
// Cooperative launch; the state words must be zero.
MB_KERNEL mb_gate(const Params* __restrict__ params, unsigned long long* ns) {
  const Params& p = *params;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint64_t t0 = now_ns();
  int barriers = gate_phase(p, smem_raw);
  if (barriers < 0 || (barriers = capacity_phase(p, smem_raw, barriers)) < 0) return;
  if (!grid_barrier(p, barriers++)) return;
  if (threadIdx.x == 0) {
    ns[2 * blockIdx.x] = t0;
    ns[2 * blockIdx.x + 1] = now_ns();
  }
}

// Blocks 0..n-1 dispatch this rank's routed chunks as the megakernel's processors do (n = n_proc:
// the same shares); each share's interval goes to the block's telemetry log (tlog counts and
// dispatch_done zeroed).
MB_KERNEL mb_dispatch(const Params* __restrict__ params, int n) {
  const Params& p = *params;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (blockIdx.x >= n) return;
  dispatch_chunks<TILE_M>(p, 1, n, smem_raw);
  if (threadIdx.x == 0) nvshmem_quiet();
}

// The processors' final ordered combine (blocks >= n_proc leave), logged per block.
MB_KERNEL mb_combine(const Params* __restrict__ params) {
  const Params& p = *params;
  if (blockIdx.x >= p.n_proc) return;
  combine_tokens(p, 1);
}
