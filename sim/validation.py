"""docs/validation.md from a list of comparisons (`moelab compare --all --markdown FILE`): the
calibration behind the predictions, the error table, which bounds hold, and what the model gets
right and misses, and the committed runs the calibration does not cover yet (a dtype or tile
shape whose kernel build was not measured), with the reason. The explanations are the findings of
issue 4, kept here with the generator so the page and its numbers change together."""

from __future__ import annotations

from collections import Counter, defaultdict

from reference.files import read_json

from . import heldout
from .calibrate import MEASUREMENTS
from .compare import LATENCY_BOUND, OVERLAP_BOUND, PHASE_BOUND, PHASES, Comparison, measured_runs, uncovered

MODELED = """\
The simulator runs the tile plan of the measured layer through the model of FlashMoE's
persistent kernel (`sim/kernel.py`), with every cost from the calibrated preset:

- **gate phase**: the kernel's float64 gate (FP64 tensor cores) in work items of 32 tokens x 64
  experts spread over all blocks (an item's H split over up to 8 blocks when the items are fewer
  than the blocks), then the capacity rule: each item counts its rows per (expert, choice), one
  block per expert scans those counts and each item's block gives its tokens their slots, three
  grid barriers in all (`gate_item_ns_per_h`, `gate_slot_ns`, `gate_fixed_ns`, `gate_split_ns`,
  fitted over six (tokens, experts) points of the gate alone);
- **dispatch**, the path the measured kernel took (the trace's meta `dispatch`): each tile's rows
  are stored straight into the owner's inbox (its own GPU, or an NVLink peer's through
  `nvshmem_ptr`), shared by up to 4 processors when the tile slots are fewer than the processors.
  A local share costs a fixed time + the round's mean share of bytes (its fence waits for the
  stores queued ahead of its own: a layer's half and full shares take the same time) at the L2's
  rate for the bytes in flight up to a knee and HBM's beyond, timed inside the megakernel on one
  GPU on eight layers no measured run uses (768 to 24576 tokens: `dispatch_store_fixed_ns`,
  `dispatch_store_l2_ns_per_byte`, `dispatch_store_ns_per_byte`, `dispatch_store_knee_bytes`; a
  calibration from before those layers fits fixed + bytes x one rate on the dispatch
  microbenchmark); a share to an NVLink peer costs a put's rate and
  its share of the port (`put_nvlink_ns_per_byte`, `nvlink_gbps`); and while any share goes over
  NVLink, a local share takes no less than an NVLink share of its size (the GPU's stores queue
  behind the port). The kernel's older put path (before 432d279: one block packs a tile with
  `copy_*` and puts it with its threads, `put_local_*`) stays modeled. Copies and puts run at
  their speed alone while the bytes all blocks move at once fit in the L2 and slow down beyond it
  (time per byte = alone + extra x beyond / (beyond + half), beyond the bytes in flight past
  `l2_knee_bytes`, fitted on 1 to 264 blocks of 256 KiB to 1 MiB);
- **GEMM0/GEMM1 tasks**: fixed cost + FLOPs over the block's rate at the megakernel's occupancy
  of 2 blocks per SM + the task's weight slice over the tiles sharing it at once, at a per-byte
  cost (`gemm_fixed_ns`, `matrix_efficiency`, `weight_load_ns_per_byte`), the rows computed in
  whole groups where the kernel's multiply does (`gemm_row_group`: the float32 SIMT GEMM of
  f85bd25 gives each thread 4 rows of every 64, so a 32-row tile costs about as much as a 64-row
  one), fitted on the megakernel's own tasks in the in-layer layers (tile heights from a few rows
  to 128, 1 to 3 tiles per expert), or, in a calibration from before those, on the
  microbenchmark's tile heights and 1, 2 and 8 tiles per expert; the tiles that share a slice are
  all of its expert's, from every source GPU, where the subscriber queues them together once the
  last has landed (the bf16 build, whose traces record `queue` "expert" or "expert-both"),
  else those of its expert from the same source GPU (they land and queue together); each GEMM1 task
  also stores its output into the source GPU's memory, over NVLink at `return_store_ns_per_byte`
  (how much longer a GEMM1 task of the peer's tiles takes than one of its own GPU's, less GEMM0's
  difference, in a two-GPU layer of 6144 tokens a GPU; one block's put rate in a calibration
  without that layer);
- **scheduling**: a processor is free again `handoff_ns` after a task (the median gap between a
  processor's tasks in a 12K-token layer: 2.4 us with the kernel's two-slot mailbox). With
  processors idle, three latencies from a 1.5K-token layer on one GPU (a layer no run measures):
  a landed tile's first task starts `wake_ns` after the subscriber's turn (`subscriber_ns`, the
  preset's estimate), a burst of tasks goes out one each `assign_ns` (the scheduler warp's
  pace), and the final combine starts `stop_ns` after the last task (the scheduler sees every
  processor idle and stops them);
- **combine**: the per-tile weighting task (a copy by one block, fixed + its tile's bytes at the
  L2's rate for the share of the layer's returned rows the L2 holds and HBM's beyond, timed on
  the same in-layer layers: `tile_combine_*`; the bf16 kernel's only marks the tile's arrival),
  then, once every task of the GPU is done, every processor's share of the final
  ordered combine: a fixed time + its bytes at `reduce_l2_ns_per_byte` for the share of all
  blocks' bytes the L2 still holds (`reduce_knee_bytes` of them) and `reduce_ns_per_byte` for the
  rest (`reduce_fixed_ns`; timed inside the megakernel on the same layers, the busiest blocks; a
  calibration without them: the microbenchmark at 1K-16K tokens, no fixed time, the copies' knee).

Each kernel build is calibrated on its own microbenchmarks: a bf16 run is predicted with the
figures of the bf16 build's section (`dtypes.bfloat16`: the tensor-core tile GEMM against the BF16
peak, 2-byte rows copied and moved, the gate on bf16 tokens, the bf16 layer's scheduling); the
byte moves of NVSHMEM (puts, round trips) are measured once and shared. A run is predicted with
the calibration of its own kernel commit (a `calibrated-<gpu>-<commit>.json` where an earlier
kernel's is kept, else the GPU's current one, which must be of the run's commit).
"""

