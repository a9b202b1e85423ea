"""The NVSHMEM session of one process (one GPU) and the megakernel layer that runs on it.

    session = Session.start()              # torch.distributed env (RANK, WORLD_SIZE, ...) + NVSHMEM
    layer = Layer(session, cfg, inputs)    # buffers for cfg, the cubin for its tile shape
    layer.run()                            # one layer call; raises KernelTimeout on a failed wait
    layer.output()                         # (T, H) float32 numpy, this rank's tokens

A bfloat16 config runs the bf16 kernel: tokens and expert weights on the GPU in bf16, gate
weights and biases float32 holding bf16-rounded values (the reference's bf16 path rounds them
all), the moved rows and the GEMM0 output in bf16, y in float32.

Every rank runs the same sequence of Layer calls (NVSHMEM allocation and free are collective).
Signals carry the launch's epoch, so no flag is reset between launches; the local working state
is zeroed on the stream before each launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from reference import Config, numerics, weights
from reference.config import GATES, is_positive_int  # GATES: params.cuh GATE_* order
from sim import costs
from sim.trace import DISPATCH_PATHS

from . import build, errors, layout, telemetry, tma
from .layout import MAX_PROCESSORS, OS_WARPS, TLOG_CAP, Sizes

LINE_UP_CYCLES = 4_000_000  # ~2 ms at an H100/H200's ~2 GHz: longer than a host takes to enqueue a launch


@dataclass(frozen=True)
class Loaded:
    """A megakernel on this GPU: the cuda.core kernel, the dynamic shared memory of each block and
    the cubin's clock-sync kernel (moe.cu moelab_clock_sync)."""

    kernel: object
    smem_bytes: int
    clock_sync: object


def allow_dynamic_smem(kernel, smem_bytes: int, device_id: int) -> None:
    """Raise the kernel's limit of dynamic shared memory per block to smem_bytes (a launch past
    48 KiB fails without it)."""
    from cuda.bindings import driver

    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    (status,) = driver.cuKernelSetAttribute(attribute, smem_bytes, kernel.handle, device_id)
    if status != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot allow {smem_bytes} B of dynamic shared memory per block on GPU {device_id}: "
                           f"{driver.cuGetErrorName(status)[1]!r}")


class Session:
    """This process's GPU, its torch.distributed groups and NVSHMEM, initialized once."""

    def __init__(self, rank: int, world: int, local_rank: int):
        import nvshmem.core as nvshmem
        import torch
        import torch.distributed as dist
        from cuda.core import Device

        self.rank, self.world, self.local_rank = rank, world, local_rank
        torch.cuda.set_device(local_rank)
        self.device = Device(local_rank)
        self.device.set_current()
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        self.cpu_group = dist.new_group(backend="gloo")
        uid = nvshmem.get_unique_id(empty=rank != 0)
        raw = uid._data.view(np.int8)
        blob = [raw.tobytes() if rank == 0 else None]
        dist.broadcast_object_list(blob, src=0, group=self.cpu_group)
        raw[:] = np.frombuffer(blob[0], dtype=np.int8)
        nvshmem.init(device=self.device, uid=uid, rank=rank, nranks=world, initializer_method="uid")
        if nvshmem.my_pe() != rank or nvshmem.n_pes() != world:
            raise RuntimeError(f"NVSHMEM PE {nvshmem.my_pe()}/{nvshmem.n_pes()} != rank {rank}/{world}")
        self.stream = self.device.create_stream()
        self.torch_stream = torch.cuda.ExternalStream(int(self.stream.handle), device=torch.device("cuda", local_rank))
        self.name = torch.cuda.get_device_name(local_rank)
        self.sms = self.device.properties.multiprocessor_count
        self._kernels: dict[str, object] = {}

    @classmethod
    def start(cls) -> Session:
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))

    def kernel(self, cfg: Config) -> Loaded:
        """The loaded kernel for cfg's tile shape (built or taken from the cubin cache), allowed
        the dynamic shared memory its blocks take."""
        import nvshmem.core as nvshmem
        from cuda.core import ObjectCode
        from nvshmem.core import NvshmemKernelObject

        built = build.build(layout.compile_options(cfg))
        if built.key not in self._kernels:
            obj = ObjectCode.from_cubin(built.cubin.read_bytes())
            nvshmem.library_init(NvshmemKernelObject.from_obj(obj))
            loaded = Loaded(obj.get_kernel(layout.kernel_name(cfg)),
                            build.cubin_constant(built.cubin, layout.SMEM_SYMBOL), obj.get_kernel(layout.CLOCK_SYNC))
            allow_dynamic_smem(loaded.kernel, loaded.smem_bytes, self.device.device_id)
            self._kernels[built.key] = (obj, loaded)
        return self._kernels[built.key][1]

    def barrier(self) -> None:
        import nvshmem.core as nvshmem

        nvshmem.barrier_all(self.stream)

    def line_up(self) -> None:
        """Make the launch enqueued next start on every rank at once: this GPU spins (LINE_UP_CYCLES)
        while its host enqueues the rest, then all ranks' streams meet. A stream barrier alone
        leaves the skew of the hosts' enqueueing after it (~0.1 ms seen on an H200 pair), which
        the kernel's start wait would count as layer time."""
        import torch

        with torch.cuda.stream(self.torch_stream):
            torch.cuda._sleep(LINE_UP_CYCLES)
        self.barrier()

    def sync(self) -> None:
        self.stream.sync()

    def close(self) -> None:
        import nvshmem.core as nvshmem
        import torch.distributed as dist

        self.stream.sync()
        nvshmem.finalize()
        if dist.is_initialized():
            dist.destroy_process_group()


