"""Hardware presets: every figure the simulator's costs come from, each with its source.

`PRESETS` holds `h100-sxm` and `h200-sxm`. A calibration JSON file overrides figures of a preset
(a later issue fills such files from GPU measurements):

    {"base": "h100-sxm", "name": "h100-lab", "nic_latency_ns": 1800,
     "sources": {"nic_latency_ns": "measurements/nic/ib_write_lat.json"}}

Without "base" the file must give every field. A bad field raises `HardwareError` naming the
field, the value and what is allowed. Units: ns, GB/s (= bytes per ns), TFLOP/s.

The megakernel is built once per dtype (float32 SIMT, bf16 tensor cores), and a calibration
measures each build at one tile shape. A calibrated preset's top-level figures are the float32
build's; "dtypes" holds, per dtype, the tile shape measured and the figures that build's fit gave
(none for float32: the top level is its own):

    "dtypes": {"float32": {"tile": [128, 64, 8]},
               "bfloat16": {"tile": [128, 64, 32], "gemm_fixed_ns": 61000, ..., "sources": {...}}}

`Hardware.for_dtype` gives the figures a config of that dtype runs with (the simulator asks for
them once per run); `require_tile` says whether the calibration covers a dtype at a tile shape.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from reference.files import read_json


class HardwareError(ValueError):
    """A hardware figure or file that is not allowed."""

    def __init__(self, name: str, value, allowed: str):
        self.field, self.value, self.allowed = name, value, allowed
        super().__init__(f"hardware field '{name}' = {value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class Hardware:
    """One GPU model and its node: compute, memory, NVLink, NIC, PCIe, proxy and kernel costs."""

    name: str
    sms: int
    blocks_per_sm: int  # resident blocks of the persistent kernel per SM
    # 128-thread units (warpgroups) per block: each runs gate items and slot scans of its own, so
    # the gate phase has blocks x units workers while the tasks have one per block
    warpgroups_per_block: int
    tflops_float32: float
    tflops_bfloat16: float
    tflops_tf32: float  # float32 data multiplied on tensor cores with TF32 operands
    tflops_float64: float
    matrix_efficiency: float  # share of the peak matrix rate a tile GEMM reaches
    hbm_gbps: float
    l2_hit_fraction: float  # share of GEMM operand bytes served by L2 instead of HBM
    nvlink_gbps: float  # per GPU, one direction, shared by its concurrent puts
    nvlink_latency_ns: float
    nic_gbps: float  # per GPU
    nic_latency_ns: float  # one way, GPU memory to remote GPU memory
    pcie_gbps: float
    pcie_latency_ns: float  # GPU to the proxy's ring in host memory
    proxy_op_ns: float  # proxy thread: take one request and post one work request to the NIC
    fence_ns: float  # proxy fence: poll the completion queue once all writes are done
    gpu_post_ns: float  # IBGDA: a GPU thread builds a work request and rings the NIC's doorbell
    task_overhead_ns: float  # per task: scheduler hand-off, operand setup, completion signal
    subscriber_ns: float  # subscriber warp: decode one tile's arrival flag, enqueue its tasks
    # mechanisms of moelab's megakernel that the datasheet figures miss; 0 in the presets (not
    # modeled), measured by gpu/microbench.py and set by `moelab calibrate`
    gate_item_ns_per_h: float  # one unit: one gate item (32 tokens x 64 experts) per element of H
    gate_slot_ns: float  # one unit: scan one (choice, gate item) row count of an expert for its slots
    gate_fixed_ns: float  # the gate phase's fixed cost (its grid barriers, launch skew)
    gate_split_ns: float  # with an item's H split over units: the third barrier and the partials' sum
    # the passes top-k selection (costs.GATE_SELECTS): one of a token's lanes considering one logit in
    # one of its k passes (costs.gate_select_reads), the logits in shared memory (E <= 64) or in global memory
    gate_select_smem_ns: float
    gate_select_global_ns: float
    # the lists selection: a lane comparing a logit it read at one place of its list (costs.gate_list_steps)
    gate_list_ns: float
    # a token's first lane weighing one of its choices (the choice, then its logit: dependent loads,
    # one choice after another; costs.gate_weighs), either selection
    gate_weigh_ns: float
    # a selecting lane handling one logit of an item past its list (costs.gate_logit_reads: the
    # epilogue's stores and the reads back, the softmax's max and sum), whatever top_k
    gate_logit_ns: float
    # the megakernel's gate event beyond the gate's code as the microbenchmark times it (measured on
    # the megakernel's own layers against the microbenchmark's points; costs.gate_ns)
    gate_layer_ns: float
    gemm_fixed_ns: float  # a tile GEMM task's cost however few its rows (its weight slice loads whole)
    # a task's multiply computes its tile's rows in whole groups of this many (0 or 1: each row),
    # a tile of one group or less in its warps' quarters of it (costs.grouped_rows): the float32
    # SIMT GEMM gives each thread 4 rows of every 64 and each warp 16 of those, so a tile
    # of 96 rows takes about as long as one of 128, one of 32 less than one of 64 (one H100,
    # microbenchmark at the megakernel's grid: 155, 173, 240, 243 us); the tensor-core builds'
    # multiply, whole 64-row blocks (costs.WHOLE_ROW_BLOCKS)
    gemm_row_group: float
    # per byte of the task's weight slice over the tiles of its expert that share it at once (a
    # slice one tile uses alone comes from HBM; shared, from L2 for all but the first)
    weight_load_ns_per_byte: float
    # per byte of the task's whole weight slice, which every task streams through the L2 k-step by
    # k-step beside the other blocks' tasks (a task of a deeper GEMM takes longer, whatever its rows)
    weight_stream_ns_per_byte: float
    # how a task's multiply and that load overlap: 0 or 1, added; p > 1, their p-norm (costs.overlapped)
    gemm_overlap_power: float
    # block copies and puts slow down once the bytes all blocks have in flight at once outgrow the
    # L2: time per byte = alone + extra x beyond / (beyond + half), beyond = max(inflight - knee, 0)
    l2_knee_bytes: float  # the bytes in flight that copies and puts can have before they slow (the L2 holds them)
    copy_ns_per_byte: float  # one block alone copying token rows (copy_rows: dispatch packing, combine weighting)
    copy_extra_ns_per_byte: float  # what a copy's time per byte tends to with very many bytes in flight, beyond alone
    copy_half_bytes: float  # the bytes in flight beyond the knee at which half that extra is reached
    put_local_ns_per_byte: float  # one block alone putting a tile to its own GPU (nvshmem copies with the block)
    put_local_extra_ns_per_byte: float  # the same extra for puts (their stores load the GPU's memory the same way)
    put_local_half_bytes: float  # and its half point
    put_nvlink_ns_per_byte: float  # one block alone putting a tile over NVLink (its threads store to the peer)
    # one block alone gathering token rows straight into an NVLink peer's memory (copy_rows' loop, the
    # staged dispatch's senders; 0: at copy_rows' own rate)
    copy_nvlink_ns_per_byte: float
    # a GEMM1 task storing its output rows into an NVLink peer (the tile's source), beyond the same
    # task's time for a tile of its own GPU, per byte
    return_store_ns_per_byte: float
    # a processor's share of a dispatched tile gathered straight into its own GPU's inbox (the store
    # path), all processors at once as in the layer: fixed + bytes x per byte (its stores drain before
    # the tile's count and signal: slower per byte than copy_rows, which does not wait for them), the
    # per byte at the L2's rate for the share of the GPU's tokens it holds (a knee), the rest at HBM's
    dispatch_store_fixed_ns: float
    dispatch_store_ns_per_byte: float  # beyond the knee (all of them where the knee is 0)
    dispatch_store_l2_ns_per_byte: float  # up to the knee
    dispatch_store_knee_bytes: float  # the bytes of a GPU's tokens the L2 holds (0: one rate for all)
    # a block's walk to each of its dispatch shares (processor.cuh deal_chunks): its turnaround after
    # the gate (its deal reads its list first) or after its share before, plus the read of an expert's
    # row count for every expert on its deal's list it passes (also after its last share, before its
    # first task)
    deal_first_ns: float
    deal_share_ns: float
    deal_count_ns: float
    # the subscriber sees a landed chunk's signal when its lane's pass over the entries it watches
    # comes round (os.cuh subscriber: each lane polls its share of the GPU's tiles and returned
    # chunks, one acquire each): fixed + per entry the GPU watches
    signal_seen_ns: float
    signal_seen_ns_per_entry: float
    # an expert's tasks queued together (os.cuh enqueue_expert, the bf16 build) by the one thread that
    # saw its last tile land (GEMM0) or ended its last GEMM0 task (GEMM1): fixed + a row count read per
    # source rank + a task written and flagged
    enqueue_ns: float
    enqueue_source_ns: float
    enqueue_task_ns: float
    # the float32 kernel's per-tile combine task (one block weights a returned tile's rows in place,
    # beside the GEMMs): fixed + the tile's bytes x per byte, at the L2's rate for the share of the
    # layer's returned bytes it holds (tile_combine_knee_bytes of them), HBM's for the rest (0:
    # copy_rows' rate alone); the bf16 kernel's task only marks the tile's arrival: the fixed time alone
    tile_combine_fixed_ns: float
    tile_combine_ns_per_byte: float
    tile_combine_l2_ns_per_byte: float
    tile_combine_knee_bytes: float
    # the final ordered combine, one block: fixed + bytes read or written x per byte, the share of
    # them the L2 still holds (reduce_knee_bytes of all blocks' bytes) at its own rate
    reduce_fixed_ns: float
    reduce_ns_per_byte: float  # from HBM
    reduce_l2_ns_per_byte: float  # from the L2 (0: one rate for all)
    reduce_knee_bytes: float  # the combine's bytes the L2 holds
    handoff_ns: float  # a processor idle between two tasks: scheduler sees it idle, mails the next one
    # with processors idle: a landed tile's first task starts wake_ns after the subscriber's turn (the
    # scheduler's poll of the queue, the mailbox), each task of a burst assign_ns after the one before
    # (the scheduler warp hands them out in turn), and the final combine stop_ns after the last task
    # (the scheduler sees every processor idle and stops them)
    wake_ns: float
    assign_ns: float
    stop_ns: float
    kernel_launch_ns: float  # gap between dependent kernels of the bulk-synchronous baseline
    collective_latency_ns: float  # fixed cost of one NCCL all-to-all call
    alltoall_gbps: float  # bandwidth an NCCL all-to-all reaches per GPU over NVLink
    sources: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    # per dtype: the tile shape its build was calibrated at and that build's figures (module text)
    dtypes: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise HardwareError("name", self.name, "a non-empty string")
        for f in number_fields():
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise HardwareError(f, v, "a finite number >= 0")
        for f in ("sms", "blocks_per_sm", "warpgroups_per_block"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise HardwareError(f, v, "a positive integer")
        for f in ("tflops_float32", "tflops_bfloat16", "tflops_tf32", "tflops_float64", "hbm_gbps", "nvlink_gbps",
                  "nic_gbps", "pcie_gbps", "matrix_efficiency", "alltoall_gbps"):
            if getattr(self, f) <= 0:
                raise HardwareError(f, getattr(self, f), "a number > 0")
        for f in ("matrix_efficiency", "l2_hit_fraction"):
            if getattr(self, f) > 1 or (f == "l2_hit_fraction" and getattr(self, f) >= 1):
                raise HardwareError(f, getattr(self, f), "a fraction in [0, 1)" if f == "l2_hit_fraction"
                                    else "a fraction in (0, 1]")
        for dtype, section in self.dtypes.items():
            _check_dtype_section(dtype, section)
            dataclasses.replace(self, **_figures(section), dtypes={})  # each figure by the rules above

    @property
    def processors(self) -> int:
        """Processor blocks of the persistent kernel: every resident block but the OS block."""
        return self.sms * self.blocks_per_sm - 1

    def tflops(self, dtype: str) -> float:
        """The matrix rate of a GEMM precision (Config.precision): split TF32 (tf32x3) makes three
        TF32 products of each float32 one."""
        if dtype == "tf32x3":
            return self.tflops_tf32 / 3
        return getattr(self, f"tflops_{dtype}")

    def source(self, name: str) -> str:
        return self.sources.get(name, "")

    def for_dtype(self, dtype: str) -> Hardware:
        """The figures a kernel of `dtype` runs with: its calibrated build's, where the calibration
        measured that build, else these."""
        section = self.dtypes.get(dtype)
        if not section or not _figures(section):
            return self
        return dataclasses.replace(self, name=f"{self.name}[{dtype}]", **_figures(section),
                                   sources={**self.sources, **section.get("sources", {})}, dtypes={})

    def for_config(self, cfg) -> Hardware:
        """The figures cfg's kernel build runs with: its GEMM precision's calibrated section (tf32x3
        is a build of its own), else its dtype's (a tf32 config's: float32's)."""
        return self.for_dtype(cfg.precision if cfg.precision in self.dtypes else cfg.dtype)

    def require_tile(self, dtype: str, tile: tuple[int, int, int]) -> None:
        """Raise unless the calibration measured `dtype`'s build at `tile` (bM, bN, bK)."""
        calibrated = {d: tuple(s["tile"]) for d, s in self.dtypes.items()}
        if dtype not in calibrated:
            have = ", ".join(f"{d} at {_shape(t)}" for d, t in calibrated.items()) or "none"
            raise HardwareError(f"dtypes.{dtype}", None, f"a calibrated {dtype} section in {self.name} "
                                f"(calibrated: {have}); measure the {dtype} build (benchmarks/calibrate_gpu.py) "
                                "and run `moelab calibrate`")
        if calibrated[dtype] != tuple(tile):
            raise HardwareError(f"dtypes.{dtype}.tile", _shape(tile), f"the tile shape {dtype} was calibrated at "
                                f"in {self.name}: {_shape(calibrated[dtype])}")

    def replace(self, **changes) -> Hardware:
        unknown = sorted(set(changes) - set(field_names()) - {"sources", "dtypes"})
        if unknown:
            raise HardwareError(unknown[0], changes[unknown[0]], "a known field: " + ", ".join(field_names()))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in field_names()}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Hardware) if f.name not in ("sources", "dtypes")]


