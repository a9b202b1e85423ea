// The kernel's one argument block, filled by gpu/layout.py (PARAM_FIELDS lists these fields in
// this order; a CPU test checks that both lists agree). Every field is 8 bytes, so the layout has
// no padding and an array of 64-bit words matches it byte for byte (a double as its bits).
#pragma once
#include <stdint.h>
#include <cuda_bf16.h>

// Numbers Python owns (event kinds, gate and activation codes, the gate's work item, a chunk's most
// shares) arrive as -D flags from gpu/layout.py kernel_constants: one owner for both languages.
#ifndef MOELAB_EV_GATE
#error "built without gpu/layout.py's kernel_constants: build with gpu/build.py (build.defines)"
#endif

// The element type of tokens, expert weights and the rows moved between ranks: float32, or bf16
// in the kernel built with -DMOE_BF16=1 (gate weights, biases, logits and y stay float32/64).
#if MOE_BF16
typedef __nv_bfloat16 elem_t;
#else
typedef float elem_t;
#endif
// The kernels whose tile GEMM is the warpgroup one (tile_gemm_wgmma.cuh), reading its operands
// through the TMA from K-major weights: bf16, and float32 data multiplied as split TF32 (tf32x3)
#if MOE_BF16 || MOE_TF32X3
#define MOE_WGMMA 1
#else
#define MOE_WGMMA 0
#endif
// The layer's features that change a GEMM task, each a build flag (gpu/layout.py compile_options),
// so a layer without them runs the code it ran before: MOE_GATED, the gated activation's code
// (MOELAB_ACT_SWIGLU or MOELAB_ACT_SWIGLU_OAI; 0: none), W1's gate and up columns interleaved (column 2j the gate of j, 2j + 1 its up); MOE_SHARED, shared
// experts as local tasks; MOE_SCALE_BEFORE, a routed row dispatched as its token times its routing
// weight and combined with weight 1 (Llama 4);
// MOE_RAGGED, H or W1's columns not a multiple of TILE_N (the last column block stores fewer).
#ifndef MOE_GATED
#define MOE_GATED 0
#endif
#ifndef MOE_SHARED
#define MOE_SHARED 0
#endif
#ifndef MOE_SCALE_BEFORE
#define MOE_SCALE_BEFORE 0
#endif
#ifndef MOE_RAGGED
#define MOE_RAGGED 0
#endif

