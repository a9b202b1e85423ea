// The OS block (FlashMoE's roles): warp 0 is the scheduler, warps 1..3 the subscriber.
// - subscriber: learns how many rows each source sends to each local expert (count signals),
//   works out the tiles (windows over the expert's slots, tiles.cuh) and the chunks each waits for,
//   then turns landed tiles into tasks: a tile whose chunks have all landed into its GEMM0 tasks (in
//   the bf16 build, all the tiles of a local expert once the last has landed), a returned chunk of
//   this rank's tokens (all its GEMM1 column blocks counted in) into its combine task;
// - scheduler: hands the published tasks, in queue order, to idle processors through their
//   mailboxes, and stops them all once every task of the layer call has been done.
#pragma once
#include <nvshmem.h>
#include <nvshmemx.h>
#include "common.cuh"
#include "tiles.cuh"

constexpr unsigned STOP_INDEX = 0xffffffffu;
constexpr int SUBSCRIBER_LANES = 96;
constexpr int SCHED_GROUPS = 12;  // the scheduler warp serves at most 32 x 12 processors (the host caps the grid;
                                  // 16 made ptxas spill the bf16 kernel at its 255 registers)
constexpr int READY_BATCH = 8;    // queue flags a scheduler lane reads at once
constexpr int MAILBOX_SLOTS = 2;  // tasks a processor may hold: the one it runs and the next
constexpr int WATCH_CHUNKS = MAX_TILE_SOURCES + 1;  // a watched item's entry: it x WATCH_CHUNKS + a tile's chunks
// The bf16 build queues an expert's dispatched tiles together (enqueue_expert): its tensor-core tasks
// are bound by the weight slices they read. The float32 and tf32 tasks are bound by their math, and
// waiting for an expert's last tile made every float32 layer 0.4-1.9% slower (two H100s).
#if MOE_BF16
constexpr bool QUEUE_BY_EXPERT = true;
#else
constexpr bool QUEUE_BY_EXPERT = false;
#endif
// the mailbox slot of processor q's command number seq (seq, seq + 1 alternate)
__device__ __forceinline__ int mailbox_slot(int q, int seq) { return MAILBOX_SLOTS * q + seq % MAILBOX_SLOTS; }

// Reserve n queue slots, which the scheduler reads in order (-1: the queue is full, recorded).
__device__ int reserve(const Params& p, int n) {
  const int base = atomicAdd(p.state + ST_QTAIL, n);
  if (base + n > p.queue_cap) {
    record_error(p, QUEUE_FULL, base + n, p.queue_cap, 0, 0, 0, 0);
    return -1;
  }
  return base;
}

// Publish reserved slots base.., their tasks written: the fence and the relaxed flags after it
// make a release.
__device__ void publish(const Params& p, int base, int n) {
  __threadfence();
  for (int i = 0; i < n; ++i) st_relaxed_gpu(p.queue_ready + base + i, 1);
}

// A tile's n tasks of one kind, one per column block
__device__ bool enqueue(const Params& p, int kind, int block, int tile, int n, int col_step) {
  const int base = reserve(p, n);
  if (base < 0) return false;
  for (int i = 0; i < n; ++i) p.queue[base + i] = make_int4(kind, block, tile, i * col_step);
  publish(p, base, n);
  return true;
}

// Every tile of local expert le at once: once all have landed, their GEMM0 tasks (the subscriber),
// and once every tile's GEMM0 tasks are done, their GEMM1 tasks (the processor ending the last), n
// of a kind a tile, column block by column block, so that the tasks reading one weight slice sit
// side by side in the queue and run at once, the slice read from HBM once for all of them (tile by
// tile, a peer's tiles ran after the slice had left the L2). The tiles are the windows that the
// sources' rows touch, from their P counts: reserved slots hold back every later task until they
// are published, and a walk over all W windows (one dependent load each, W = 64 or more on a
// dropless layer) held them ~50 us a call (docs/notes/dispatch.md).
template <int BM>
__device__ bool enqueue_expert(const Params& p, int kind, int le, int n, int col_step) {
  const int all = __ldcg(p.expert_tiles + le), base = reserve(p, all * n);
  if (base < 0) return false;
  int4* task = p.queue + base;
  int kg = 0, next = 0;  // the tiles so far, and the first window not yet taken
  for (int s = 0; s < (int)p.P; ++s) {
    const int rows = __ldcg(p.in_count + s * p.L + le);
    if (rows == 0) continue;
    const int last = last_window<BM>(p, s, rows);
    for (int w = max(next, first_window<BM>(p, s)); w <= last; ++w, ++kg)
      for (int c = 0; c < n; ++c) task[c * all + kg] = make_int4(kind, le, w, c * col_step);
    next = last + 1;
  }
  publish(p, base, all * n);
  return true;
}