DTYPES = ("float32", "bfloat16", "tf32x3")  # the kernel builds a calibration may hold a section of


def _shape(tile) -> str:
    return "x".join(str(v) for v in tile)


def _figures(section: dict) -> dict:
    return {k: v for k, v in section.items() if k not in ("tile", "sources")}


def _check_dtype_section(dtype, section) -> None:
    if dtype not in DTYPES:
        raise HardwareError("dtypes", dtype, "keys among " + ", ".join(DTYPES))
    if not isinstance(section, dict):
        raise HardwareError(f"dtypes.{dtype}", section, "an object with the tile shape and figures")
    tile = section.get("tile")
    if not (isinstance(tile, list | tuple) and len(tile) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in tile)):
        raise HardwareError(f"dtypes.{dtype}.tile", tile, "[bM, bN, bK], three positive integers")
    unknown = sorted(set(_figures(section)) - set(number_fields()))
    if unknown:
        raise HardwareError(f"dtypes.{dtype}.{unknown[0]}", section[unknown[0]],
                            "a known number field: " + ", ".join(number_fields()))
    if not isinstance(section.get("sources", {}), dict):
        raise HardwareError(f"dtypes.{dtype}.sources", section["sources"], "an object mapping field names to sources")


def number_fields() -> list[str]:
    return [f for f in field_names() if f != "name"]


