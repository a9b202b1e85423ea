"""docs/validation.md from a list of comparisons (`moelab compare --all --markdown FILE`): the
calibration behind the predictions, the error table, which bounds hold, and what the model gets
right and misses, and the committed runs the calibration does not cover yet (a dtype or tile
shape whose kernel build was not measured), with the reason. The explanations are the findings of
issue 4, kept here with the generator so the page and its numbers change together."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

from .calibrate import MEASUREMENTS
from .compare import LATENCY_BOUND, OVERLAP_BOUND, PHASE_BOUND, PHASES, Comparison, measured_runs, uncovered

MODELED = """\
The simulator runs the tile plan of the measured layer through the model of FlashMoE's
persistent kernel (`sim/kernel.py`), with every cost from the calibrated preset:

- **gate phase**: the kernel's float64 gate (FP64 tensor cores) in work items of 32 tokens x 64 experts spread over
  all blocks (an item's H split over up to 8 blocks when the items are fewer than the blocks),
  then the capacity rule: since 52ec480 each item counts its rows per (expert, choice), one block
  per expert scans those counts and each item's block gives its tokens their slots, three grid
  barriers in all (before, one block per expert scanned every (token, choice), two barriers)
  (`gate_item_ns_per_h`, `gate_slot_ns`, `gate_fixed_ns`, `gate_split_ns`, fitted over six
  (tokens, experts) points of the gate alone);
- **dispatch**, the path the measured kernel took (the trace's meta `dispatch`): since 432d279
  each tile's rows are stored straight into the owner's inbox, shared by up to 4 processors when
  the tile slots are fewer than the processors, a share costing a fixed time + its bytes at the
  rate the dispatch microbenchmark measures with every processor at once
  (`dispatch_store_fixed_ns`, `dispatch_store_ns_per_byte`: its stores drain before the tile's
  signal, so it moves ~8 GB/s per block on the H200, not copy_rows' 20-45); before, each tile
  was gathered by one processor block (`copy_*`), then put by the same block's threads
  (`put_local_*`, `put_nvlink_ns_per_byte`, `nvlink_gbps`): NVSHMEM's block put moves the bytes
  with the block, so a put costs the issuing block its duration, not only link time. Copies and
  puts run at their speed alone while the bytes all blocks move at once fit in the L2 and slow
  down beyond it (time per byte = alone + extra x beyond / (beyond + half), beyond the bytes in
  flight past `l2_knee_bytes`; one knee for copies and puts, fitted on 1 to 264 blocks of 256 KiB
  to 1 MiB);
- **GEMM0/GEMM1 tasks**: fixed cost + FLOPs over the block's rate at the megakernel's occupancy
  of 2 blocks per SM + the task's weight slice over the tiles of its expert that share it at once,
  at a per-byte cost (`gemm_fixed_ns`, `matrix_efficiency`, `weight_load_ns_per_byte`, fitted over
  tile heights and 1, 2 and 8 tiles per expert; the calibration of 3e55a17 timed 2 only, and its
  fixed cost holds that share); each GEMM1 task also stores its
  output into the source GPU's memory (over NVLink at a block's put rate);
- **scheduling**: a processor is free again `handoff_ns` after a task (the median gap between a
  processor's tasks in a 12K-token layer: 2.4 us with the kernel's two-slot mailbox, which gives a
  busy processor its next task ahead; 8-10 us before it); an arrived tile becomes tasks
  `subscriber_ns` after its signal (the preset's estimate: the shortest arrival-to-first-task delay
  also waits for a processor, so it is printed, not fitted);
- **combine**: the per-tile weighting task (a copy by one block), then, once every task of the
  GPU is done, every processor's share of the final ordered combine (`reduce_ns_per_byte`).

Each kernel build is calibrated on its own microbenchmarks: a bf16 run is predicted with the
figures of the bf16 build's section (`dtypes.bfloat16`: the tensor-core tile GEMM against the BF16
peak, 2-byte rows copied and moved, the gate on bf16 tokens, the bf16 layer's hand-offs); the
byte moves of NVSHMEM (puts, round trips) are measured once and shared. The bf16 kernel's combine
task only marks a tile's arrival: its final combine weights the 2-byte rows in float32.
"""

FINDINGS = """\
Right:

- **58 of 72 runs hold every bound**: 16 of 18 on one H200 and 14 of 18 on one H100 with the
  kernel of 7333a89 (bf16 GEMM on wgmma, two-slot mailbox, dispatch stored into the owner's
  inbox, capacity from per-item counts), 28 of 36 on 2 H200s with that of 3e55a17 (dispatch
  packed and put), each run predicted with its own kernel's microbenchmarks (the one-GPU
  calibrations' NVLink figures stay the preset's: only one-GPU machines were lent). Every run from
  4K tokens on holds on both GPUs for 7333a89: the layer is a queue of equal tile tasks on 263
  processors, each task a fixed cost plus its FLOPs plus its share of its weight slice's loads,
  with a hand-off between tasks.
- **Weight reuse across an expert's tiles** (found with 432d279, modeled since 52ec480): a bf16
  GEMM task's time depends on how many of its expert's tiles share its weight slice at once. The
  median 128-row GEMM0 task takes, on the H200 / H100: 50-54 / 62-66 us at 1 tile per expert (4K
  tokens; 128 experts), 44-45 / 50 us at 2 (the default), 41 / 42-43 us at 4, 39-40 / 40-41 us at
  8-16 (8 and 16 experts); the microbenchmark at 1, 2 and 8 tiles per expert agrees (H200 52.4,
  47.3, 41.0 us at 52ec480) and fits 0.027 / 0.058 ns per byte of a slice's share (13.9 / 30.2
  us for a 512 KiB slice loaded alone). Before, one fixed cost fitted at 2 tiles per expert underpredicted
  the 4K-token and 128-expert layers by 10-18% and overpredicted the H100's GEMM phases at 8-32
  experts by 22-30%: all now within the bounds. The float32 tasks, 270 us of FLOPs each, show no
  such dependence (within 1%).