// A shared expert's GEMM0 tasks (local expert L + s of the weights), column block by column block
// over its windows of this rank's T tokens, which are there from the start: no communication
__device__ bool enqueue_shared(const Params& p, int s, int n, int col_step) {
  const int all = (int)p.WS, base = reserve(p, all * n);
  if (base < 0) return false;
  for (int c = 0; c < n; ++c)
    for (int w = 0; w < all; ++w) p.queue[base + c * all + w] = make_int4(TASK_GEMM0, (int)p.L + s, w, c * col_step);
  publish(p, base, all * n);
  return true;
}

// The rows tile window w of local expert le computes (from its first position to its last row)
// and the chunks it waits for, from the sources' row counts
template <int BM>
__device__ void window_extent(const Params& p, int le, int w, int* rows, int* chunks) {
  int end = 0, n = 0;
  for (int s = window_first_source<BM>(p, w); s <= window_last_source<BM>(p, w); ++s) {
    const Chunk c = chunk_in<BM>(p, s, p.in_count[s * p.L + le], w);
    if (c.empty()) continue;
    ++n;
    end = (int)(s * p.stride + c.b - (long long)w * BM);
  }
  *rows = end;
  *chunks = n;
}

template <int BM, int BN>
__device__ void subscriber(const Params& p, uint64_t epoch, int tel, volatile int* s_total, int* s_acc) {
  const int sl = threadIdx.x - 32, log = p.n_proc + 1 + sl / 32;
  // column blocks of GEMM0 (W1's gate and up columns together where gated) and GEMM1, the last ragged
  const int n0 = (int)((gemm0_cols(p) + BN - 1) / BN), n1 = (int)((p.H + BN - 1) / BN);
  const long long PL = p.P * p.L;
  auto lanes_sync = [] {
    __syncwarp();
    asm volatile("bar.sync 1, %0;" ::"r"(SUBSCRIBER_LANES));
  };
  // 0. the shared experts' GEMM0 tasks, first in the queue: they need nothing from the other ranks
  if (MOE_SHARED && sl == 0)
    for (int s = 0; s < p.S; ++s)
      if (!enqueue_shared(p, s, n0, BN)) break;
  // 1. row counts from every source rank
  for (long long idx = sl; idx < PL; idx += SUBSCRIBER_LANES) {
    Waiter w;
    uint64_t v;
    while (((v = ld_acquire_sys(p.sig_count + idx)) >> 32) < epoch) {
      if (w.expired(p, WAIT_COUNT, idx / p.L, idx % p.L, 0, (long long)(v >> 32), (long long)epoch)) break;
    }
    int rows = (int)(v & 0xffffffffu);
    if ((v >> 32) >= epoch && rows > p.C) record_error(p, BAD_COUNT, idx / p.L, idx % p.L, 0, rows, p.C, 0);
    p.in_count[idx] = rows;
    Waiter wb;
    while (((v = ld_acquire_sys(p.sig_base + idx)) >> 32) < epoch) {
      if (wb.expired(p, WAIT_COUNT, idx / p.L, idx % p.L, 1, (long long)(v >> 32), (long long)epoch)) break;
    }
    p.in_base[idx] = (int)(v & 0xffffffffu);
  }
  lanes_sync();
  // 2. the tiles and their chunks, and the number of tasks this layer call will make: the tiles'
  // GEMM tasks and a combine per chunk of this rank's rows. Each lane lists the tiles and returned
  // chunks it will watch (item it, and a tile's chunk count) in the slots of `watch` of its own
  // items (tiles it = sl + 96 k, then returned chunks D + r), k-th entry in its k-th slot, so that
  // its list fits its share: a dropless layer's windows and chunk slots are mostly empty, and a
  // pass over all of them made a landed tile wait for the lane.
  long long tasks = 0;
  const long long D = p.L * p.W, R = p.E * p.CH;
  const int own_tiles = sl < D ? (int)((D - 1 - sl) / SUBSCRIBER_LANES + 1) : 0;
  auto slot = [&](int k) {
    const long long lane_slot = sl + (long long)SUBSCRIBER_LANES * (k < own_tiles ? k : k - own_tiles);
    return k < own_tiles ? lane_slot : D + lane_slot;
  };
  int watching = 0;
  auto watch = [&](long long entry) { p.watch[slot(watching++)] = (int)entry; };
  for (long long it = sl; it < D; it += SUBSCRIBER_LANES) {
    const int le = (int)(it / p.W), w = (int)(it % p.W);
    int rows, chunks;
    window_extent<BM>(p, le, w, &rows, &chunks);
    p.window_rows[it] = rows;
    p.window_chunks[it] = chunks;
    if (rows == 0) continue;
    tasks += n0 + n1;
    if (QUEUE_BY_EXPERT) atomicAdd(p.expert_tiles + le, 1);
    if (chunks > 0) watch(it * WATCH_CHUNKS + chunks);
  }
  if (MOE_SHARED && sl == 0) tasks += p.S * p.WS * (n0 + n1);
  const int first = first_window<BM>(p, (int)p.rank);
  for (long long r = sl; r < R; r += SUBSCRIBER_LANES) {
    if (own_chunk<BM>(p, r / p.CH, (int)(r % p.CH)).empty()) continue;
    ++tasks;
    watch((D + r) * WATCH_CHUNKS);
  }
  atomicAdd(s_acc, (int)tasks);
  __threadfence();  // the windows' rows, before the tasks that read them are published by any lane
  lanes_sync();
  if (sl == 0) *s_total = aborted(p) ? -1 : *s_acc;
  if (aborted(p)) return;
  // 3. watch this lane's tiles and returned chunks until each has landed, keeping those still
  // pending at the front of its list
  Waiter w;
  while (watching > 0) {
    int pending = 0;
    long long first_pending = -1;
    for (int k = 0; k < watching; ++k) {
      const int entry = p.watch[slot(k)];
      const long long it = entry / WATCH_CHUNKS;
      if (it < D) {
        const int chunks = entry % WATCH_CHUNKS;
        if (ld_acquire_sys(p.sig_tile + it) < (uint64_t)chunks) {
          p.watch[slot(pending++)] = entry;
          if (first_pending < 0) first_pending = it;
          continue;
        }
        // every chunk has landed; the count starts again from 0 for the next call, whose adds all
        // come after every rank's kernel of that call has started, after this one has ended
        p.sig_tile[it] = 0;
        w.restart();
        uint64_t t = now_ns();
        const int le = (int)(it / p.W), tile = (int)(it % p.W);
        log_event(p, tel, log, EV_SIGNAL, t, t, (int)(p.rank * p.L + le), window_first_source<BM>(p, tile),
                  p.window_rows[it], tile, 0);
        if (QUEUE_BY_EXPERT) {
          // the lane that counts the expert's last tile enqueues them all; what each lane saw land
          // (its acquire above) is ordered before its count by this fence, and before the tasks'
          // publication by the counting lane's fence in publish
          __threadfence();
          const int tiles = __ldcg(p.expert_tiles + le);
          if (atomicAdd(p.expert_tiles + p.L + le, 1) + 1 == tiles) {
            const uint64_t tq = now_ns();
            if (!enqueue_expert<BM>(p, TASK_GEMM0, le, n0, BN)) return;
            // its span, for the calibration (gpu.microbench.enqueues): the local expert in the peer
            // field, its tasks in the tile field
            log_event(p, tel, log, EV_WAIT, tq, now_ns(), -1, le, 0, tiles * n0, 0);
          }
        } else if (!enqueue(p, TASK_GEMM0, le, tile, n0, BN)) {
          return;
        }
      } else {
        const long long r = it - D, e = r / p.CH;
        const int j = (int)(r % p.CH);
        if (ld_acquire_sys(p.sig_comb + r) < (uint64_t)n1) {
          p.watch[slot(pending++)] = entry;
          if (first_pending < 0) first_pending = it;
          continue;
        }
        // every column block has landed; the count starts again from 0 for the next call, whose
        // adds all come after this rank has dispatched again
        p.sig_comb[r] = 0;
        w.restart();
        uint64_t t = now_ns();
        const Chunk c = own_chunk<BM>(p, e, j);
        log_event(p, tel, log, EV_SIGNAL, t, t, (int)e, (int)(e / p.L), c.b - c.a, first + j, 1);  // col 1: a return
        if (!enqueue(p, TASK_COMBINE, (int)e, j, 1, 0)) return;
      }
    }
    watching = pending;
    if (pending == 0) return;
    bool gave_up;
    if (first_pending < D) {
      gave_up = w.expired(p, WAIT_TILE, 0, first_pending / p.W, first_pending % p.W,
                          (long long)ld_acquire_sys(p.sig_tile + first_pending), p.window_chunks[first_pending]);
    } else {
      const long long r = first_pending - D;
      gave_up = w.expired(p, WAIT_RETURN, r / p.CH / p.L, r / p.CH, r % p.CH,
                          (long long)ld_acquire_sys(p.sig_comb + r), n1);
    }
    if (gave_up) return;
  }
}