FINDINGS = """\
Right:

- **180 of 227 runs hold every bound, 206 their latency**: on one and two H100s (the kernel of
  8e14b82), on one, two and four H100s at 33d8ac7 (the `h100x4-` bf16 sweep, an expert's GEMM1
  tasks queued together) and 175ba1d (the tf32x3 sweep, its ring one slice further ahead), each
  calibrated at its commit on two H100s: 44 of their 51 runs at the calibrated tiles, every
  tf32x3 one; on one, two and four H200s at fcd262e (the bf16 and tf32x3 sweeps: 44 of their 51
  runs at the calibrated tiles, every tf32x3 one), at b7b5b24 (the staged dispatch from 16
  senders, the `h200x4-` float32 runs), on one and two at b18c6d7 (16 senders, the
  `h200x2-` runs) and on two and four at fca7b10 (32 senders: its runs left are the flat
  dispatch's, named -store, and those with a tile per source, -apart), the bf16 128 x 256 tile of
  two warpgroups, each calibrated on the megakernel's own dispatch, GEMM tasks, per-tile and final
  combines. Each run is predicted with
  its own commit's measurements (fca7b10's, b18c6d7's and b7b5b24's kept as
  `calibrated-h200-<commit>.json`, fcd262e's measured on two of the four H200s). Latency errors:
  H100 float32 -3.1% to +6.1%, bf16 -5.0% to +1.9% on one GPU and -10.5% to +4.7% on two; H200
  float32 -5.9% to +4.9% on one, two and four GPUs (-7.7% to +6.0% with a tile per source); bf16
  (fcd262e) -4.5% to +3.6% on one, -10.3% to +0.4% on two (b18c6d7's 16 senders: -8.6% to
  +0.5%), -19.6% to -5.1% on four (the misses below); tf32x3 (fcd262e) -2.1% to +6.8% on one,
  two and four GPUs. Four H100s: tf32x3 (175ba1d) -2.3% to +8.0% on one, two and four GPUs;
  bf16 (33d8ac7) -6.5% to -1.1% on one, -13.7% to -3.4% on two, -24.3% to -6.0% on four (the
  misses below). Mean absolute latency error 4.1% (the 78 runs of fcd262e and 33d8ac7: 5.7%,
  their bf16 layers modelled short on every GPU count). The layer is a queue of
  equal tile tasks on 263 processors (131 on the bf16 and tf32x3 builds), each task a fixed cost plus its
  FLOPs' time and its share of its weight slice's loads, overlapped (below), with a hand-off
  between tasks and the scheduler's latencies around idle processors. Fewer runs hold every bound
  than at fca7b10 (127) because the float32 dispatch with 16 senders is modelled short on two and
  four GPUs alike (below): 14 of b7b5b24's 18 multi-GPU float32 runs miss there, every one of
  them within 1.9% on its latency.
- **The staged dispatch lets experts complete during the dispatch** (fca7b10): 32 processors (16
  since cb214ea) send the peers' chunks one after another, local expert by local expert, every GPU starting with a
  different peer, while the others store their own GPU's chunks and go on to the tasks. On four
  H200s, side by side with the flat dispatch in one call, bf16: the default 0.862 -> 0.791 ms, 16K
  1.711 -> 1.454, 128 experts 0.950 -> 0.865, 1K 0.239 -> 0.232; float32 default 7.616 -> 7.461.
  The model gives each chunk the processor the kernel gives its chunk slot (`staged_shares`) and
  predicts the staged layers within 10% where it predicted the flat ones (the four-GPU bf16 misses
  below are the same for both). Its shares' times: a sender's 1 MiB float32 chunk takes 90.6 us
  measured, the port's share with 32 senders (11.3 GB/s); the model priced it at one block's put
  rate, 9.7 GB/s (106.8 us), and now takes a stored share's rate from the block's copy loop and the
  port's share (`nvlink_share_ns`), which took 27 phase misses off. A GPU's own chunks, stored
  by 32-64 blocks at once, took 52.7-61.6 us a MiB against 111 modelled at the rate fitted with
  every processor storing; on the staged path each of those blocks now has its round's blocks'
  share of that memory, never faster than a block's own copy rate (`store_dispatch_ns`): the
  eleven two-GPU runs whose dispatch busy time was modelled 23-46% long hold.
- **A wave of GEMM1 tasks shares the NVLink port** (after b296b7f): measured on four GPUs, every
  GEMM1 task of a wave takes the wave's time, its peer stores sharing the port with the others';
  queued one after another (FIFO) the first tasks of a wave ended early. The simulator now runs a
  multi-GPU layer twice: the first pass queues the stores FIFO and counts, for each task, the tasks
  whose stores overlapped its own; the second gives each task its bytes at that share of the port
  (`FusedKernel.port_sharing`). Mean absolute latency error 4.02% -> 3.86%; the bf16 layer of 8
  experts on two GPUs holds (-10.2% -> -9.6%), that of 2K tokens on four with the flat dispatch
  nearly (-12.3% -> -10.0%, its GEMM1 busy time -24.1% -> -19.8%), and the 1K four-GPU runs'
  GEMM1 busy times hold. At 1K on four GPUs a GEMM1 task's extra time over GEMM0's is now
  modelled 10 us against 12 measured; what is left of that run's miss is both GEMMs' tasks (46.5 us modelled,
  52 measured for GEMM0).
- **The model picks the staged dispatch's sender count as the kernel does** (cb214ea): measured
  side by side on four H200s, bf16 default, 8, 16, 32, 48 and 64 senders took 0.758, 0.753,
  0.786, 0.821 and 0.817 ms; simulated with the count (`staged_blocks`, on b7b5b24's
  calibration), 16 against 32 is 0.962 (measured 0.958) and 64 against 32 1.048 (1.039), though
  every prediction is 6-7% short (the four-GPU bf16 miss below). Fewer senders leave more
  processors for the GEMMs while each wave still fills the NVLink port; the kernel now sends
  from 16.
- **An expert's rows from every GPU share its tiles** (ca250c7): the plan lays an expert's slots
  out GPU after GPU, C apart, and cuts windows of tile_m positions over them, so at 1K tokens
  (C = 32) four GPUs' rows fill one 128-row tile where each had a tile of its own. The model
  follows the plan (a tile lands with its last chunk, returns and combines per chunk), and the
  kernel was measured both ways in one call on four H200s: 1K bf16 0.325 -> 0.239 ms on four
  GPUs, 0.349 -> 0.284 on two; 1K float32 2.341 -> 1.135 and 2.277 -> 1.368 ms. Predicted: 0.252
  -> 0.194, 0.292 -> 0.248, 2.171 -> 1.047, 2.160 -> 1.404 (the float32 layers within 10%, the bf16
  ones short, below).
- **A wave of GEMM1 tasks queues its stores at the NVLink port** (four H200s): a GEMM1 task stores
  its output rows straight into each row's GPU, three quarters of them into peers on four GPUs. At
  1K tokens the layer's 128 GEMM1 tasks run as one wave and end together, and their 48 KiB of peer
  rows each (6 MiB a GPU) take 17 us at the port's 366 GB/s: measured, every task of the wave runs
  18 us longer than the GEMM0 tasks beside it (70.7 against 52.3 us; 42.3 against 42.3 on two
  GPUs, where a task's 16 KiB pass unnoticed). The model now sends each GEMM1 task's peer bytes
  through its GPU's port behind the tasks before it (`FusedKernel.through_port`, the calibrated
  `nvlink_gbps`): the nine four-GPU bf16 runs' latency errors went from -21.3%..-7.2% to
  -16.9%..-6.5%, three more of them within 10% (the default -10.7% -> -9.6%, 16 experts, 4K tokens),
  and the 2K two-GPU run with a tile per source (-10.3% -> -9.9%); float32 runs moved by 0.1-0.5%.
- **A task's multiply hides under its weight slice's load**: a bf16 task whose 128 x 256 slice
  streams from HBM for its tile alone takes 38-44 us whatever its rows (13 to 128, one H200, in
  the calibration's layers and the 128-expert run), and one of 128 rows takes 34-35, 30-32 and
  29.5 us at 2, 4 and 16 tiles per expert. The model added the two (fixed + FLOPs + load), so it
  overpredicted a tile alone on its expert the more rows it had: the 128-expert and 4K-token bf16
  runs on one GPU, GEMM1 +18.1% to +19.0% on both GPUs (near the 20% bound). The fit now tries the p-norm of
  multiply and load, (multiply^p + load^p)^(1/p), for p among 1.5, 2, 3 and 4, with the rate
  fitted beside it, and keeps one that takes 10% or more off the squared residuals of the same
  tasks (`gemm_overlap_power`): bf16 1.5 on both GPUs (28% and 16% fewer), float32 4 (25% and
  22%). GEMM1 busy time of those runs: +9.8% to +11.1%; their latency from +5.8% to +9.7% to
  +0.3% to +3.9%; over all 72 runs the mean latency error from 3.7% to 2.1% (bf16 5.2% to 2.8%,
  float32 2.2% to 1.4%). The same calibrations, no new measurement.
- **The layer's pieces are timed where they run** (since 58cca54): their microbenchmarks launch
  them alone, and the layer's differ from them both ways: at 1K tokens the layer's bf16 dispatch
  shares take 7.3 us against the microbenchmark's 5.5, its float32 final combine 6.9 us against
  9.7; its 32-row float32 tasks 140 us against the microbenchmark's 155 (every block in step
  there). The calibration times the dispatch, the GEMM tasks, the per-tile and the final combine
  inside the megakernel, on nine layers no measured run uses (768 to 24576 tokens over 64 experts,
  7168 over 8), and fits them
  there (the GEMM tasks weighted by their count: a layer's typical tasks, not its rare heights).
  The H100's 1K bf16 dispatch and combine, -30% and -22% when fitted on the microbenchmarks, hold
  (+3.5%, -6.6% at fd02f60); so do its 2K float32 dispatch (+8.2%, before +25%) and its float32
  combines (-12% to +10%, before down to -20%). Two H100s gave the same in-layer times within 3%.
- **A stored share's time is its round's, not its own**: the 1K float32 layer's shares of 32 to
  64 KiB take 9.2-9.5 us, the 2K one's of 80 to 128 KiB 16.9 us (H100). Each share fences its
  stores before its count, and the fence waits for what the whole GPU has queued: the model
  charges every share the round's mean, a fixed time (float32 7.2 us, bf16 5.6) and its bytes at
  0.021 and 0.051 ns each while the L2 holds the round (knees at 15 and 13 MiB), 0.15 and 0.14
  beyond. The knees move between calls (at 7ebaf93 float32's fit found none and bf16's one at 44
  MiB): seven layers set them loosely, and the fits hold within 9% either way.
- **The float32 per-tile combine slows as the layer grows**: one block weights each returned tile
  beside the GEMMs; in the layers it takes 14, 32, 66, 80 and 97 us per tile at 1K to 16K tokens,
  against copy_rows' 42 us alone. Fitted in the in-layer layers (3.0 us + 0.054 ns per byte while
  the L2 holds the layer's returned rows, up to 152 MiB, 0.17 beyond), the float32 combine's busy
  time went from -7% to -20% to within -11% to +9%.
- **A block of two warpgroups runs the gate on both** (1cfbaa3): the bf16 128 x 256 build has
  132 blocks of 256 threads, and its gate and slot scans run on 264 128-thread units, as the
  128 x 128 build's 264 blocks did. Fitted over 132 workers, the gate put two of the default's
  256 items on each and missed the layers' gate by +20% to +36%; over units
  (`warpgroups_per_block`, from the build's tile options) it holds (-8% to +5% on the
  microbenchmark). The fit also drops a figure least squares wants negative and fits the rest
  again: the slot scans, as many per unit at 8 experts as at 128, came out negative, and clipping
  them to 0 threw the other figures off.
- **A short float32 tile costs its active warps** (1cfbaa3, in the layers on one H100): tasks of
  13-15, 17-48, 49-64 and 65-128 rows took 103, 133-137, 166-170 and 208-222 us. Each of the 4
  warps holds 16 rows of the first group of 64, and a warp whose rows all lie past the tile
  skips the multiply; the model computes a tile of one group or less in quarters of it
  (`costs.grouped_rows`). At one level for every short tile the 1K-token run's 32-row tasks were
  predicted 12% long (layer +10.4%); now the run holds. The in-layer layers reach 24576 tokens (6
  tiles per expert), past the 16K run's 4: with 3 at most, the bf16 build's 16K tasks were
  predicted 15% long.
- **A bf16 task's stores cost it more than its FLOPs' share** (d888371): stored from the wgmma
  fragments, each warp's 4-byte stores fell on 8 rows, 16 bytes each, half of every 32-byte
  sector. Through shared memory in whole rows (512 contiguous bytes a warp) the calibrated fixed
  cost of a task went from 16.8 to 13.5 us, the GEMM task time per processor at 8 experts from
  0.595 to 0.544 ms, and the bf16 layers got 2-7% faster (one H100, side by side).
- **A bf16 task's epilogue waited on its biases** (625c2d5): clocked inside the task (a timer
  read at each phase, one H100), the epilogue took 5-9 us of a 33-48 us task: each bias load sat
  behind the shared-memory store before it, which the compiler could not tell from the bias. The
  accumulators now go into the stages as they are and each thread adds the biases of the same 4
  columns in every row it copies out: 2.5-3.6 us, the calibrated fixed cost of a task 13.5 -> 11.5
  us, the bf16 layers 2-8% faster (the default 1.015 -> 0.962 ms, 32 experts 0.878 -> 0.809, side
  by side). What is left of a task's fixed cost: ~1.4-2.5 us from the call to the first copy
  (the task function's register saves, its parameters' loads), 1.3-3.7 us until the first slice
  lands, 0.2-1.1 us of fence after GEMM0's stores.
- **A bf16 task's first slices are asked for before it starts** (fd02f60): the stages' barriers
  are set once per block, and the thread that takes a processor's next command asks for that
  GEMM's first three slices at once, while the task before does its bookkeeping. The calibrated
  fixed cost of a task went from 11.5 to 10.9 us; side by side on one H100 the layers of 8 and
  16 experts were 2-3% faster (0.755 -> 0.740, 0.771 -> 0.748 ms), the others within -1 to +1%.
  Naming the next task before the epilogue takes a third mailbox slot, and with it every
  float32 layer was 3.6-5.4% slower (the default 7.30 -> 7.59 ms), likely because the scheduler
  then commits tasks further ahead and the tasks sharing a weight slice start further apart
  (not measured).
- **Fewer L2 bytes per FLOP did not make the bf16 GEMM faster** (d27f1e2): a 192 x 256 tile, three
  warpgroups of 64 x 256 (112 FLOPs per L2 byte against 85 at 128 x 256), was slower at every
  point (8 experts 0.921 against 0.853 ms, the default 1.419 against 1.043, where each expert's
  256 rows make a 192-row and a 64-row tile). The L2's throughput is not what binds the 128 x
  256 tile.
- **The bf16 GEMM is not bound by issuing its copies** (44de2b3): its slices now come through the
  TMA (one thread asks for a slice's boxes, an mbarrier per stage counts the bytes in) instead of
  every thread's 16-byte cp.async copies, a wait and a barrier each. On one H100 a full task in
  the layers took the same (56 us at 6K tokens, 47-50 at 12K, within 3%), the bf16 layers -4% to
  +1% (experts-8 0.916 -> 0.882 ms, the default 1.11 -> 1.10); in the microbenchmark, every block
  in step, 52 -> 55-58 us. What an expert's tiles share of its weight slices sets a task's time:
  69, 55-58 and 45 us at 1, 2 and 8 tiles per expert.
- **The float32 GEMM computes its rows in groups of 64** (f85bd25): each thread holds 4 rows of
  every 64, so a tile of 64 rows or fewer keeps all four warps on the first group and a taller
  one computes both. In the layers a 32-row task takes 140 us, a 64-row one 150, a 128-row one
  227-239 (H100); the fit finds the group of 64 among 16, 32 and 64 (`gemm_row_group`). Before
  it each warp took 32 whole rows and a 64-row task cost 225 us, as much as a full one: the 2K
  float32 layer went from 3.76 to 2.60 ms.
- **The microbenchmark measures the layer's own GEMM again** (found at 3b6acac): its build of the
  float32 tile GEMM made each A-row load wait for the one before (ptxas zeroed the registers
  before each guarded load and made the zeroing wait on the loads' scoreboard; the megakernel's
  build did not), so its tasks ran 36-57% longer than the layer's (Nsight Compute put 71% of its
  warps' unissued samples on those zeroings). With the loads predicated (92205e7) both builds
  issue them back to back.
- **Sharing a weight slice stops paying at about 6 tiles** (8e14b82): the calibration's layer of
  8 experts at 7168 tokens (14 tiles per expert) times its bf16 tasks at 31.5 us (GEMM0) and 32.1
  (GEMM1), against 29.3 and 30.8 at 6 tiles; the fit's weight term, linear in 1 / the tiles
  sharing a slice, gives 27.8 (-12%, -13.5%). Capping the sharing at 6 tiles fits them within 4%
  but lowers the fit's weighted squared residuals by only 10% (the short tiles weigh most), so the
  model keeps the line. The 8-expert run on one GPU holds at -9.0% (its tasks 30.8 and 31.3 us
  against 27.4).
- **A block's later dispatch shares run beside the other blocks' later ones** (7305e40): the
  model took the bytes in flight and the shares over each link from the first round of shares
  and charged every share with them. At 16K tokens on two GPUs the bf16 build's 131 processors
  take 256 shares: the first round stores into the GPU (3 shares over NVLink), the second sends
  125 over NVLink at once, each at its share of the port (168 us median measured), where the
  model had them at a block's own put rate (56 us): dispatch busy time -20.5%, now +6.8%. And a
  share stored into its own GPU contends with the bytes its round stores there, not those sent
  to the peer (21d62f8): since bd3cbb8 fences a local tile at GPU scope its shares take 28 us
  beside NVLink ones (median, default, two H100s) against 37 on one GPU; the two-GPU bf16
  dispatch busy time of the default and of 8 to 128 experts went from +9..+21% to +5..+14%.
- **A two-GPU dispatch is the NVLink port's** (found at c796050): a GPU's local store shares take
  as long as its NVLink ones (bf16 default on 2 H200s: 88 vs 91 us median in the layer, 92 vs 92
  in the microbenchmark, against 32 us on one GPU alone); 32 MiB each way at ~370 GB/s. The
  microbenchmark now also times the dispatch on one GPU alone, which the local rate is fitted on;
  the two-GPU shares are checks the model meets within 8% (18% for the 8-row shares). Fitting the
  local rate on the two-GPU shares had overpredicted every one-GPU dispatch 2.8x.
- **...where another block shares the SM** (found on two H100s at 625c2d5): float32 (2 blocks per
  SM) stores its local and NVLink shares in 180 us each, as the H200s did, but the bf16 build (1
  block per SM) its local 128-row shares in 42 us and its NVLink ones in 89. A local share now
  waits for the NVLink ones only at more than one block per SM. And a block storing into the peer
  goes at its own rate or the port's share, whichever is slower, without the local puts' slowdown
  with the bytes in flight (the GPU's memory has ten times the port's bandwidth): the put
  microbenchmark's 16 and 32 blocks of 1 MiB each took 106-110 us, as one block does (109),
  where that slowdown made them 128-224. Before both, the two-GPU bf16 dispatch was predicted
  +55% to +125% long, and 9 of the 18 H100 bf16 runs missed a bound.
- **A share stored into the peer ends with a round trip**: its fence waits for the peer to
  acknowledge the last of its stores, two NVLink latencies (the calibrated half bare-signal round
  trip, ~1 us) on top of its bytes. The small shares' checks came within 10% (the H100's 8-row
  float32 and 16-row bf16 shares -11% and -24% before, -3% and -10% now; the H200's 8-row bf16
  -18%, now -2%), and the H200's 1K bf16 two-GPU dispatch, a miss at -28%, holds (-13%).
- **A GEMM1 task's stores into the peer cost less than a put** (2679fb2): each task stores its
  output rows straight into the source GPU's memory, and the model charged those over NVLink at
  one block's put rate (0.104 ns per byte: 6.8 us for a bf16 128 x 256 tile). Timed in a
  two-GPU layer no run measures (6144 tokens a GPU), a bf16 task of the peer's tiles takes 1.9 us
  longer than one of its own GPU's (GEMM0, which stores nothing away, 0.0): 0.038 ns per byte on
  two H200s. The H200's two-GPU bf16 GEMM1 busy times went from +11% to +21% (4K a miss) to +4%
  to +15%. Float32's difference is within its 220 us tasks' noise (-2.5 us; GEMM0 +0.5), so
  float32 stores cost nothing in the model. The H100's calibration (8e14b82) predates that layer
  and keeps the put rate. That layer also ended a hang: the two-GPU microbenchmark job used to run
  the one-GPU in-layer section, where rank 1 failed on rank 0's events and rank 0 waited for it
  until the job was killed (105 s of each build's calibration).
- **Weight reuse follows the queue**: the tiles whose tasks run at once share their weight
  slices in the L2. Queued as each tile landed (the float32 and tf32 builds, and the bf16 build up
  to 0521fe7), an expert's tiles from one source ran together and another source's in their own
  turn, 170-390 us later on two H100s, after the slices had left the L2: the median bf16 task took
  44.5 us where an expert's 2 tiles came from its own GPU, 45.0 where its 4 came 2 from each (two
  H200s). Since f715184 the bf16 subscriber holds an expert's tiles until its last has landed and
  queues their tasks column block by column block (`queue` "expert" in the trace): on two H100s
  the default's median GEMM0 task went from 43.6 to 31.0 us and the layer from 0.999 to 0.842 ms
  (side by side). The model shares a slice among the tiles queued together: all of the expert's
  where the trace says "expert", its own source's otherwise (with "expert" for the earlier bf16
  runs it had underpredicted them by up to 16%). On one GPU the microbenchmark's 1, 2 and 8 tiles
  per expert take 53.3, 44.7 and 40.7 us (128 rows, H200).
- **Small layers' scheduling**: the first task starts 5-9 us after its tile's signal, the first
  round of 263 tasks goes out over 16-18 us, and the final combine starts 5.5-7.5 us after the
  last task (the scheduler warp's polling; the same on every run and in the 1.5K-token
  microbenchmark). Modeled (`wake_ns`, `assign_ns`, `stop_ns`), the 1K-2K-token layers went from
  10-15% underpredicted to -9% to +3%.
- **Overlap efficiency** T(2)/T(1) holds within 0.1 on every run: two GPUs each with the same
  tokens take as long as one, except for the dispatch over NVLink (+50-170 us) and the GEMM1
  outputs stored over it, which the model prices. The H100's 16K bf16 layer, 1.232 measured
  against 1.113 predicted at fd02f60 (its two-GPU tasks ran 13-15% longer than its one-GPU ones),
  is 1.04 against 1.03 since its tiles from both GPUs share each weight slice.

What the datasheet preset ignored (each now a measured mechanism, none fitted to a layer run):

- the megakernel fits **2 blocks per SM** (float32: up to 255 registers), not 4, and the bf16
  128 x 256 x 64 build one block of two warpgroups (193 KiB of dynamic shared memory for its tile
  GEMM's four stages), each warpgroup a gate unit of its own;
- **short tiles are not proportionally cheaper**: a float32 task carries ~83-86 us of fixed cost
  (its 2048 x 64 weight slice loads whole however few rows the tile has) and computes its rows in
  groups of 64, a short tile in its active warps' 16 (above), a bf16 128 x 256 one ~10-11 us and
  its weight slice's share overlapped with its multiply (above). The FLOPs run at the slope over
  tile heights, which passes the bf16 peak and is capped there (H100, in the layers, 1cfbaa3; the
  float32 one, beside its p-norm, at 97-98% of the peak): the extra rows of a taller tile cost
  less than their FLOPs at the block's share of the peak, the fixed cost holding the rest;
- the **gate runs in float64 work items** (FP64 tensor cores, 32 tokens x 64 experts), 0.04 to
  0.16 ms with its capacity phase on either GPU (m16n8k8 mmas since 1458e09; 0.05 to 0.23 ms at
  965330c), not the microseconds of the matrix roofline; with fewer items
  than blocks an item's H is split over up to 8 blocks, whose partial sums meet after a grid
  barrier (`gate_split_ns`: 30-32 us on the H100 at 8e14b82, 24-27 us on the H200 since
  d92b7fd adds them on every thread of the grid, 1K tokens' gate 50 -> 38 us float32);
- **GEMM1 stores its output straight into the source GPU's memory** (its column block, with a
  count signal per task); the model adds those stores over NVLink to each task at the rate timed
  for them in a two-GPU layer (above);
- the **gate reads cold tokens** in a layer, so its microbenchmark evicts the L2 before each launch;
- **every processor ends with the ordered combine** of its share of tokens (~50-80 us at 8K), at a
  lower cost per byte while the L2 holds the returned rows (H100 inside the megakernel: 0.064 ns
  per byte of those, 0.108 from HBM, float32; 5 us per block at 1K tokens bf16, 156 at 16K
  float32).

Missed, and why (tests/test_compare_measured.py KNOWN_MISSES names each run and quantity):

- **bf16 on four GPUs**: on four H200s (fcd262e) 6 of the 9 runs miss their latency, -10.3% to
  -19.6% (the others -5.1% to -6.8%), the phases' busy times within 13% but GEMM1's at 2K: the
  phases run later and less overlapped than modelled (SM utilization 0.62-0.81 measured,
  0.73-0.87 modelled). At 2K a GEMM1 task, storing into three peers, takes 52.7 us against
  GEMM0's 35.2 (busy 0.103 ms a block against 0.076 modelled); stored into its own GPU instead
  (wrong output, timing only: `h200x4-experiments-gemm1-local-stores-2026-11-26.json`) the 2K
  layer's GEMM phase goes from 50.9/48.5% of the ceiling to 59.2/58.9%, so the stores cost its
  GEMM1 tasks about 12 us each and the rest of the gap is the tasks' own. T(2)/T(4) misses at 1K
  (1.17 measured, 1.31 modelled) and 2K (1.02, 1.13). At b7b5b24 4 of the 9 runs missed (-12.3%
  to -16.8%), at fca7b10 (32 senders) 6 of the 9 staged runs (-10.8% to -19.4%). With the
  flat dispatch (fca7b10, 4 of 9, -10.0% to -15.7%) and a tile per source (both) the GEMM tasks
  run longer than modelled (1K flat: a GEMM0 task 52.8 us measured, 46.8 modelled; a GEMM1 task
  68.6 against 59.1), and the flat dispatch ends later (16K: at 569 against 437 us, busy 0.30
  against 0.23 ms a block; T(2)/T(4) 0.853 against 0.965 beside the flat two-GPU run).
- **bf16 on four H100s** (33d8ac7): 4 of the 9 runs miss their latency, -11.6% to -24.3% (the
  others -6.0% to -9.9%), as on four H200s: the phases run later and less overlapped than
  modelled (8 experts: SM utilization 0.75 against 0.83, GEMM0 busy -13.7%); at 1K the gate's and
  the dispatch's busy times miss too (0.0447 against 0.0353 ms a block, -21%; -23%) and
  T(2)/T(4) (1.25 measured, 1.43 modelled). On two H100s of that call the 1K and 2K layers miss
  as at 8e14b82 (-13.7% and -12.5%: the gate 0.043 and 0.051 ms a block against 0.035 and 0.045,
  GEMM0 0.115 and 0.122 against 0.103 and 0.108; below), and the 128-expert dispatch's busy time
  is modelled 27% short (0.0295 ms a block against 0.0216), its latency within 5.3%, as at
  163bbf2. The 1K layer on two H200s (fcd262e) misses the same way: every phase longer than
  modelled, none by more than 11%, layer -10.3%.
- **16 senders, float32** (b18c6d7 on two GPUs, b7b5b24 on two and four; dispatch busy -23% to
  -33% in 7 of each commit's and GPU count's 9 runs, the 1K and 2K ones holding; their latency
  within -1.1% to +1.9%): in the defaults a share to a peer took a median 63.7-64.4 us a MiB (16
  GB/s a block, under its share of the port, 23 GB/s with 16 senders; 47.8 modelled) and one of
  the GPU's own 55.9-62.6 us (41.5-42.8 modelled). The model caps a block's stores at copy_rows'
  rate alone (25 GB/s); in the staged layer GEMM tasks run beside the stores from the first wave
  on, and no microbenchmark times a few blocks' stores beside GEMMs. The bf16 runs hold (a bf16
  block, 256 threads, stores 20 GB/s).
- **The 1K bf16 run on two H200s with a tile per source** (-13.3%): the gate takes 43.8 us against
  the model's 35.9 (the gate's fit is 10.7% short at 1K on its own microbenchmark, 40.2 us), and
  the GEMM1 tasks 31.1 us against GEMM0's 26.3 (model 25.1). Merged it holds (-8.2%).
- **The 1K float32 runs on four GPUs** (b7b5b24's gate and combine busy, the flat dispatch's
  combine at fca7b10): the gate takes 42.9-43.9 us a block against the model's 34.9 (its fit is
  12.1% short at 1K on the gate's own microbenchmark at b7b5b24, 10.7% at fca7b10; busy -18% to
  -21% in every 1K float32 run), and the combines are modelled 20-21% long. T(2)/T(4), which
  missed at fca7b10 (1.34-1.36 modelled against 1.20-1.22), holds at b7b5b24 (1.351 against
  1.265: the four-GPU layer -2.5%, the two-GPU one +4.1%).
- **The float32 flat dispatch on four GPUs** (16K, +22% busy time): each share is priced at its
  part of the NVLink port with every peer's shares in flight; not analysed.

- **The 1K bf16 run on two GPUs, on the H100** (8e14b82): every phase runs longer than
  modelled, none by more than 20%: the gate 47.5 us against 43.9, a dispatch share 9.1 against
  8.1, the GEMM tasks 33.9 and 37.3 us against 32.9 and 33.4 (medians over both ranks), layer
  -10.5% (-13.8% before the overlapped GEMM model). The H200's run missed the same way at
  2679fb2 (layer -12.9%, the gate 48.3 us against 43.8); at d92b7fd, whose gate's split sums
  take 41 us there, it holds at -9.2% (busy times -5.6% to -13.6%, the GEMM tasks 26.8 and 28.8
  us against 25.8 and 25.9). The one-GPU runs hold (-1.3%, -4.8%): what slows the two-GPU one is
  not timed apart. Its GEMM tasks are 32-row tiles, two per expert (one from each GPU),
  and the calibration's own one-GPU layers show the same at two tiles per expert: GEMM1 tasks 16%
  (H200) and 27% (H100) above the GEMM fit, GEMM0 tasks 5% and 2% below it (task-weighted), where
  at 1, 3, 6 and 14 tiles both kinds lie within 9% of it; one fit for both kinds cannot say so,
  and a fixed cost and weight term per kind leave GEMM1 at two tiles 11-22% above. Those two-tile
  points all come from the 6144-token layer (a 128-row and a 64-row tile an expert), where a
  128-row GEMM1 task takes 39.4 us (H200) and 51.1 (H100), near a lone tile's 42-44 and 54-56,
  against GEMM0's 32.2 and 38.8 beside it: as if the two tiles' GEMM1 tasks did not share the
  slice. Each tile's GEMM1 tasks are queued when its own GEMM0 tasks end, and tiles of two
  heights end theirs apart; at three equal tiles (12288 tokens) GEMM1 shares as GEMM0 does (32.4
  against 30.3 us).
  Why is open: an expert's GEMM1 tasks are queued tile by tile as each tile's GEMM0 ends, but in
  the 1K two-GPU traces the two tiles' GEMM1 tasks still start a median 0.06-0.07 of a task apart
  (p90 0.8), so they mostly run side by side. On the H200 at
  965330c the 1K bf16 one-GPU dispatch missed (-43%: its calibration predated the in-layer
  layers); calibrated in the layers it holds.
  At f715184 the 8-experts run on one GPU missed too (layer -11.1%; now -9.0%, above); at fd02f60
  128 experts and 4K tokens on two GPUs (GEMM1 +23%, each expert's one tile loading its slices
  alone) and 16K's overlap; with the expert's tiles from both GPUs sharing each slice, those hold.
"""


