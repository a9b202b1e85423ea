"""One GPU's process: runs a job (a list of cases) on this rank, rank 0 gathers and reports.

    python -m gpu.worker JOB.json OUT_DIR     (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set)

A case is a dict: name, config (Config fields), inputs ("reference": the reference's seeded
inputs, or "random": drawn on the GPU), and what to do: "golden" (compare routing and output
with reference.golden, small configs), "baseline" (compare with the dropless torch layer), "telemetry"
(run with telemetry on and off, compare, decode the trace), "bench" (time the kernel and the
torch layers of gpu.baseline.KINDS, or those of "torch_layers"; the padded one is skipped where
its buffers do not fit), "torch_only" (the reason the kernel does not run the layer: the torch
layers alone), "profile" (a torch profiler table of one baseline call per dtype), "ties" (the
inputs' experts tied in pairs, cases.tie_experts, the golden's too), "calls" (run gpu.MoELayer that many
times on new tokens instead, each call checked against the golden), "sit_out"
(this rank does not launch: the others must time out and raise), timeout_ms, "dispatch" (how
the kernel moves dispatched rows, sim.trace.DISPATCH_PATHS; by default sim.costs.dispatch_path's), "staged_blocks"
(its senders, layout.STAGED_BLOCKS by default), and "meta" (the
run's provenance: commit, command, driver, ..., copied into the result and the trace's meta).
Rank 0 writes OUT_DIR/results.json (one dict per case) and the traces; a bench case's trace is
saved after its timings, so the trace file alone describes the measured run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from reference import Config, golden, routing, weights
from reference.numerics import compute_dtype
from sim.costs import DEFAULT_DISPATCH

from . import baseline, errors, telemetry
from .cases import baseline_precision, tie_experts
from .layout import GATE_SELECT, STAGED_BLOCKS, WGMMA_PRECISIONS, Sizes, gemm0_cols
from .runtime import Inputs, Layer, Session

# of the GPUs' free memory a zoo check may plan to take (zoo_check_bytes counts live tensors; torch's
# caching allocator can hold ~10% more in blocks the draw's float32 tensors leave split)
ZOO_MEMORY_SHARE = 0.85
ZOO_SAMPLE_STREAM = 37  # the zoo check's sample of tokens: its own random stream beside the case's seed
ZOO_GOLDEN_THREADS = 8  # the most host threads a rank's streamed golden takes (golden_threads)
CLOCK_SYNCS = 3  # clock-sync launches per trace: the median offset rejects one that read off


def _gather(session: Session, obj):
    import torch.distributed as dist

    out = [None] * session.world
    dist.all_gather_object(out, obj, group=session.cpu_group)
    return out


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return golden.max_rel_error(got, want)


def golden_path(cfg: Config) -> str:
    """The golden a kernel run is held to: float64 for the float32 kernel, the reference's
    bf16-emulated path (bf16 operands and activation, float32 accumulation) for the bf16 one, its
    tf32 path (GEMM operands rounded as cvt.rna.tf32.f32 rounds them) for the TF32 one; float64
    for the split TF32 one too, which is held to float32's accuracy."""
    return "float64" if cfg.precision in ("float32", "tf32x3") else cfg.precision


def routing_check(cfg: Config, r: routing.Routing, routes: list) -> dict:
    """Every rank's kernel routing (its experts, slots, weights and counts) against the golden's `r`:
    experts and slots exactly (ties go to the lower expert in both), weights to their largest
    absolute difference; and the golden's dropped assignments."""
    expert = np.stack([x["expert"] for x in routes])
    slot = np.stack([x["slot"] for x in routes])
    weight = np.stack([x["weight"] for x in routes])
    counts = np.stack([x["counts"] for x in routes])
    return {"routing_equal": bool(np.array_equal(expert, r.expert) and np.array_equal(slot, r.slot)),
            "counts_equal": bool(np.array_equal(counts, r.counts(cfg.experts))),
            "weight_max_abs_err": float(np.abs(weight - r.weight).max()), "dropped": r.dropped}