- **Overlap efficiency** T(2)/T(1) holds on every run that has a 2-GPU partner of the same kernel,
  within 0.05: two GPUs each with the same tokens take as long as one, because NVLink transfers
  hide under the GEMMs. (Before the bench lined the ranks' launches up, the 2-GPU runs carried the
  hosts' enqueue skew, 8-155 us, and small layers looked 10-18% slower on 2 GPUs than on 1; that
  was the measurement, not the kernel. And once, at 7b622f8, the first trace of each 2-GPU sweep
  put rank 1 104 us late though both ranks' gate events, which contain the kernel's start wait,
  were the usual length: that clock sync had read off. A trace now keeps the median of three
  clock syncs.)
- **The stored dispatch**: a share's time is linear in its bytes at the layer's concurrency
  (H200 bf16: 0.12 ns per byte, 5-65 us for 8-128 rows), 2.5-5x the per-byte time of copy_rows
  timed alone, because its stores must drain before the tile's count and signal; predicted within
  4% from 4K tokens on.

What the datasheet preset ignored (each now a measured mechanism, none fitted to a layer run):

- the megakernel fits **2 blocks per SM** (up to 255 registers, 97 KiB of dynamic shared memory
  for the bf16 128 x 128 x 64 tile GEMM's three stages), not 4;
- **short tiles are not proportionally cheaper**: a float32 task carries ~130 us of fixed cost
  (its 2048 x 64 weight slice loads whole however few rows the tile has), a bf16 one ~22 us plus
  its weight slice's share (above), and
  its FLOPs run at the slope over tile heights (float32: 94% of the FP32 peak per block; bf16: the
  slope passes the BF16 peak and is capped there, because the wgmma GEMM issues whole 64-row blocks:
  32 and 64 rows take 34-37 us, 96 and 128 rows 43-45 us). Both come from a least-squares line
  over the isolated tasks of 32 to 128 rows with every block starting at once, as a layer's GEMM
  phases start; the megakernel's own median full-tile task on a 12K-token layer agrees within 2%
  (anchoring the fixed cost on that task instead had priced 32-row bf16 tasks 14% low);
- the **gate runs in float64 work items** (FP64 tensor cores, 32 tokens x 64 experts), 0.05 to
  0.23 ms with its capacity phase (0.06-0.3 ms with the per-expert slot scan of 3e55a17), not the
  microseconds of the matrix roofline; with fewer items than blocks an item's H is
  split over up to 8 blocks, which costs a third grid barrier and the partials' sum
  (`gate_split_ns`, ~6 us): the 1K-token gate went from 111-131 us to 54-58 us;
- (the kernel of 3e55a17) a **dispatch put is done by the block's threads** (about 10 GB/s for one block, to its own GPU
  or over NVLink), so the dispatch costs a block about as much as packing and putting 1 MiB at
  2-4 GB/s when 128 blocks move 128 MiB at once: block copies and puts keep their speed alone up
  to ~15 MB in flight (the **L2 knee**: each byte is read and written, so ~30 MB of the 50 MB L2)
  and slow down 2-3x beyond it;