struct Params {
  // inputs of this rank
  const elem_t* x;             // [T][H] tokens living on this rank
  const float* wg;             // [H][E] gate weights
  const double* logit_offset;  // [E]    skew * ln(1 + e), subtracted from the float64 logits
  const double* gate_bias;     // [E]    selection-only bias of the sigmoid_bias gate
  const double* wg_bias;       // [E]    the gate's bias, added to the float64 logits (zeros without router_bias)
  const elem_t* w1;            // [L+S][H][I'] the local experts' weights, then the shared ones' (MOE_WGMMA:
                               //           [L+S][I'][H], K-major); I' = 2I gated (interleaved), else I
  const float* b1;             // [L+S][I']
  const elem_t* w2;            // [L+S][I][H] (MOE_WGMMA: [L+S][H][I])
  const float* b2;             // [L+S][H]
  // outputs of this rank
  float* y;                    // [T][H]
  double* logits;              // [T][E] float64 gate logits (scratch, kept for inspection)
  int* expert;                 // [T][k] chosen experts, best first
  double* weight;              // [T][k] their combine weights
  int* slot;                   // [T][k] row in the (this rank, expert) block, -1 if dropped
  int* counts;                 // [E]    rows this rank sends to each expert
  int* slot_base;              // [E][k][T/32] rows of each gate item per (expert, choice), then
                               //              (scanned) the expert's slots taken before the item
  int* row_token;              // [E][C] token of each slot
  int* row_choice;             // [E][C] choice index of each slot
  float* row_weight;           // [E][C] combine weight of each slot
  int* count_base;             // [E]    this rank's rows of the experts before e: expert e's slot s is row
                               //        count_base[e] + s of staging and combox (at most T k rows in all)
  // symmetric (NVSHMEM) buffers
  elem_t* inbox;               // [L][P][C][H] dispatched rows arriving from each source rank (tiles.cuh)
  elem_t* staging;             // [R][H]       this rank's rows packed per expert (count_base), put from here
                               //              (where the owner's inbox is not load/store reachable)
  elem_t* outbuf;              // [L][P][C][H] GEMM1 output per source, put back from here
                               //              (where the source's combox is not load/store reachable)
  elem_t* combox;              // [R][H]       returned rows of this rank's tokens (count_base)
  uint64_t* sig_count;         // [P][L]       (epoch << 32) | rows, from each source
  uint64_t* sig_tile;          // [L][W]       chunks of a tile window landed so far (tiles.cuh)
  uint64_t* sig_comb;          // [E][CH]      GEMM1 column blocks of a returned chunk landed so far
  uint64_t* sig_start;         // [P]          epoch when each rank's kernel has started
  uint64_t* sig_base;          // [P][L]       (epoch << 32) | the source's count_base of each local expert
  // local working state, zeroed before every launch
  elem_t* hidden;              // [L][P][C][I] GEMM0 output, then [S][T][I] the shared experts'
  double* gate_partial;        // [gate_splits][T][E] the gate's partial logits over a range of H
  int* state;                  // STATE_WORDS ints: barrier, abort, queue tail, ...
  int4* queue;                 // [Q] task descriptors
  int* queue_ready;            // [Q] 1 once the descriptor is written
  int* tile_done0;             // [L][W] GEMM0 tasks finished per tile
  int* tile_done1;             // [L][W] GEMM1 tasks finished per tile
  int* dispatch_done;          // [E][CH] blocks done storing their share of a dispatched chunk
  int* in_count;               // [P][L] rows arriving from each source, from sig_count
  int* in_base;                // [P][L] where they go home in the source's combox, from sig_base
  int* window_rows;            // [L][W] rows a tile computes (to its last row; 0: no tile), by the subscriber
  int* window_chunks;          // [L][W] chunks a tile waits for, by the subscriber
  int* watch;                  // [L*W + E*CH] the tiles and returned chunks each subscriber lane still waits for (os.cuh)
  int* expert_tiles;           // [3][L] tiles each local expert expects, those landed and those whose GEMM0 is done
  unsigned long long* mailbox; // [NP][2] (sequence << 32) | task index, written by the scheduler
                               //         (slot sequence % 2: the running task's and the next one's)
  int* mailbox_done;           // [NP] last sequence number a processor finished (-2 while it dispatches)
  long long* error;            // ERROR_WORDS: the first failed wait
  unsigned long long* tlog;    // [logs][tlog_cap][4] telemetry events
  int* tlog_count;             // [logs] events written (may exceed tlog_cap: dropped)
  const unsigned char* tmaps;  // bf16: [5][128 B] TMA tensor maps of inbox, hidden, w1, w2, x (TMAP_*, gpu/tma.py);
                               //       null in the other builds
  // sizes
  long long T, H, I, E, K, P, L, C;
  long long W;                 // tile windows per local expert (tiles.cuh)
  long long CH;                // chunk slots per (source, expert) block: the most chunks it can be cut into
  long long stride;            // positions between two sources' slots in a window (tiles.cuh)
  long long rank, gate_kind, act_kind, n_proc, queue_cap, tlog_cap, timeout_ns;
  long long n_group, topk_group;  // group-limited top-k: the k from the topk_group best of n_group groups
  double routed_scaling;       // every routed weight multiplied by it (1: none)
  long long direct_stores;     // 1: rows are stored straight into peers' memory where nvshmem_ptr reaches it
                               //    (dispatch into the owner's inbox, GEMM1 into the source's combox); 0: puts
  long long staged_blocks;     // processors that send the peers' dispatched chunks on the staged dispatch;
                               //    0: every processor shares every chunk (processor.cuh dispatch_chunks)
  long long gate_splits;       // most blocks one gate item's H may be split over (gate_partial's size)
  // shared experts and the gated and scaled GEMM0 (the build flags above)
  elem_t* shared_out;          // [S][T][H]    GEMM1 output of the shared experts (MOE_SHARED)
  long long S;                 // shared experts: local experts L .. L+S-1 of the weights
  long long WS;                // tile windows per shared expert: ceil(T / TILE_M)
  double swiglu_alpha;         // swiglu_oai: act(g, u) = min(g, l) sigmoid(alpha min(g, l)) (clamp(u, -l, l) + 1)
  double swiglu_limit;         //             l
};