def check_golden(cfg: Config, ys: list, routes: list, ties: bool = False, w: weights.Weights | None = None) -> dict:
    """Kernel routing and output of every rank against the reference's golden of its precision
    (the routing of a bf16 config is the reference's of the bf16-rounded tokens and gate weights);
    where that golden is not float64, the output against float64 too (rel_err_float64). Of the
    inputs `w` (default: the config's seeded ones; with `ties`, their experts tied as
    cases.tie_experts ties them, as the kernel ran them)."""
    if w is None:
        w = weights.draw(cfg)
        if ties:
            tie_experts(cfg, w.wg, w.gate_bias, w.wg_bias)
    r = routing.route(cfg, w.x, w.wg, w.gate_bias, w.wg_bias)
    y_gold = golden.dense(cfg, w, r, golden_path(cfg))
    res = {**routing_check(cfg, r, routes), "rel_err": _rel(np.stack(ys), y_gold), "golden_path": golden_path(cfg),
           "nan": bool(np.isnan(np.stack(ys)).any())}
    if golden_path(cfg) != "float64":
        res["rel_err_float64"] = _rel(np.stack(ys), golden.dense(cfg, w, r, "float64"))
    return res


def run_everywhere(session: Session, layer: Layer, telemetry: bool = False) -> None:
    """layer.run on every rank; if any rank's kernel failed, every rank raises (so no rank waits
    in a later collective for one that left)."""
    try:
        layer.run(telemetry)
        mine = None
    except errors.KernelError as e:
        mine = e
    failed = [e for e in _gather(session, mine) if e is not None]
    if failed:
        raise mine or failed[0]


def timed(session: Session, fn, warmup: int, iters: int, sync_fn) -> list[float]:
    """Per-iteration device time in ms: fn(events) records CUDA events (start, end) on the
    session stream around the work; sync_fn runs between iterations (checks, lining ranks up)."""
    import torch

    times = []
    for i in range(warmup + iters):
        sync_fn()
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        fn(events)
        events[1].synchronize()
        if i >= warmup:
            times.append(events[0].elapsed_time(events[1]))
    return times


def around(stream, work):
    """fn(events) for `timed`: events recorded on `stream` around work()."""
    import torch

    def fn(events):
        with torch.cuda.stream(stream):
            events[0].record()
            work()
            events[1].record()

    return fn


def hardware_preset(gpu_name: str) -> str | None:
    """The simulator's hardware preset of a GPU (the name torch reports), None if it has none."""
    for key, preset in (("H200", "h200-sxm"), ("H100", "h100-sxm")):
        if key in gpu_name:
            return preset
    return None