def interleave_gated(a):
    """W1 (or b1) of a gated layer, its last axis [gate | up] halves (reference/weights.py), as the
    kernel takes it: column 2j the gate column j, 2j + 1 the up column j, so a GEMM0 task's
    accumulators hold each gate value beside its up value (numpy array or torch tensor)."""
    n = a.shape[-1] // 2
    return a.reshape(*a.shape[:-1], 2, n).swapaxes(-1, -2).reshape(*a.shape[:-1], 2 * n)


@dataclass
class Inputs:
    """One rank's operands as device tensors: x (T, H), wg (H, E), logit_offset, gate_bias and wg_bias
    (E,) float64 (wg_bias: the gate's bias added to its logits, zeros without router_bias), the
    local experts' w1 (L, H, I'), b1 (L, I'), w2 (L, I, H), b2 (L, H), I' = 2I for a gated layer
    ([gate | up], reference/weights.py), else I, and with shared experts their (w1, b1, w2, b2) as
    `shared`, (S, ...) each. (The Layer hands the kernel these as kernel_weights lays them out.)
    For a bfloat16 config x, w1 and w2 are bf16 and wg, wg_bias, b1, b2 hold bf16-rounded values."""

    x: object
    wg: object
    logit_offset: object
    gate_bias: object
    wg_bias: object
    w1: object
    b1: object
    w2: object
    b2: object
    shared: tuple | None = None

    @classmethod
    def reference(cls, cfg: Config, rank: int) -> Inputs:
        """The reference's seeded inputs: this rank's tokens, the experts it owns and the shared ones."""
        import torch

        wg, gate_bias = weights.gate(cfg)
        dev = torch.device("cuda", torch.cuda.current_device())

        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

        def stacked(experts):
            parts = [weights.expert(cfg, e) for e in experts]
            return tuple(t(np.stack([ex[i] for ex in parts])) for i in range(4))

        mine = stacked(range(rank * cfg.local_experts, (rank + 1) * cfg.local_experts))
        shared = stacked(range(cfg.experts, cfg.experts + cfg.shared_experts)) if cfg.shared_experts else None
        return cls(x=t(weights.tokens(cfg, rank)), wg=t(wg), logit_offset=t(logit_offset(cfg)),
                   gate_bias=t(gate_bias.astype(np.float64)),
                   wg_bias=t(weights.router_bias(cfg).astype(np.float64)),
                   **dict(zip(("w1", "b1", "w2", "b2"), mine)), shared=shared).as_dtype(cfg.dtype)

    @classmethod
    def random(cls, cfg: Config, rank: int, seed: int) -> Inputs:
        """Inputs drawn on the GPU with the reference's scales (for sizes the CPU draws slowly)."""
        import torch

        dev = torch.device("cuda", torch.cuda.current_device())
        g = torch.Generator(device=dev)
        g.manual_seed(seed * 1_000_003 + rank)
        gshared = torch.Generator(device=dev)
        gshared.manual_seed(seed)  # the gate is the same on every rank
        h, i, e, i1 = cfg.hidden, cfg.ffn, cfg.experts, layout.gemm0_cols(cfg)

        def n(shape, scale, gen=g):
            return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) * scale

        def bias(*shape):
            return n(shape, 0.1) if cfg.bias else torch.zeros(*shape, device=dev)

        def experts(m):
            return n((m, h, i1), h ** -0.5), bias(m, i1), n((m, i, h), i ** -0.5), bias(m, h)

        return cls(x=n((cfg.tokens, h), 1.0), wg=n((h, e), h ** -0.5, gshared),
                   logit_offset=torch.from_numpy(logit_offset(cfg)).to(dev),
                   gate_bias=n((e,), 0.1, gshared).double(),
                   wg_bias=(n((e,), 0.1, gshared) if cfg.router_bias else torch.zeros(e, device=dev)).double(),
                   **dict(zip(("w1", "b1", "w2", "b2"), experts(cfg.local_experts))),
                   shared=experts(cfg.shared_experts) if cfg.shared_experts else None).as_dtype(cfg.dtype)

    def as_dtype(self, dtype: str) -> Inputs:
        """These float32 inputs as the kernel of `dtype` takes them (torch rounds to bf16 to
        nearest even, as reference.numerics.round_bf16)."""
        import torch

        if dtype != "bfloat16":
            return self
        bf = torch.bfloat16

        def experts(w1, b1, w2, b2):
            return w1.to(bf), b1.to(bf).float(), w2.to(bf), b2.to(bf).float()

        return Inputs(x=self.x.to(bf), wg=self.wg.to(bf).float(), logit_offset=self.logit_offset,
                      gate_bias=self.gate_bias, wg_bias=self.wg_bias.to(bf).double(),
                      **dict(zip(("w1", "b1", "w2", "b2"), experts(self.w1, self.b1, self.w2, self.b2))),
                      shared=experts(*self.shared) if self.shared is not None else None)