__device__ void scheduler(const Params& p, volatile int* s_total) {
  const int lane = threadIdx.x;
  const int np = (int)p.n_proc;
  // lane's processors are q = lane + 32 g; what it has sent them lives in registers, and a
  // round's flags are read relaxed, all in flight at once, then made an acquire by one fence:
  // one memory latency per round instead of one per 32 processors and per 32 queue entries
  // (a round is what a processor waits for between its tasks)
  int sent[SCHED_GROUPS];
#pragma unroll
  for (int g = 0; g < SCHED_GROUPS; ++g) sent[g] = 0;
  int head = 0, published = 0;
  Waiter w(2);
  for (;;) {
    // decisions that end the loop are lane 0's, so the warp stays converged for its ballots
    if (__shfl_sync(0xffffffffu, lane == 0 && ld_relaxed_gpu(p.state + ST_ABORT) != 0, 0)) break;
    // the published prefix of the queue, READY_BATCH x 32 flags per read
    for (bool full = true; full;) {
      int ready[READY_BATCH];
#pragma unroll
      for (int u = 0; u < READY_BATCH; ++u) {
        int i = published + 32 * u + lane;
        ready[u] = i < p.queue_cap ? ld_relaxed_gpu(p.queue_ready + i) : 0;
      }
#pragma unroll
      for (int u = 0; u < READY_BATCH; ++u) {
        if (!full) break;  // uniform: it comes from a ballot
        unsigned b = __ballot_sync(0xffffffffu, ready[u]);
        int n = b == 0xffffffffu ? 32 : __ffs(~b) - 1;
        published += n;
        full = n == 32;
      }
    }
    const int total = __shfl_sync(0xffffffffu, *s_total, 0);
    const bool all_assigned = total >= 0 && head == total;
    int done[SCHED_GROUPS];
#pragma unroll
    for (int g = 0; g < SCHED_GROUPS; ++g) {
      int q = 32 * g + lane;
      done[g] = q < np ? ld_relaxed_gpu(p.mailbox_done + q) : -1;
    }
    // the tasks published and the processors' finished work, as seen above; and, ahead of the relaxed
    // mailbox stores below, their release
    fence_acq_rel_gpu();
    bool all_idle = true, progress = false;
    // idle processors first, then, with tasks left over, a second task to each busy one: it finds
    // that task in its other mailbox slot as it finishes, without waiting for this warp's round
    // (the round was a ~10 us gap between a processor's tasks); one still dispatching holds both
    // slots (moe.cu), so no task waits behind a staged sender's peers' chunks
#pragma unroll
    for (int ahead = 0; ahead < MAILBOX_SLOTS; ++ahead) {
#pragma unroll
      for (int g = 0; g < SCHED_GROUPS; ++g) {
        int q = 32 * g + lane;
        bool exists = q < np;
        bool ready = exists && sent[g] - done[g] == ahead;
        unsigned b = __ballot_sync(0xffffffffu, ready);
        if (ahead == 0) all_idle &= b == __ballot_sync(0xffffffffu, exists);
        int avail = published - head;
        if (avail > 0 && b) {
          int r = __popc(b & ((1u << lane) - 1u));
          if (ready && r < avail) {
            sent[g] += 1;
            st_relaxed_gpu(p.mailbox + mailbox_slot(q, sent[g]),
                           ((unsigned long long)sent[g] << 32) | (unsigned)(head + r));
          }
          head += min(__popc(b), avail);
          progress = true;
        }
      }
    }
    if (all_assigned && all_idle) break;
    if (progress) {
      w.restart();
    } else if (__shfl_sync(0xffffffffu,
                           lane == 0 && w.expired(p, WAIT_TASKS, head, total, published, head, total), 0)) {
      break;
    }
  }
  // stop every processor (also after an abort, so that none waits for a command)
  __syncwarp();
#pragma unroll
  for (int g = 0; g < SCHED_GROUPS; ++g) {
    int q = 32 * g + lane;
    if (q < np)
      st_release_gpu(p.mailbox + mailbox_slot(q, sent[g] + 1), ((unsigned long long)(sent[g] + 1) << 32) | STOP_INDEX);
  }
}