// the bf16 GEMM's tensor maps in Params.tmaps (gpu/tma.py OPERANDS), 128 bytes each
enum { TMAP_INBOX = 0, TMAP_HIDDEN = 1, TMAP_W1 = 2, TMAP_W2 = 3, TMAP_X = 4, TMAP_BYTES = 128 };

// state[] words
enum { ST_BARRIER = 0, ST_ABORT = 1, ST_QTAIL = 2, STATE_WORDS = 8 };

// gate_kind / act_kind values (positions in reference.config GATES / ACTIVATIONS)
enum {
  GATE_SOFTMAX_TOPK = MOELAB_GATE_SOFTMAX_TOPK, GATE_SOFTMAX_TOPK_RENORM = MOELAB_GATE_SOFTMAX_TOPK_RENORM,
  GATE_TOPK_SOFTMAX = MOELAB_GATE_TOPK_SOFTMAX, GATE_SIGMOID_BIAS = MOELAB_GATE_SIGMOID_BIAS,
  GATE_SIGMOID_TOPK = MOELAB_GATE_SIGMOID_TOPK
};
enum { ACT_RELU = MOELAB_ACT_RELU, ACT_GELU_TANH = MOELAB_ACT_GELU_TANH, ACT_GELU = MOELAB_ACT_GELU, ACT_SILU = MOELAB_ACT_SILU };

// task kinds in queue descriptors: GEMM {kind, local expert, window, col0}, combine {kind, expert, chunk, 0}
enum { TASK_GEMM0 = 0, TASK_GEMM1 = 1, TASK_COMBINE = 2, TASK_STOP = 3 };

// error record: flag, rank, block, thread, what, a, b, c, value, expected, waited_ns
enum { ERROR_WORDS = 11 };
enum {
  WAIT_BARRIER = 1,      // a grid barrier (a = barrier index)
  WAIT_COUNT = 2,        // the row count from source rank a for local expert b
  WAIT_TILE = 3,         // tile window c of local expert b (a: chunks landed, value: of expected)
  WAIT_RETURN = 4,       // returned chunk c of expert b (owner a)
  WAIT_COMMAND = 5,      // a processor waiting for the scheduler's next command
  WAIT_TASKS = 6,        // the scheduler waiting for tasks (a = assigned, b = total)
  BAD_COUNT = 7,         // source a announced more rows for local expert b than the capacity
  QUEUE_FULL = 8,        // the task queue overflowed (a = index, b = capacity)
  WAIT_START = 9,        // the kernel of rank a to start (this launch's epoch)
  WAIT_SLICE = 10,       // bf16 tile GEMM: slice c of A rows a.. and weight rows b.. (TMA) to land
};

// telemetry: event kinds (positions of sim.trace KINDS)
enum {
  EV_GATE = MOELAB_EV_GATE, EV_DISPATCH = MOELAB_EV_DISPATCH, EV_GEMM0 = MOELAB_EV_GEMM0, EV_GEMM1 = MOELAB_EV_GEMM1,
  EV_COMBINE = MOELAB_EV_COMBINE, EV_SIGNAL = MOELAB_EV_SIGNAL, EV_WAIT = MOELAB_EV_WAIT
};