def _pct(e):
    return "" if e is None else f"{100 * e:+.1f}%"


def _verdict(c: Comparison) -> str:
    if not c.run.commit:
        return "not held: no commit recorded"
    return "hold" if c.ok else "miss"


def _row_of(c: Comparison, prefix: str):
    return next((r for r in c.rows if r[0].startswith(prefix)), None)


def pending_runs() -> list[tuple[str, str]]:
    """(run, why) for every committed run that the calibration does not cover yet."""
    return [(r.name, why) for r in measured_runs(calibrated_only=False) if (why := uncovered(r))]


def _figures_table(figures: dict, sources: dict) -> list[str]:
    return ["| figure | value | from |", "| --- | --- | --- |"] + [
        f"| `{k}` | {v:.6g} | {sources.get(k, '')} |" for k, v in figures.items()]


def markdown(comparisons: list[Comparison], pending: list[tuple[str, str]] | None = None) -> str:
    """The page; `pending` (default: the committed runs the calibration lacks) listed by reason. The
    validation set's runs have a section of their own (sim/heldout.py), apart from the error table."""
    pending = pending_runs() if pending is None else pending
    every, comparisons = comparisons, [c for c in comparisons if not heldout.is_validation(c.run)]
    lines = ["# Validation: predicted against measured", "",
             "Generated by `moelab compare --all --markdown docs/validation.md` (issue 4). Every committed "
             "measured layer run under `measurements/gpu/` is simulated with the preset calibrated on its "
             "GPU's microbenchmarks (`moelab calibrate`, from `measurements/calibration-<gpu>.json`); the "
             "calibration never sees a layer run (leave-one-out). CI (`tests/test_compare_measured.py`) "
             f"holds the bounds: layer latency within {LATENCY_BOUND:.0%}, each phase's busy time within "
             f"{PHASE_BOUND:.0%}, overlap efficiency within {OVERLAP_BOUND} absolute.", ""]
    lines += ["## The calibrated presets", ""]
    for hw_name, path in sorted({(c.hardware.name, f"calibrated-{c.run.gpu_tag}.json") for c in comparisons}):
        doc = read_json(MEASUREMENTS / path, "a calibrated preset (moelab calibrate --out)")
        dtypes = doc.get("dtypes", {})
        tiles = ", ".join(f"{d} at {'x'.join(map(str, sec['tile']))}" for d, sec in dtypes.items())
        lines += [f"`measurements/{path}` ({hw_name}, on `{doc['base']}`; kernel builds calibrated: "
                  f"{tiles or 'float32'}). The float32 build's figures:", ""]
        lines += _figures_table({k: v for k, v in doc.items() if k not in ("base", "name", "sources", "dtypes")},
                                doc["sources"])
        for dtype, sec in dtypes.items():
            figures = {k: v for k, v in sec.items() if k not in ("tile", "sources")}
            if figures:
                lines += ["", f"The {dtype} build's figures (`dtypes.{dtype}`):", ""]
                lines += _figures_table(figures, sec.get("sources", {}))
        lines.append("")
    lines += ["## Error table", "",
              "Errors are (predicted - measured) / measured; phases are busy time per processor block. "
              "Layer latency is the telemetry trace's span (first start to last end).", "",
              "| run | GPUs | dtype | T/GPU | E | latency measured ms | predicted ms | latency | "
              + " | ".join(PHASES) + " | SM util meas / pred | overlap eff. meas / pred | bounds |",
              "| --- " * (11 + len(PHASES)) + "|"]
    misses = Counter()
    for c in comparisons:
        cfg = c.run.config
        lat = _row_of(c, "layer latency")
        phases = [_pct(r[3]) + ("" if r[5] is not False else " **miss**") if (r := _row_of(c, ph)) else "–"
                  for ph in PHASES]
        util = _row_of(c, "SM utilization")
        oe = _row_of(c, "overlap")
        oe_text = "–" if oe[1] is None else f"{oe[2]:.3f} / {oe[1]:.3f}"
        for r in c.rows:
            if r[5] is False and c.run.commit:
                misses[r[0].split(" (")[0]] += 1
        lines.append(f"| {c.run.name} | {cfg.ranks} | {cfg.dtype} | {cfg.tokens} | {cfg.experts} | {lat[2]:.3f} | "
                     f"{lat[1]:.3f} | "
                     f"{_pct(lat[3])}{'' if lat[5] else ' **miss**'} | " + " | ".join(phases)
                     + f" | {util[2]:.3f} / {util[1]:.3f} | {oe_text} | {_verdict(c)} |")
    bound = [c for c in comparisons if c.run.commit]
    held = sum(c.ok for c in bound)
    lines += ["", f"**{held} of {len(bound)} runs with a recorded kernel commit hold every bound.**"
              + ("" if not misses else " Misses by quantity: " + ", ".join(f"{k} ({n})" for k, n in misses.items())
                 + "."), ""]
    lines += [heldout.markdown(every), "## What the model covers", "", MODELED,
              "## What it gets right, what it misses and why", "",
              FINDINGS]
    gpus = sorted({(c.run.config.ranks, c.run.config.dtype, c.run.gpu_tag) for c in comparisons})
    lines += ["## Coverage", "", "Measured runs compared, by (GPUs, dtype, GPU): "
              + ", ".join(f"{n} x {tag} {dt}" for n, dt, tag in gpus) + ". The issue asks for 1, 2 and 4 GPUs in "
              "float32 and bf16; the H100's runs stop at 2 GPUs.", ""]
    by_reason = defaultdict(list)
    for name, why in pending:
        by_reason[why].append(name)
    if by_reason:
        lines += ["Committed runs not compared yet: their kernel build or tile shape has no calibration "
                  "(measure it with the `calibrate` part of `benchmarks/device_run.sh`, then `moelab "
                  "calibrate`); CI skips them with the same reason:", ""]
        lines += [f"- {len(names)} run(s) ({', '.join(names)}): {why}" for why, names in by_reason.items()]
        lines.append("")
    return "\n".join(lines)