def kernel_weights(cfg: Config, inputs: Inputs) -> dict:
    """The expert weights as the kernel reads them: the local experts' then the shared ones'
    (experts L .. L+S-1), W1 and b1 with the gate and up columns interleaved where gated
    (interleave_gated); the inputs' own tensors for a layer with neither (no copy)."""
    import torch

    out = {}
    for i, name in enumerate(("w1", "b1", "w2", "b2")):
        t = getattr(inputs, name)
        if inputs.shared is not None:
            t = torch.cat([t, inputs.shared[i]])
        out[name] = interleave_gated(t).contiguous() if cfg.gated and name in ("w1", "b1") else t
    return out


def float_bits(v: float) -> int:
    """A double argument (Params' 8-byte fields) as the int64 of its bits."""
    return int(np.float64(v).view(np.int64))


def logit_offset(cfg: Config) -> np.ndarray:
    """skew * ln(1 + e): the kernel subtracts it from the float64 logits, as reference.routing does."""
    return cfg.skew * np.log1p(np.arange(cfg.experts, dtype=np.float64)) if cfg.skew else np.zeros(cfg.experts)


class Layer:
    """cfg's MoE layer on this rank: buffers, the argument block and the launch."""

    def __init__(self, session: Session, cfg: Config, inputs: Inputs, *, timeout_ms: float = 5000.0,
                 telemetry_cap: int = TLOG_CAP, dispatch: str | None = None,
                 staged_blocks: int = layout.STAGED_BLOCKS):
        import nvshmem.core.interop.torch as symmetric
        import torch

        layout.check_supported(cfg)
        dispatch = costs.DEFAULT_DISPATCH if dispatch is None else dispatch  # None: the kernel's own choice
        if cfg.ranks != session.world:
            raise layout.UnsupportedConfig("ranks", cfg.ranks, f"the number of processes, {session.world}")
        if dispatch not in DISPATCH_PATHS:
            raise ValueError(f"dispatch = {dispatch!r} is not allowed: one of {', '.join(DISPATCH_PATHS)}")
        if not is_positive_int(staged_blocks):
            raise ValueError(f"staged_blocks = {staged_blocks!r} is not allowed: a positive number of processors "
                             f"(the kernel keeps at least one for this GPU's own chunks)")
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms = {timeout_ms!r} is not allowed: a positive number of milliseconds")
        self.session, self.cfg, self.inputs = session, cfg, inputs
        self.sizes = s = Sizes.of(cfg)
        self.loaded = session.kernel(cfg)
        smem = self.loaded.smem_bytes
        self.block_threads = layout.block_threads(layout.compile_options(cfg))
        per_sm = self.loaded.kernel.occupancy.max_active_blocks_per_multiprocessor(self.block_threads, smem)
        if per_sm < 1:
            raise layout.UnsupportedConfig("tile_k", cfg.tile_k, f"small enough that a block's {smem} B of shared "
                                           f"memory fit an SM of {session.name}")
        # every resident block, up to the processors the scheduler warp serves (small tiles fit 3
        # or more blocks per SM; a grid of fewer blocks is still co-resident)
        self.grid = min(per_sm * session.sms, MAX_PROCESSORS + 1)
        self.n_proc = self.grid - 1
        self.dispatch = dispatch  # how dispatched rows move (sim.trace.DISPATCH_PATHS)
        self.staged_blocks = staged_blocks  # the staged path's senders (0 in Params on the others)
        self.logs = self.n_proc + OS_WARPS
        dev = torch.device("cuda", session.local_rank)
        f32, f64, i32, i64 = torch.float32, torch.float64, torch.int32, torch.int64
        elem = torch.bfloat16 if cfg.dtype == "bfloat16" else f32
        self._check_memory(dev)
        rows, mine = s.owner_rows, s.source_rows
        with torch.cuda.stream(session.torch_stream):
            self._sym_f = symmetric.tensor((2 * rows + 2 * mine, s.H), dtype=elem)
            self._sym_sig = symmetric.tensor((s.signal_words,), dtype=i64)
            self._sym_sig.zero_()
            def empty(*shape, dtype):
                return torch.empty(*shape, dtype=dtype, device=dev)

            splits = layout.gate_split_capacity(s.T, self.grid * layout.warpgroups(cfg))
            b = dict(y=empty(s.T, s.H, dtype=f32), logits=empty(s.T, s.E, dtype=f64), expert=empty(s.T, s.K, dtype=i32),
                     gate_partial=empty(splits if splits > 1 else 0, s.T, s.E, dtype=f64),
                     weight=empty(s.T, s.K, dtype=f64), slot=empty(s.T, s.K, dtype=i32), counts=empty(s.E, dtype=i32),
                     slot_base=empty(s.E, s.K, -(-s.T // layout.GATE_TOKENS), dtype=i32),
                     row_token=empty(rows, dtype=i32), row_choice=empty(rows, dtype=i32),
                     row_weight=empty(rows, dtype=f32), hidden=empty(rows + s.S * s.T, s.I, dtype=elem),
                     shared_out=empty(s.S * s.T, s.H, dtype=elem),
                     queue=empty(s.queue_cap, 4, dtype=i32), tlog=empty(self.logs, telemetry_cap, 4, dtype=i64))
            b.update(inbox=self._sym_f[:rows], outbuf=self._sym_f[rows: 2 * rows],
                     staging=self._sym_f[2 * rows: 2 * rows + mine], combox=self._sym_f[2 * rows + mine:],
                     **{name: self._sym_sig[lo:hi] for name, (lo, hi) in s.signal_slices.items()})
            # working state zeroed before every launch: 64-bit words, then 32-bit words
            self._work64 = torch.zeros(errors.ERROR_WORDS + layout.MAILBOX_SLOTS * self.n_proc, dtype=i64, device=dev)
            b.update(error=self._work64[: errors.ERROR_WORDS], mailbox=self._work64[errors.ERROR_WORDS:])
            tiles, all_tiles = s.L * s.W, s.L * s.W + s.S * s.WS  # the shared experts' tiles counted after
            n32 = dict(state=8, queue_ready=s.queue_cap, tile_done0=all_tiles, tile_done1=all_tiles,
                       dispatch_done=s.E * s.CH, in_count=s.E, in_base=s.E, count_base=s.E,
                       window_rows=tiles, window_chunks=tiles,
                       watch=tiles + s.E * s.CH, expert_tiles=3 * s.L, mailbox_done=self.n_proc, tlog_count=self.logs)
            self._work32 = torch.zeros(sum(n32.values()), dtype=i32, device=dev)
            at = 0
            for name, n in n32.items():
                b[name] = self._work32[at: at + n]
                at += n
        self.buffers = b
        sizes = dict(T=s.T, H=s.H, I=s.I, E=s.E, K=s.K, P=s.P, L=s.L, C=s.C, W=s.W, CH=s.CH, stride=s.stride,
                     rank=session.rank, gate_kind=GATES.index(cfg.gate),
                     act_kind=layout.ACTIVATIONS.index("silu" if cfg.gated else cfg.activation),  # gated: MOE_GATED's
                     n_proc=self.n_proc, queue_cap=s.queue_cap, tlog_cap=telemetry_cap,
                     timeout_ns=int(timeout_ms * 1e6), direct_stores=int(dispatch != "put"),
                     staged_blocks=staged_blocks if dispatch == "staged" else 0,
                     gate_splits=splits, n_group=cfg.n_group, topk_group=cfg.topk_group,
                     routed_scaling=float_bits(cfg.routed_scaling), S=s.S, WS=s.WS,
                     swiglu_alpha=float_bits(numerics.OAI_ALPHA), swiglu_limit=float_bits(cfg.swiglu_limit))
        tensors = {**b, **{k: getattr(inputs, k) for k in ("x", "wg", "logit_offset", "gate_bias", "wg_bias",
                                                          "w1", "b1", "w2", "b2")}}
        self._check_inputs(tensors)
        # held by the layer: the kernel reads them by address (a copy where shared or gated)
        self._kernel_weights = kernel_weights(cfg, inputs)
        tensors.update(self._kernel_weights)
        if cfg.precision in layout.WGMMA_PRECISIONS:
            # the bf16 and tf32x3 kernels read their expert weights K-major (both wgmma operands from
            # shared memory, kernels/tile_gemm_wgmma.cuh): a transposed copy, taken once, held by the layer
            self._weights_k_major = {k: tensors[k].transpose(1, 2).contiguous() for k in ("w1", "w2")}
            tensors.update(self._weights_k_major)
            self._kernel_weights = {k: self._kernel_weights[k] for k in ("b1", "b2")}  # W1, W2 read K-major
            # and reads its A and weight slices through the TMA: the operands' tensor maps (gpu/tma.py)
            self._tensor_maps = torch.from_numpy(tma.maps_block(tma.operand_specs(tensors, cfg.tile_n))).to(dev)
            tensors["tmaps"] = self._tensor_maps
        else:
            sizes["tmaps"] = 0  # the float32 and tf32 GEMMs read their operands by address
            if layout.ragged(cfg):
                # a ragged last column block reads its weight rows' whole tile_n columns (the ones past
                # N are the next row's, never stored): tile_n elements more after the last expert's
                self._weights_padded = {k: torch.cat([tensors[k].reshape(-1), tensors[k].new_zeros(cfg.tile_n)])
                                        for k in ("w1", "w2")}
                tensors.update(self._weights_padded)
        fields = layout.param_fields()
        block = np.zeros(len(fields), np.int64)
        for i, name in enumerate(fields):
            block[i] = sizes[name] if name in sizes else tensors[name].data_ptr()
        self._params = torch.from_numpy(block).to(dev)
        self.epoch = 0
        self.broken: errors.KernelError | None = None
        torch.cuda.synchronize(dev)
        session.barrier()  # every rank's signals are zero before any rank launches
        session.sync()

    def _check_memory(self, dev) -> None:
        """Refuse, before allocating, a layer whose heap, buffers and weight copies (layout.layer_bytes)
        and inputs would not fit this GPU, whose working buffers and copies would not fit its free
        memory, or whose heap would not fit NVSHMEM's (NVSHMEM_SYMMETRIC_SIZE, where set)."""
        import torch

        cfg, s = self.cfg, self.sizes
        torch.cuda.empty_cache()  # an earlier layer's freed buffers, still in torch's cache, count as free
        free, total = torch.cuda.mem_get_info(dev)
        ins = [v for v in vars(self.inputs).values() if isinstance(v, torch.Tensor)] + list(self.inputs.shared or ())
        inputs = sum(v.numel() * v.element_size() for v in ins)
        need, own = layout.layer_bytes(cfg), s.working_bytes + layout.weight_copy_bytes(cfg)
        what = (f"the layer needs {need + inputs} B a GPU (NVSHMEM heap {s.symmetric_bytes} B, working buffers "
                f"{s.working_bytes} B, weight copies {layout.weight_copy_bytes(cfg)} B, inputs {inputs} B)")
        if need + inputs > total:
            raise layout.UnsupportedConfig("tokens", cfg.tokens, f"fewer: {what}, more than the {total} B of "
                                           f"{self.session.name}")
        if own > free:
            raise layout.UnsupportedConfig("tokens", cfg.tokens, f"fewer: {what}; its working buffers and weight "
                                           f"copies alone ({own} B) are more than the {free} B free")
        heap = os.environ.get("NVSHMEM_SYMMETRIC_SIZE", "")
        if heap.isdigit() and s.symmetric_bytes > int(heap):
            raise layout.UnsupportedConfig("tokens", cfg.tokens, f"fewer: {what}; its heap is more than "
                                           f"NVSHMEM_SYMMETRIC_SIZE = {heap} B")

    def _check_inputs(self, t: dict) -> None:
        import torch

        s = self.sizes
        i1 = layout.gemm0_cols(self.cfg)
        want = dict(x=(s.T, s.H), wg=(s.H, s.E), logit_offset=(s.E,), gate_bias=(s.E,), wg_bias=(s.E,),
                    w1=(s.L, s.H, i1), b1=(s.L, i1), w2=(s.L, s.I, s.H), b2=(s.L, s.H))
        shared = self.inputs.shared
        if (shared is not None) != (s.S > 0) or (shared is not None and len(shared) != 4):
            raise ValueError(f"input shared = {'given' if shared is not None else None} is not allowed: "
                             + (f"the {s.S} shared experts' (w1, b1, w2, b2)" if s.S else
                                "None (the config has no shared experts)"))
        if shared is not None:
            t = {**t, **{f"shared_{k}": v for k, v in zip(("w1", "b1", "w2", "b2"), shared)}}
            want.update({f"shared_{k}": (s.S, *want[k][1:]) for k in ("w1", "b1", "w2", "b2")})
        elem = torch.bfloat16 if self.cfg.dtype == "bfloat16" else torch.float32
        for name, shape in want.items():
            v = t[name]
            dtype = torch.float64 if name in ("logit_offset", "gate_bias", "wg_bias") else \
                elem if name in ("x", "w1", "w2", "shared_w1", "shared_w2") else torch.float32
            if tuple(v.shape) != shape or v.dtype != dtype or not v.is_contiguous() or not v.is_cuda:
                raise ValueError(f"input {name}: {tuple(v.shape)} {v.dtype} is not allowed: a contiguous CUDA "
                                 f"tensor {shape} {dtype}")

    def poison(self) -> None:
        """NaN in every output and intermediate buffer: an element the kernel misses shows."""
        import torch

        with torch.cuda.stream(self.session.torch_stream):
            for name in ("y", "logits", "weight", "row_weight", "hidden", "inbox", "staging", "outbuf", "combox",
                         "shared_out"):
                self.buffers[name].fill_(float("nan"))
            for name in ("expert", "slot", "counts", "row_token", "row_choice"):
                self.buffers[name].fill_(-7)

    def launch(self, telemetry: bool = False, events=None) -> None:
        """Enqueue one layer call on the session's stream (no wait, no error check): zero the
        working state, launch (the kernel itself waits, bounded, until every rank's kernel has
        started before anything is put). `events` (start, end) are recorded around the kernel."""
        import torch
        from cuda.core import LaunchConfig, launch

        if self.broken is not None:
            raise RuntimeError(f"this layer's earlier launch failed ({self.broken}); make a new Layer")
        with torch.cuda.stream(self.session.torch_stream):
            self._work64.zero_()
            self._work32.zero_()
        self.epoch += 1
        cfg = LaunchConfig(grid=self.grid, block=self.block_threads, shmem_size=self.loaded.smem_bytes,
                           is_cooperative=True)
        if events is not None:
            events[0].record(self.session.torch_stream)
        launch(self.session.stream, cfg, self.loaded.kernel, np.uint64(self._params.data_ptr()), np.uint64(self.epoch),
               np.int32(1 if telemetry else 0))
        if events is not None:
            events[1].record(self.session.torch_stream)

    def check(self) -> None:
        """Wait for the last launch; raise KernelTimeout / KernelError from its error record."""
        self.session.sync()
        try:
            errors.raise_if_error(self.buffers["error"].cpu().numpy())
        except errors.KernelError as e:
            self.broken = e
            raise

    def run(self, telemetry: bool = False) -> None:
        self.launch(telemetry)
        self.check()

    def output(self) -> np.ndarray:
        return self.buffers["y"].cpu().numpy()

    def routing(self) -> dict[str, np.ndarray]:
        """This rank's routing as the kernel computed it: expert, weight, slot (T, k), counts (E,)."""
        return {k: self.buffers[k].cpu().numpy() for k in ("expert", "weight", "slot", "counts")}

    def telemetry_logs(self) -> tuple[np.ndarray, np.ndarray]:
        return self.buffers["tlog"].cpu().numpy().view(np.uint64), self.buffers["tlog_count"].cpu().numpy()

    def trace_builder(self, origin_ns: int, send_counts: np.ndarray | None):
        """This rank's events of the last telemetry launch, and the number of dropped events."""
        tlog, counts = self.telemetry_logs()
        ids = telemetry.tile_ids(self.cfg, send_counts, self.session.rank) if send_counts is not None else None
        return telemetry.decode(tlog, counts, rank=self.session.rank, node=self.cfg.node_of(self.session.rank),
                                n_proc=self.n_proc, hidden=self.cfg.hidden, origin_ns=origin_ns, ids=ids,
                                elem_bytes=self.sizes.elem_bytes)

    def clock_sync(self) -> int:
        """This GPU's %globaltimer at the moment every rank's clock-sync kernel has started (a
        collective: every rank calls it once, between layer calls). The differences of the ranks'
        values are their clocks' offsets. Keeps the last launch's telemetry and counts."""
        import torch
        from cuda.core import LaunchConfig, launch

        with torch.cuda.stream(self.session.torch_stream):
            self.buffers["error"].zero_()
            now = torch.zeros(1, dtype=torch.int64, device=self.buffers["error"].device)
        self.epoch += 1  # the start signals carry this epoch; the next layer call waits for a newer one
        launch(self.session.stream, LaunchConfig(grid=1, block=1), self.loaded.clock_sync,
               np.uint64(self._params.data_ptr()), np.uint64(self.epoch), np.uint64(now.data_ptr()))
        self.check()
        return int(now.item())

    def kernel_start_ns(self) -> int:
        """Earliest event start of the last telemetry launch (globaltimer ns)."""
        tlog, counts = self.telemetry_logs()
        starts = [int(tlog[i, 0, 0]) for i in range(len(counts)) if counts[i] > 0]
        return min(starts) if starts else 0

    def close(self) -> None:
        import nvshmem.core as nvshmem

        self.session.sync()
        nvshmem.free_tensor(self._sym_f)
        nvshmem.free_tensor(self._sym_sig)