_DATASHEET_H100 = "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column"
_DATASHEET_H200 = "NVIDIA H200 Tensor Core GPU datasheet, SXM column"
_ESTIMATE = "estimate, to be replaced by a calibration file from measurements/"
_NOT_MODELED = ("0: not modeled by the preset (the roofline figures alone); measured by gpu/microbench.py and "
                "set by `moelab calibrate` (measurements/calibrated-*.json)")

_H100 = {
    "name": ("h100-sxm", ""),
    "sms": (132, "NVIDIA H100 whitepaper: 132 SMs on H100 SXM5"),
    "blocks_per_sm": (4, "FlashMoE csrc/include/flashmoe/arch.cuh, Hardware<900, 128>: 4 blocks per SM"),
    "warpgroups_per_block": (1, "FlashMoE csrc/include/flashmoe/arch.cuh, Hardware<900, 128>: 128 threads a block"),
    "tflops_float32": (67.0, _DATASHEET_H100 + ": FP32 67 TFLOPS (FlashMoE computes FP32 on CUDA cores)"),
    "tflops_bfloat16": (989.4, _DATASHEET_H100 + ": BF16 Tensor Core 1,979 TFLOPS with sparsity, 989.4 dense"),
    "tflops_tf32": (494.7, _DATASHEET_H100 + ": TF32 Tensor Core 989 TFLOPS with sparsity, 494.7 dense"),
    "tflops_float64": (67.0, _DATASHEET_H100 + ": FP64 Tensor Core 67 TFLOPS"),
    "matrix_efficiency": (0.8, "estimate: the floors of the FlashMoE default's expert math, fp32 5.4 ms at 0.76 "
                               "and bf16 0.34 ms at 0.82 of peak"),
    "hbm_gbps": (3350.0, _DATASHEET_H100 + ": GPU memory bandwidth 3.35 TB/s"),
    "l2_hit_fraction": (0.9, "estimate: a tile's rows are reread by all its column tasks (32 at the FlashMoE "
                             "default) and an expert's weight block by all its tiles, within the 50 MB L2"),
    "nvlink_gbps": (450.0, _DATASHEET_H100 + ": NVLink 900 GB/s bidirectional, 450 GB/s each way"),
    "nvlink_latency_ns": (1000.0, "estimate: order of NVSHMEM's put-with-signal latency over NVLink 4; "
                                  + _ESTIMATE),
    "nic_gbps": (50.0, "ConnectX-7 NDR InfiniBand, 400 Gb/s per GPU (DGX H100 user guide, NVIDIA ConnectX-7 "
                       "datasheet: up to 400 Gb/s a port)"),
    "nic_latency_ns": (1500.0, "estimate: one-way RDMA write through one NDR switch; the NIC reads the payload "
                               "from GPU memory over PCIe, then the wire, the switch and the peer's PCIe write; "
                               "no multi-node measurement here; " + _ESTIMATE),
    "pcie_gbps": (64.0, _DATASHEET_H100 + ": PCIe Gen5 128 GB/s bidirectional, 64 GB/s each way"),
    "pcie_latency_ns": (1000.0, "estimate: GPU write into host memory plus the proxy's polling; " + _ESTIMATE),
    "proxy_op_ns": (300.0, "estimate: one ibv_post_send by the proxy thread; " + _ESTIMATE),
    "fence_ns": (1000.0, "estimate: the proxy's fence polls the completion queue; it waits first for its "
                         "writes to complete (NVSHMEM's proxy put-with-signal is put, fence, signal: "
                         "nvshmemi_transfer_put_signal, src/include/non_abi/device/pt-to-pt/transfer_device.cuh.in); "
                         + _ESTIMATE),
    "gpu_post_ns": (300.0, "estimate: IBGDA work request built and doorbell rung by a GPU thread; "
                           "two a put-with-signal (NVSHMEM's nvshmemi_ibgda_put_signal_thread_impl, "
                           "src/include/non_abi/device/pt-to-pt/ibgda_device.cuh: an unsignaled write and a "
                           "signaled atomic on a queue pair the GPU's blocks share under a lock); " + _ESTIMATE),
    "task_overhead_ns": (500.0, "estimate: scheduler hand-off, pipeline fill and completion flag; " + _ESTIMATE),
    "subscriber_ns": (200.0, "estimate: decode a 64-bit arrival flag and enqueue a tile's tasks; " + _ESTIMATE),
    **{f: (0.0, _NOT_MODELED) for f in ("gate_item_ns_per_h", "gate_slot_ns", "gate_fixed_ns", "gate_split_ns",
                                         "gate_select_smem_ns", "gate_select_global_ns", "gate_list_ns",
                                         "gate_weigh_ns", "gate_logit_ns", "gate_layer_ns",
                                         "gemm_fixed_ns", "gemm_row_group",
                                         "weight_load_ns_per_byte", "weight_stream_ns_per_byte", "gemm_overlap_power",
                                         "l2_knee_bytes", "copy_ns_per_byte",
                                         "copy_extra_ns_per_byte", "copy_half_bytes", "put_local_ns_per_byte",
                                         "put_local_extra_ns_per_byte", "put_local_half_bytes",
                                         "put_nvlink_ns_per_byte", "copy_nvlink_ns_per_byte",
                                         "return_store_ns_per_byte",
                                         "dispatch_store_fixed_ns",
                                         "dispatch_store_ns_per_byte", "dispatch_store_l2_ns_per_byte",
                                         "dispatch_store_knee_bytes", "deal_first_ns", "deal_share_ns", "deal_count_ns",
                                         "signal_seen_ns", "signal_seen_ns_per_entry",
                                         "enqueue_ns", "enqueue_source_ns", "enqueue_task_ns",
                                         "tile_combine_fixed_ns",
                                         "tile_combine_ns_per_byte", "tile_combine_l2_ns_per_byte",
                                         "tile_combine_knee_bytes", "reduce_fixed_ns", "reduce_ns_per_byte",
                                         "reduce_l2_ns_per_byte", "reduce_knee_bytes", "handoff_ns",
                                         "wake_ns", "assign_ns", "stop_ns")},
    "kernel_launch_ns": (4000.0, "estimate: gap between dependent kernels launched from Python; " + _ESTIMATE),
    "collective_latency_ns": (10000.0, "estimate: NCCL all-to-all setup and synchronization; " + _ESTIMATE),
    "alltoall_gbps": (200.0, "estimate: NCCL all-to-all moves far less than the 450 GB/s port (the torch "
                             "layer, gpu/baseline.py, spends ~2.3 ms beyond its GEMMs at the default on 4 H200); "
                             + _ESTIMATE),
}
_H200 = {
    **_H100,
    "name": ("h200-sxm", ""),
    "sms": (132, "H200 is the GH100 chip of H100 SXM5: 132 SMs"),
    "tflops_float32": (67.0, _DATASHEET_H200 + ": FP32 67 TFLOPS"),
    "tflops_bfloat16": (989.4, _DATASHEET_H200 + ": BF16 Tensor Core 1,979 TFLOPS with sparsity, 989.4 dense"),
    "tflops_tf32": (494.7, _DATASHEET_H200 + ": TF32 Tensor Core 989 TFLOPS with sparsity, 494.7 dense"),
    "tflops_float64": (67.0, _DATASHEET_H200 + ": FP64 Tensor Core 67 TFLOPS"),
    "hbm_gbps": (4800.0, _DATASHEET_H200 + ": GPU memory bandwidth 4.8 TB/s"),
    "nvlink_gbps": (450.0, _DATASHEET_H200 + ": NVLink 900 GB/s bidirectional, 450 GB/s each way"),
}