def profile_table(session: Session, fn) -> str:
    """torch profiler's table (top CUDA time) of one call of fn, after the timed runs warmed it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.cuda.stream(session.torch_stream), profile(activities=[ProfilerActivity.CPU,
                                                                       ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="device_time_total", row_limit=14, max_name_column_width=50)


def last_trace(session: Session, layer: Layer, cfg: Config, send_counts: np.ndarray, res: dict):
    """The trace of the layer's last telemetry launch, all ranks on one time axis, rank 0's clock
    (rank 0; None elsewhere); its processor utilization, size and span go into res. Collective.
    The GPUs' %globaltimer clocks differ by an offset that drifts slowly (~4 us over a sweep),
    measured by CLOCK_SYNCS clock-sync launches, the median kept per rank: the first clock sync of a
    process has read ~104 us off on an H200 pair, which placed rank 1's whole trace that late."""
    samples = []
    for _ in range(CLOCK_SYNCS):
        clocks = _gather(session, layer.clock_sync())
        samples.append([c - clocks[0] for c in clocks])  # rank r's clock minus rank 0's
    offsets = [int(np.median(per_rank)) for per_rank in zip(*samples)]
    starts = _gather(session, layer.kernel_start_ns())
    origin = min(s - d for s, d in zip(starts, offsets))  # on rank 0's clock
    tb, dropped = layer.trace_builder(origin + offsets[session.rank], send_counts)
    parts = _gather(session, (tb.build(), dropped))
    if session.rank != 0:
        return None
    from sim.costs import queue_policy
    from sim.trace import KIND, META_VERSION, ROLE, check_meta, concat

    trace = concat([p[0] for p in parts], meta={
        "meta_version": META_VERSION, "source": "gpu", "config": cfg.to_dict(), "gpu": session.name,
        "ranks": session.world, "hardware": hardware_preset(session.name), "processors": layer.n_proc,
        "grid": layer.grid,
        "dropped_events": sum(p[1] for p in parts), "dispatch": layer.dispatch,
        "staged_blocks": layer.staged_blocks,
        "queue": queue_policy(cfg),  # os.cuh QUEUE_BY_EXPERT, as the simulator names it
        "deal": "chunks",  # processor.cuh deal_chunks, as the simulator names it (sim.costs.DISPATCH_DEALS)
        "share_fences": 1,  # processor.cuh dispatch_chunk, a chunk of one share (sim.costs.SHARE_FENCES)
        "select": GATE_SELECT,
        "time_origin": "earliest kernel start over ranks (globaltimer ns, rank 0's clock)",
        "clock_offsets_ns": offsets, "clock_offset_samples_ns": samples})
    check_meta(trace.meta)
    res["sm_utilization"] = telemetry.processor_utilization(trace, layer.n_proc)
    # GEMM task time per processor block: the layer's GEMM FLOPs over it give the rate of the
    # GEMM phase as if it had all processors to itself (the bar of "GEMM phases at x% of ceiling")
    proc, kind = trace["role"] == ROLE["processor"], trace["kind"]
    gemm = proc & ((kind == KIND["gemm0"]) | (kind == KIND["gemm1"]))
    res["gemm_ms_per_proc"] = float((trace["end"][gemm] - trace["start"][gemm]).sum()) / (
        layer.n_proc * session.world) / 1e6
    res["trace_events"] = len(trace)
    res["dropped_events"] = trace.meta["dropped_events"]
    res["trace_span_ms"] = float(trace["end"].max() - trace["start"].min()) / 1e6 if len(trace) else 0.0
    return trace


def run_moe_layer_case(session: Session, case: dict) -> dict:
    """gpu.MoELayer given the reference's weights of all E experts as torch tensors, called
    case["calls"] times with new random tokens drawn on the GPU (bf16 ones for a bfloat16 config);
    rank 0 checks every call's routing and output against the golden of those tokens."""
    import dataclasses

    import torch

    from .moe_layer import MoELayer

    cfg = Config.from_dict(case["config"])
    w = weights.draw(cfg)
    dev = torch.device("cuda", session.local_rank)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    given = {"wg": t(w.wg), "w1": t(w.w1[: cfg.experts]), "w2": t(w.w2[: cfg.experts])}
    if cfg.bias:
        given.update(b1=t(w.b1[: cfg.experts]), b2=t(w.b2[: cfg.experts]))
    if cfg.router_bias:
        given["wg_bias"] = t(w.wg_bias)
    if cfg.gate == "sigmoid_bias":
        given["gate_bias"] = t(w.gate_bias)
    res: dict = {"name": case["name"], "config": cfg.to_dict(), "gpu": session.name, "calls": []}
    layer = MoELayer(cfg, given, timeout_ms=case.get("timeout_ms", 5000.0), on=session)
    gen = torch.Generator(device=dev)
    gen.manual_seed(case.get("seed", 0) * 1_000_003 + session.rank)
    try:
        for _ in range(case["calls"]):
            x = torch.randn(cfg.tokens, cfg.hidden, generator=gen, device=dev)
            y = layer.forward(x.to(torch.bfloat16) if cfg.dtype == "bfloat16" else x)
            xs, ys, routes = zip(*_gather(session, (x.cpu().numpy(), y.cpu().numpy(), layer.routing())))
            if session.rank == 0:
                res["calls"].append(check_golden(cfg, list(ys), list(routes), w=dataclasses.replace(w, x=np.stack(xs))))
    finally:
        layer.close()
    return res