- **GEMM1 stores its output straight into the source GPU's memory** (its column block, with a
  count signal per task); the model adds those stores over NVLink to each task at a block's put
  rate. (Putting the whole tile from the tile's last task, the kernel's older path, cost that block
  120-250 us; the bench measured both ways: the stores are 2-7% faster per layer.)
- the **gate reads cold tokens** in a layer, so its microbenchmark evicts the L2 before each launch;
- **every processor ends with the ordered combine** of its share of tokens (~50 us at 8K).

Missed, and why (tests/test_compare_measured.py KNOWN_MISSES names each run and quantity):

- **The 3e55a17 runs' weight reuse**: that kernel's calibration timed GEMM tasks at 2 tiles per
  expert only, so its model holds the weight loads fixed: its 4K-token and 128-expert bf16 layers
  (1 tile per expert) and its 1K-2K bf16 ones run 10-25% longer than predicted.
- **Small tiles** (1K-2K tokens: 32-64-row tiles, fewer tiles than experts): the tasks take 8-13%
  longer in the layer than the microbenchmark's tasks of those heights (float32 on both GPUs, bf16
  at 1K); the layer is underpredicted by 10-15%. Not yet told apart.
- **The store dispatch's small shares**: it is fitted linear in a share's bytes over four layer
  sizes, dominated by the 64-128-row shares; the 8-16-row shares of the 1K-2K-token layers fall
  off the line: dispatch busy time -31 to -39% at 1K bf16, +22% at 2K float32 on the H100.
- **The final ordered combine** is calibrated at one size (8192 tokens): on the H100 it costs less
  per byte at 1K-2K tokens (predicted 22-28% high).
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
    """The page; `pending` (default: the committed runs the calibration lacks) listed by reason."""
    pending = pending_runs() if pending is None else pending
    lines = ["# Validation: predicted against measured", "",
             "Generated by `moelab compare --all --markdown docs/validation.md` (issue 4). Every committed "
             "measured layer run under `measurements/gpu/` is simulated with the preset calibrated on its "
             "GPU's microbenchmarks (`moelab calibrate`, from `measurements/calibration-<gpu>.json`); the "
             "calibration never sees a layer run (leave-one-out). CI (`tests/test_compare_measured.py`) "
             f"holds the bounds: layer latency within {LATENCY_BOUND:.0%}, each phase's busy time within "
             f"{PHASE_BOUND:.0%}, overlap efficiency within {OVERLAP_BOUND} absolute.", ""]
    lines += ["## The calibrated presets", ""]
    for hw_name, path in sorted({(c.hardware.name, f"calibrated-{c.run.gpu_tag}.json") for c in comparisons}):
        doc = json.loads((MEASUREMENTS / path).read_text())
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
    lines += ["## What the model covers", "", MODELED, "## What it gets right, what it misses and why", "",
              FINDINGS]
    gpus = sorted({(c.run.config.ranks, c.run.config.dtype, c.run.gpu_tag) for c in comparisons})
    lines += ["## Coverage", "", "Measured runs compared, by (GPUs, dtype, GPU): "
              + ", ".join(f"{n} x {tag} {dt}" for n, dt, tag in gpus) + ". The issue asks for 1, 2 and 4 GPUs in "
              "float32 and bf16: runs on 4 GPUs are not here yet (4-GPU machines were withheld); adding their "
              "traces under `measurements/gpu/` and rerunning this command and the CI test covers them.", ""]
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
