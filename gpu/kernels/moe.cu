// moelab's MoE megakernel: one persistent launch per layer call on every GPU. Built as
// moelab_moe_fp32 (float32, SIMT tile GEMM) or, with -DMOE_BF16=1, moelab_moe_bf16 (bf16 tokens,
// weights and moved rows; tensor-core tile GEMM with float32 accumulation; see params.cuh) or,
// with -DMOE_TF32=1, moelab_moe_tf32 (float32 data, tensor-core tile GEMM on TF32 operands) or,
// with -DMOE_TF32X3=1, moelab_moe_tf32x3 (float32 data, the warpgroup tile GEMM on split TF32
// operands, three products each: float32's accuracy).
// Blocks 0..n_proc-1 are processors, the last block is the OS (scheduler + subscriber warps).
// Phases: gate (all blocks; split over H with a barrier when the tokens are few) | barrier | slot
// scan per expert | barrier | slots per gate item | barrier | dispatch (a chunk's rows shared by
// processors) + count signals,
// then the task pipeline (GEMM0 -> GEMM1 storing home -> combine) | final ordered combine.
// Tile shape (TILE_M, TILE_N, TILE_K, and the bf16 GEMM's GEMM_STAGES and BLOCK_WARPGROUPS: a
// block of one warpgroup, or of two for the bf16 128 x 256 tile) is fixed at compile time (-D);
// everything else is a run-time size in Params, so one cubin serves every config with that
// tile shape. Shared memory is dynamic: the gate and the tile GEMM take turns in one buffer of
// moelab_smem_bytes, which the launcher reads from the cubin to set the kernel's limit, size the
// grid by occupancy and launch (dynamic shared memory may pass the 48 KiB of static).
#include <nvshmem.h>
#include <nvshmemx.h>
#include "block_smem.cuh"

#ifndef MIN_BLOCKS_PER_SM
#define MIN_BLOCKS_PER_SM 2
#endif

#if MOE_BF16
#define MOE_KERNEL moelab_moe_bf16
#elif MOE_TF32
#define MOE_KERNEL moelab_moe_tf32
#elif MOE_TF32X3
#define MOE_KERNEL moelab_moe_tf32x3
#else
#define MOE_KERNEL moelab_moe_fp32
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS_PER_SM)
MOE_KERNEL(const Params* __restrict__ params, uint64_t epoch, int telemetry) {
  const Params& p = *params;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ volatile int s_total;
  __shared__ int s_acc;
  const bool is_os = blockIdx.x == gridDim.x - 1;
  const int log = is_os ? (int)p.n_proc : blockIdx.x;
  const uint64_t t_start = now_ns();
  // tell every rank this kernel has started; no rank puts anything before all have (barrier 1),
  // so no put lands in buffers a rank is still preparing or reading from its previous call
  if (blockIdx.x == 0)
    for (int q = threadIdx.x; q < p.P; q += blockDim.x)
      nvshmemx_signal_op(p.sig_start + p.rank, epoch, NVSHMEM_SIGNAL_SET, q);

  // gate: GATE_TOKENS tokens per item, all blocks; then capacity (slots) from the items' counts
  int barriers = gate_phase(p, smem_raw);
  if (barriers < 0 || (barriers = capacity_phase(p, smem_raw, barriers)) < 0) return;
  if (blockIdx.x == 0 && !wait_all_started(p, epoch)) return;
  // a processor dispatching its shares holds both its mailbox slots (os.cuh scheduler), so the first
  // tasks go to processors that can run them, not behind a staged sender's peers' chunks
  if (!is_os && threadIdx.x == 0) st_relaxed_gpu(p.mailbox_done + blockIdx.x, -MAILBOX_SLOTS);
  if (!grid_barrier(p, barriers++)) return;
  if (threadIdx.x == 0) log_event(p, telemetry, log, EV_GATE, t_start, now_ns(), -1, -1, 0, -1, 0);

  if (is_os) {
    // announce this rank's row count per expert to the expert's owner, and where the rows go home
    // in this rank's combox (each carries the epoch: the owner waits for both, in either order)
    for (int e = threadIdx.x; e < p.E; e += blockDim.x) {
      const int owner = (int)(e / p.L), le = (int)(e % p.L);
      nvshmemx_signal_op(p.sig_base + p.rank * p.L + le, (epoch << 32) | (uint64_t)__ldcg(p.count_base + e),
                         NVSHMEM_SIGNAL_SET, owner);
      nvshmemx_signal_op(p.sig_count + p.rank * p.L + le, (epoch << 32) | (uint64_t)__ldcg(p.counts + e),
                         NVSHMEM_SIGNAL_SET, owner);
    }
    if (threadIdx.x == 0) {
      s_total = -1;
      s_acc = 0;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const uint64_t t0 = now_ns();
      scheduler(p, &s_total);
      if (threadIdx.x == 0) log_event(p, telemetry, log, EV_WAIT, t0, now_ns(), -1, -1, 0, -1, 0);
    } else if (threadIdx.x < 32 + SUBSCRIBER_LANES) {
      subscriber<TILE_M, TILE_N>(p, epoch, telemetry, &s_total, &s_acc);
    }  // a second warpgroup's warps have no OS role
    nvshmem_quiet();
    return;
  }

  // processors: dispatch this rank's chunks, then tasks, then the ordered combine
  dispatch_chunks<TILE_M>(p, telemetry, (int)p.n_proc, smem_raw);
  if (threadIdx.x == 0) st_release_gpu(p.mailbox_done + blockIdx.x, 0);  // its slots free for tasks
  processor<TILE_M, TILE_N, TILE_K>(p, telemetry, smem_raw);
  if (!aborted(p)) combine_tokens(p, telemetry);
  if (threadIdx.x == 0) nvshmem_quiet();
}

// The ranks' clocks on one axis (launched with one thread, after a layer call): each rank signals
// its start to every rank, waits (bounded) for all, and reads %globaltimer. The reads fall within a
// signal's latency of one real moment, the last rank's signal landing, so their differences are
// the offsets between the GPUs' clocks, which are not synchronized (~0.2 ms apart on an H200 pair).
extern "C" __global__ void moelab_clock_sync(const Params* __restrict__ params, uint64_t epoch,
                                             unsigned long long* now) {
  const Params& p = *params;
  for (int q = 0; q < p.P; ++q) nvshmemx_signal_op(p.sig_start + p.rank, epoch, NVSHMEM_SIGNAL_SET, q);
  *now = wait_all_started(p, epoch) ? now_ns() : 0ull;
}