def zoo_check_bytes(cfg: Config) -> int:
    """Device bytes one GPU takes at the peak of a zoo check beyond NVSHMEM's heap (which gpu.spawn
    sizes for a job's largest layer and NVSHMEM takes at its start), at least: the more of the
    inputs' draw on the GPU (runtime.Inputs.random: each weight tensor drawn in float32 and scaled
    into a second one, the local experts' W1, then W2, then the shared experts'; for bf16 every
    weight's copy beside the float32 ones) and the Layer's copies of the weights (the inputs, the
    kernel's layout, and for the tensor-core GEMMs the K-major copy)."""
    s = Sizes.of(cfg)
    n_in = gemm0_cols(cfg)
    w1, w2 = cfg.local_experts * cfg.hidden * n_in, cfg.local_experts * cfg.ffn * cfg.hidden
    shared = cfg.shared_experts * cfg.hidden * (n_in + cfg.ffn)
    every = w1 + w2 + shared
    copy = s.elem_bytes * every if cfg.dtype == "bfloat16" else 0
    draw = max(8 * w1, 4 * (w1 + 2 * w2), 4 * (w1 + w2 + 2 * shared), 4 * every + copy)
    copies = 3 if cfg.precision in WGMMA_PRECISIONS else 2
    return max(draw, copies * s.elem_bytes * every)