def _preset(table: dict) -> Hardware:
    return Hardware(**{k: v for k, (v, _) in table.items()},
                    sources={k: s for k, (_, s) in table.items() if s})


PRESETS: dict[str, Hardware] = {hw.name: hw for hw in (_preset(_H100), _preset(_H200))}
DEFAULT = "h100-sxm"


def load_calibration(path: str | Path) -> Hardware:
    """A preset overridden by a calibration JSON file (see the module text for the format)."""
    d = read_json(path, "a hardware calibration .json: an object of hardware fields (see sim/hardware.py)")
    try:
        return from_dict(d, origin=str(path))
    except HardwareError as e:  # the field's error, saying which file holds it
        where = e.allowed if str(path) in e.allowed else f"{e.allowed} (in {path})"
        raise HardwareError(e.field, e.value, where) from e


def from_dict(d: dict, origin: str = "calibration") -> Hardware:
    """A Hardware from a dict of fields, on top of d["base"] when given."""
    d = dict(d)
    base_name = d.pop("base", None)
    sources = d.pop("sources", {})
    dtypes = d.pop("dtypes", {})
    if not isinstance(dtypes, dict):
        raise HardwareError("dtypes", dtypes, "an object of per-dtype sections: " + ", ".join(DTYPES))
    if not isinstance(sources, dict):
        raise HardwareError("sources", sources, "an object mapping field names to sources")
    unknown = sorted(set(d) - set(field_names()))
    if unknown:
        raise HardwareError(unknown[0], d[unknown[0]], "a known field: " + ", ".join(field_names()))
    if base_name is None:
        missing = [f for f in field_names() if f not in d]
        if missing:
            raise HardwareError(missing[0], None, f"present in {origin} (or give \"base\": a preset to "
                                                  "start from: " + ", ".join(PRESETS) + ")")
        return Hardware(**d, sources={f: sources.get(f, origin) for f in field_names()}, dtypes=dtypes)
    if not isinstance(base_name, str) or base_name not in PRESETS:
        raise HardwareError("base", base_name, "one of " + ", ".join(PRESETS))
    base = PRESETS[base_name]
    merged = {**base.sources, **{f: sources.get(f, origin) for f in d}}
    return base.replace(**{"name": f"{base.name}+{Path(origin).stem}", **d}, sources=merged, dtypes=dtypes)


def get(name_or_path: str | Hardware) -> Hardware:
    """A preset by name, or a calibration .json file."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if isinstance(name_or_path, str | Path) and str(name_or_path).endswith(".json"):
        return load_calibration(name_or_path)
    raise HardwareError("hardware", name_or_path, "a preset (" + ", ".join(PRESETS) + ") or a .json calibration file")