def golden_threads(world: int) -> int:
    """Host threads each rank's streamed golden runs in: the host's cores shared by its ranks, at most
    ZOO_GOLDEN_THREADS (NumPy's conversions run one core each; the threads hold an expert each)."""
    return max(1, min(ZOO_GOLDEN_THREADS, (os.cpu_count() or 1) // world))


def streamed_golden(cfg: Config, rows: tuple, experts: list[int], fetch, paths, threads: int) -> dict:
    """golden.contributions of `rows` (x, expert, weight, kept) from `experts`, fetch(e) giving expert
    e's (w1, b1, w2, b2) on the host: the experts dealt to `threads` host threads, each streaming its
    own one at a time; the experts fill disjoint rows, so the threads' sum is exact."""
    from concurrent.futures import ThreadPoolExecutor

    shares = [experts[i::threads] for i in range(max(1, min(threads, len(experts))))]
    with ThreadPoolExecutor(len(shares)) as pool:
        parts = list(pool.map(lambda share: golden.contributions(cfg, *rows, ((e, *fetch(e)) for e in share),
                                                                 paths), shares))
    for other in parts[1:]:
        for path in paths:
            parts[0][path] += other[path]
    return parts[0]


def run_zoo_check(session: Session, case: dict) -> dict:
    """A full-size layer (cases.zoo_check_cases) on inputs drawn on the GPU: every token's routing and
    a random sample of case["zoo_samples"] tokens of each rank against the golden (float64, and the
    golden of the kernel's precision, golden_path), from exactly the weights the kernel read: each
    rank streams its own experts that the sample chose (and its shared ones, for its own sampled
    tokens) off the GPU into golden.contributions, one at a time in each of golden_threads threads,
    so the host holds that many experts at once; rank 0 sums them in choice order. Skipped, saying
    why, where the GPUs' free memory is less than zoo_check_bytes. Collective."""
    import torch

    cfg = Config.from_dict(case["config"])
    res: dict = {"name": case["name"], "config": cfg.to_dict(), "gpu": session.name, **case.get("meta", {})}
    t0 = time.perf_counter()
    need, free = zoo_check_bytes(cfg), min(_gather(session, torch.cuda.mem_get_info()[0]))
    if need > ZOO_MEMORY_SHARE * free:
        res["skipped"] = (f"needs {need / 2**30:.1f} GiB a GPU, more than {ZOO_MEMORY_SHARE:.0%} of the "
                          f"{free / 2**30:.1f} GiB free")
        return res
    inputs = Inputs.random(cfg, session.rank, case["seed"])
    layer = Layer(session, cfg, inputs, timeout_ms=case.get("timeout_ms", 5000.0))
    try:
        layer.poison()
        run_everywhere(session, layer)
        y, rt = layer.output(), layer.routing()
    finally:
        layer.close()
    del layer
    res["kernel_seconds"] = time.perf_counter() - t0
    t1 = time.perf_counter()

    def host(t):  # a device tensor's values, exactly (bf16 -> float32), on the host
        return t.float().cpu().numpy()

    xs, ys, routes = zip(*_gather(session, (host(inputs.x), y, rt)))
    r = routing.route(cfg, np.stack(xs), host(inputs.wg), inputs.gate_bias.cpu().numpy(),
                      inputs.wg_bias.cpu().numpy())
    # the sample: the same on every rank (the case's seed), sorted token indices of each rank
    n = min(case["zoo_samples"], cfg.tokens)
    rng = np.random.default_rng([case["seed"], ZOO_SAMPLE_STREAM])
    src = np.repeat(np.arange(cfg.ranks), n)
    tok = np.concatenate([np.sort(rng.choice(cfg.tokens, n, replace=False)) for _ in range(cfg.ranks)])
    x, expert, weight, kept = np.stack(xs)[src, tok], r.expert[src, tok], r.weight[src, tok], r.kept[src, tok]
    paths = tuple(dict.fromkeys(("float64", golden_path(cfg))))
    lo, local = session.rank * cfg.local_experts, cfg.local_experts
    mine = sorted({int(e) for e in expert[kept] if lo <= e < lo + local})
    threads = golden_threads(session.world)
    part = streamed_golden(cfg, (x, expert, weight, kept), mine,
                           lambda e: [host(getattr(inputs, a)[e - lo]) for a in ("w1", "b1", "w2", "b2")],
                           paths, threads)
    filled = kept & (expert >= lo) & (expert < lo + local)
    if cfg.shared_experts:
        own = src == session.rank
        shared = streamed_golden(cfg, (x[own], expert[own], weight[own], kept[own]),
                                 list(range(cfg.experts, cfg.experts + cfg.shared_experts)),
                                 lambda e: [host(t[e - cfg.experts]) for t in inputs.shared], paths, threads)
        filled = np.concatenate([filled, np.repeat(own[:, None], cfg.shared_experts, axis=1)], axis=1)
        for path in paths:
            part[path][own] += shared[path]  # its routed rows are zero, as part's shared rows are
    ii, jj = np.nonzero(filled)
    parts = _gather(session, (ii, jj, {path: part[path][ii, jj] for path in paths}, len(mine),
                              time.perf_counter() - t1))
    inputs = part = None  # the weights leave the GPU before the next case draws its own
    torch.cuda.empty_cache()
    if session.rank != 0:
        return res
    full = {path: np.zeros((src.size, cfg.top_k + cfg.shared_experts, cfg.hidden), compute_dtype(path))
            for path in paths}
    count = np.zeros(full["float64"].shape[:2], np.int64)
    for pi, pj, values, _, _ in parts:
        np.add.at(count, (pi, pj), 1)
        for path in paths:
            full[path][pi, pj] = values[path]
    # every kept choice of a sampled token and every shared expert's row, each from one rank
    want = np.concatenate([kept, np.ones((src.size, cfg.shared_experts), bool)], axis=1)
    if not np.array_equal(count, want.astype(np.int64)):
        raise RuntimeError(f"the streamed golden filled {int(count.sum())} rows, not the {int(want.sum())} "
                           "the sample's kept choices and shared experts make, each once")
    y_kernel = np.stack(ys)[src, tok]
    gold = {path: golden.ordered_sum(full[path]) for path in paths}
    res.update(routing_check(cfg, r, list(routes)), golden_path=golden_path(cfg), samples=int(src.size),
               rel_err=_rel(y_kernel, gold[golden_path(cfg)]), nan=bool(np.isnan(np.stack(ys)).any()),
               y_max_abs=float(np.abs(y_kernel).max()), experts_streamed=int(sum(q[3] for q in parts)),
               golden_seconds=max(q[4] for q in parts), golden_threads=threads)
    if golden_path(cfg) != "float64":
        res["rel_err_float64"] = _rel(y_kernel, gold["float64"])
    res["seconds"] = time.perf_counter() - t0
    return res


def max_over_ranks(session: Session, times: list[float]) -> np.ndarray:
    """Per iteration, the slowest rank's time (collective)."""
    return np.array(_gather(session, times)).max(axis=0)


def time_torch(session: Session, cfg: Config, inputs, case: dict, res: dict) -> None:
    """Time the torch layers of the case (gpu.baseline.KINDS, or its "torch_layers") in each of its
    "baselines" precisions into res: the padded layer's as torch_DT_ms (skipped, with the reason,
    where its buffers do not fit the free memory), the others as torch_KIND_DT_ms; the per-expert
    loop in the first precision only; in it too the dropless layer's expert FFNs alone on the rows
    it routes (DroplessLayer.experts_alone, torch_experts_DT_ms): the layer's GEMMs at torch's
    grouped GEMM's rate, the kernel's bound where that rate is below the ceiling. Collective."""
    import torch
    import torch.distributed as dist

    warm, iters = case.get("warmup", 3), case.get("iters", 10)
    token = torch.ones(1, device=inputs.x.device)

    def nccl_barrier():
        with torch.cuda.stream(session.torch_stream):
            dist.all_reduce(token)

    for i, dt in enumerate(case.get("baselines", ["float32"])):
        for kind in [k for k in case.get("torch_layers", list(baseline.KINDS)) if i == 0 or k != "loop"]:
            key = f"torch_{dt}" if kind == "padded" else f"torch_{kind}_{dt}"
            if kind == "padded" and not all(_gather(session, baseline.padded_bytes(cfg, dt)
                                                    < 0.9 * torch.cuda.mem_get_info()[0])):
                res[f"{key}_skipped"] = f"{baseline.padded_bytes(cfg, dt) / 1e9:.1f} GB of buffers do not fit"
                continue
            b = baseline.make(kind, cfg, inputs, session.rank, dt)
            with torch.cuda.stream(session.torch_stream):
                bt = max_over_ranks(session, timed(session, around(session.torch_stream, b.forward), warm, iters,
                                                   nccl_barrier))
            res[f"{key}_ms"] = float(np.median(bt))
            res[f"{key}_ms_all"] = bt.tolist()
            if kind == "dropless" and i == 0:
                # routed on the stream it is timed on: its first call must see the dispatch's rows and counts
                with torch.cuda.stream(session.torch_stream):
                    alone = b.experts_alone()
                    et = max_over_ranks(session, timed(session, around(session.torch_stream, alone), warm, iters,
                                                       nccl_barrier))
                res[f"torch_experts_{dt}_ms"] = float(np.median(et))
                res[f"torch_experts_{dt}_ms_all"] = et.tolist()
                del alone
            if case.get("profile") and kind != "loop":
                try:  # every rank runs it (the all-to-alls need all); a profiler fault costs the table only
                    res[f"{key}_profile"] = profile_table(session, b.forward)
                except Exception as e:
                    res[f"{key}_profile"] = f"profiler failed: {type(e).__name__}: {e}"
            del b
            torch.cuda.empty_cache()


def torch_only(session: Session, cfg: Config, case: dict, res: dict) -> dict:
    """A layer the kernel does not compute (case["torch_only"]: why): the torch layers alone, on
    inputs drawn on the GPU (gpu.baseline.random_inputs), and the dropless layer's send counts (the
    roofline's). Collective."""
    import torch

    with torch.cuda.stream(session.torch_stream):
        inputs = baseline.random_inputs(cfg, session.rank, case.get("seed", 0),
                                        torch.device("cuda", torch.cuda.current_device()))
        if baseline_precision(cfg) == "bfloat16":  # the weights once in bf16, not copied by every layer
            inputs.x, inputs.w1, inputs.w2 = (t.to(torch.bfloat16) for t in (inputs.x, inputs.w1, inputs.w2))
        expert, _, slot = baseline.DroplessLayer(cfg, inputs, session.rank, baseline_precision(cfg)).route()
    mine = np.bincount(expert[slot >= 0].cpu().numpy(), minlength=cfg.experts)
    res["send_counts"] = np.stack(_gather(session, mine)).tolist()
    res["kept_rows"] = int(np.sum(res["send_counts"]))
    res["kernel_skipped"] = case["torch_only"]
    time_torch(session, cfg, inputs, case, res)
    del inputs
    torch.cuda.empty_cache()
    return res


def run_case(session: Session, case: dict, out_dir: Path) -> dict:
    import torch

    cfg = Config.from_dict(case["config"])
    dispatch = case.get("dispatch") or DEFAULT_DISPATCH
    res: dict = {"name": case["name"], "config": cfg.to_dict(), "gpu": session.name, **case.get("meta", {}),
                 "dispatch": dispatch, "staged_blocks": case.get("staged_blocks", STAGED_BLOCKS)}
    t0 = time.perf_counter()
    if case.get("torch_only"):
        torch_only(session, cfg, case, res)
        res["seconds"] = time.perf_counter() - t0
        return res
    inputs = Inputs.reference(cfg, session.rank) if case.get("inputs", "reference") == "reference" \
        else Inputs.random(cfg, session.rank, case.get("seed", 0))
    if case.get("ties"):
        tie_experts(cfg, inputs.wg, inputs.gate_bias, inputs.wg_bias)
    layer = Layer(session, cfg, inputs, timeout_ms=case.get("timeout_ms", 5000.0),
                  dispatch=dispatch, staged_blocks=res["staged_blocks"])
    res["grid"], res["n_proc"] = layer.grid, layer.n_proc
    try:
        if case.get("sit_out") is not None:
            if session.rank != case["sit_out"]:
                t = time.perf_counter()
                try:
                    layer.run()
                    res["raised"] = None
                except errors.KernelError as e:
                    res["raised"], res["error"] = type(e).__name__, str(e)
                res["seconds_to_raise"] = time.perf_counter() - t
            return _gather(session, res)[0 if case["sit_out"] != 0 else 1]
        layer.poison()
        run_everywhere(session, layer)
        y = layer.output()
        rt = layer.routing()
        ys, routes = zip(*_gather(session, (y, rt)))
        if case.get("golden") and session.rank == 0:
            res.update(check_golden(cfg, list(ys), list(routes), case.get("ties", False)))
        # determinism and telemetry: the same output bit for bit with telemetry on (ranks lined up
        # first, so that the trace shows the layer, not the host's skew between the ranks)
        layer.poison()
        session.line_up()
        run_everywhere(session, layer, telemetry=True)
        res["telemetry_same_output"] = all(_gather(session, bool(np.array_equal(layer.output(), y))))
        send_counts = np.stack([r["counts"] for r in routes])
        res["kept_rows"] = int(send_counts.sum())  # rows the experts computed, over all ranks
        res["send_counts"] = send_counts.tolist()  # (P, E): the layer's roofline (sim.metrics.layer_roofline)
        trace = last_trace(session, layer, cfg, send_counts, res)
        if case.get("baseline_check") or case.get("bench"):
            base = baseline.DroplessLayer(cfg, inputs, session.rank, baseline_precision(cfg))
            yb, eb, wb, sb = base.forward()
            same_route = bool(torch.equal(eb.cpu(), torch.from_numpy(rt["expert"])) and
                              torch.equal(sb.cpu(), torch.from_numpy(rt["slot"])))
            errs = _gather(session, (_rel(y, yb.cpu().numpy()), same_route))
            res["vs_baseline_rel_err"] = max(e[0] for e in errs)
            res["y_max_abs"] = max(_gather(session, float(np.abs(y).max())))  # the check is not of zeros
            res["baseline_routing_equal"] = all(e[1] for e in errs)
        if case.get("bench"):
            warm, iters = case.get("warmup", 3), case.get("iters", 10)

            def lined_up():
                # the last launch checked, then the ranks' launches lined up: the kernel's own
                # start wait does not time host skew between the ranks
                layer.check()
                session.line_up()

            kern = max_over_ranks(session, timed(session, lambda ev: layer.launch(events=ev), warm, iters, lined_up))
            layer.check()
            kern_tel = max_over_ranks(session, timed(session, lambda ev: layer.launch(True, events=ev), warm, iters,
                                                     lined_up))
            layer.check()
            res["warmup"], res["iters"] = warm, iters
            res["kernel_ms"] = float(np.median(kern))
            res["kernel_ms_all"] = kern.tolist()
            res["kernel_telemetry_ms"] = float(np.median(kern_tel))
            res["kernel_telemetry_ms_all"] = kern_tel.tolist()
            # the trace of the last timed telemetry launch: warm, lined up, one of the timed runs
            trace = last_trace(session, layer, cfg, send_counts, res)
            if trace is not None:
                trace.meta["launch"] = "the last of the timed telemetry launches"
            time_torch(session, cfg, inputs, case, res)
        res["seconds"] = time.perf_counter() - t0
        if trace is not None and case.get("trace"):
            keep = ("name", "grid", "sm_utilization", "gemm_ms_per_proc", "warmup", "iters", "kernel_ms",
                    "kernel_ms_all", "kernel_telemetry_ms", "kernel_telemetry_ms_all", "vs_baseline_rel_err", "rel_err")
            trace.meta.update({k: v for k, v in res.items() if k in keep or (k.startswith("torch_") and
                                                                          not k.endswith("_profile"))})
            trace.meta.update(case.get("meta", {}))
            trace.save(out_dir / case["trace"])
            res["trace"] = case["trace"]
    finally:
        layer.close()
        torch.cuda.empty_cache()
    return res


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    session = Session.start()
    results = []
    for case in job["cases"]:
        try:
            if case.get("skip"):
                res = {"name": case["name"], "config": case["config"], "skipped": case["skip"]}
            elif case.get("zoo_samples"):
                res = run_zoo_check(session, case)
            elif case.get("calls"):
                res = run_moe_layer_case(session, case)
            else:
                res = run_case(session, case, out_dir)
        except Exception as e:  # reported per case; a broken session stops the job
            res = {"name": case["name"], "failed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(f"[rank {session.rank}] case {case['name']} failed: {res['failed']}", file=sys.stderr, flush=True)
        if session.rank == 0:
            results.append(res)
            (out_dir / "results.json").write_text(json.dumps(results, separators=(",", ":"), default=str))
            quiet = ("config", "kernel_ms_all", "traceback", "send_counts")
            print(json.dumps({k: v for k, v in res.items() if k not in quiet}, default=str), flush=True)
        if "failed" in res and "Timeout" in res["failed"]:
            break
    session.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    sys.exit(main(sys.argv[1:]))
