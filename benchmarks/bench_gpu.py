"""The GPU matrix: build, check and time the megakernel against the golden and the torch layer.

    python benchmarks/bench_gpu.py --gpus 1 2 4 --suite checks bench --out OUT_DIR
    python benchmarks/bench_gpu.py --gpus 1 2 --suite bench --dtypes bfloat16 float32 --untraced float32
    python benchmarks/bench_gpu.py --gpus 1 2 --suite checks bench --dtypes tf32
    python benchmarks/bench_gpu.py --gpus 1 --suite bench --dtypes bfloat16 --tile 128x256x64
    python benchmarks/bench_gpu.py --gpus 1 2 4 --suite validate --prefix h100x4-
    python benchmarks/bench_gpu.py --gpus 4 2 1 --suite matrix --dtypes bfloat16 tf32x3 --estimate

`checks`: small configs against the float64 golden (fresh seeds, skewed routing, all tokens to one
expert, capacity dropping, T not a multiple of tile_m, E = P and E = 8P, every gate and
activation the kernel supports), telemetry on/off, and a rank that sits out (the others must
time out and raise). `bench`: the FlashMoE default and its token/expert sweeps, kernel vs the
torch layer of the same dtype (float32 points also beside torch bf16), random inputs drawn on the GPU,
checked against the torch layer. `validate`: the validation set's layers (reference/validation_set.py)
at the bf16 bench tile, each traced and checked against the torch layer (the layers the kernel
refuses are listed). `--dtypes` picks the kernels (float32, bfloat16, tf32: float32 data
on TF32 tensor cores, timed beside torch with TF32 allowed; tf32x3: float32 data on TF32 tensor
cores at float32's accuracy, timed beside torch float32), `--untraced` those whose points keep
no trace, and `checks` then includes the bf16 (tf32, tf32x3) kernel's checks against the
reference's bf16-emulated (tf32, float64) golden. The matmul ceiling of each precision is measured
first (torch, 8192^3) and each point's rate is given as a share of its own precision's ceiling;
tf32x3's is float32's, the ceiling of its dtype at its accuracy. The memory's rate is measured
too (torch copy and sum), and each point gets the GEMM phase's best share of the ceiling where
every expert weight has to come from memory once (weights_bound): the roofline the GEMM phase's
bar meets on layers of few rows per expert; `GEMM phase % roofline` is the phase's share of the
lesser of that bound and the ceiling (roofline_share). Every point is timed beside the torch
layers of gpu/baseline.py (dropless with a grouped GEMM and with one matmul per expert, padded) and
set against its roofline (sim.metrics.layer_roofline, at the measured ceiling, memory rate and
NVLink rate of GPU 0 to its peers) and against the dropless layer's expert FFNs alone (torch's
grouped GEMMs on the rows it routes, the slowest GPU's). `matrix`: the zoo's models (their kernel
twins where the kernel lacks what they need, and the models in torch alone) at --tokens per GPU
and FlashMoE's sweeps; --estimate lists its points, the skipped ones with the reason, and a guess
of its time, without a GPU; --compact writes the run as one small JSON and its table.
Every result (and every bench trace's meta) carries the run's provenance: the commit
($MOELAB_COMMIT where the tree has no .git, else `git rev-parse HEAD`), the command line, the
GPUs, driver, CUDA and library versions. Writes OUT_DIR/gpus-N/results.json and traces (named
with --prefix), OUT_DIR/summary.json, and prints one table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu import UnsupportedConfig, check_supported, spawn  # noqa: E402
from gpu.baseline import padded_bytes  # noqa: E402
from gpu.cases import (  # noqa: E402
    GOLDEN_TOLERANCE,
    MATRIX_TOKENS,
    PRECISIONS,
    ZOO_CHECK_SAMPLES,
    baseline_precision,
    bench_cases,
    bf16_check_cases,
    check_cases,
    in_dtype,
    matrix_cases,
    sit_out_case,
    tf32_check_cases,
    tf32x3_check_cases,
    validation_cases,
    zoo_check_cases,
    zoo_trace_cases,
)
from gpu.layout import Sizes, layer_bytes  # noqa: E402
from gpu.provenance import command_output, run_meta  # noqa: E402
from gpu.worker import ZOO_GOLDEN_THREADS  # noqa: E402
from reference import Config, ConfigError, presets  # noqa: E402
from reference.cli import format_table  # noqa: E402
from reference.weights import ffn_in_width  # noqa: E402
from sim import hardware, metrics  # noqa: E402
from sim.trace import DISPATCH_PATHS  # noqa: E402


def tile_shape(text: str) -> tuple[int, int, int]:
    """--tile's MxNxK, e.g. 128x256x64."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(x.isdigit() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(f"tile {text!r}: three positive integers MxNxK, e.g. 128x256x64")
    return int(parts[0]), int(parts[1]), int(parts[2])


def median_seconds(op) -> float:
    """Median time of op() on GPU 0 over 10 runs after 3 warm-ups (CUDA events)."""
    import torch

    times = []
    for i in range(13):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        op()
        e.record()
        e.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def ceiling_tflops(dtype: str = "float32") -> float:
    """Measured matmul rate of `dtype` (torch, TF32 only for "tf32", 8192^3 random operands) on GPU 0."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a = torch.randn(8192, 8192, device="cuda", dtype=dt)
    b = torch.randn(8192, 8192, device="cuda", dtype=dt)
    seconds = median_seconds(partial(torch.matmul, a, b))
    torch.backends.cuda.matmul.allow_tf32 = False
    del a, b
    torch.cuda.empty_cache()  # the workers' layers get the memory back
    return 2 * 8192 ** 3 / seconds / 1e12


def memory_gbps() -> float:
    """Measured rate of GPU 0's memory, GB/s: the faster of a 1 GiB copy (read and write counted)
    and a 1 GiB sum (read): the pace at which a GEMM phase can at best stream its weights."""
    import torch

    n = 2**28
    src, dst = torch.rand(n, device="cuda"), torch.empty(n, device="cuda")
    gbps = max(8 * n / median_seconds(partial(dst.copy_, src)), 4 * n / median_seconds(src.sum)) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return gbps


def nvlink_gbps(gpus: int) -> float | None:
    """Measured rate of GPU 0 to all its peers at once, GB/s it sends: 256 MiB copied to each of
    GPUs 1 .. gpus-1 together, one stream each (the pace of a layer's dispatch and returns at
    best); None on one GPU, or where the copies fail (the error is printed)."""
    import torch

    if gpus < 2:
        return None

    def measure() -> float:
        n = 2**26
        src = torch.rand(n, device="cuda:0")
        dsts = [torch.empty(n, device=f"cuda:{g}") for g in range(1, gpus)]
        streams = [torch.cuda.Stream(device="cuda:0") for _ in dsts]
        times = []
        for i in range(13):
            t = time.perf_counter()
            for dst, stream in zip(dsts, streams):
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
            for g in range(gpus):
                torch.cuda.synchronize(g)
            if i >= 3:
                times.append(time.perf_counter() - t)
        return 4 * n * (gpus - 1) / sorted(times)[len(times) // 2] / 1e9

    try:
        return measure()
    except Exception as e:  # the table then has no NVLink bound, not no table
        print(f"NVLink rate not measured: {type(e).__name__}: {e}", flush=True)
        return None
    finally:
        torch.cuda.empty_cache()


def flops(r: dict) -> float:
    """Expert FLOPs of one layer call over all ranks: 2 H (W1's columns + I) a row, GEMM0 and GEMM1,
    for every kept routed row and each shared expert's T rows on every rank (as the roofline,
    sim.metrics.layer_roofline, counts them)."""
    cfg = Config.from_dict(r["config"])
    rows = r["kept_rows"] + cfg.shared_experts * cfg.tokens * cfg.ranks
    return 2.0 * rows * cfg.hidden * (ffn_in_width(cfg) + cfg.ffn)


# where a summary's meta keeps each measured matmul ceiling (TFLOP/s a GPU)
CEILING_KEYS = {"float32": "fp32_ceiling_tflops", "bfloat16": "bf16_ceiling_tflops", "tf32": "tf32_ceiling_tflops"}


def ceilings_of(meta: dict) -> dict[str, float]:
    """The ceilings a run's meta recorded, by GEMM precision: tf32x3's is float32's, the ceiling of
    its dtype at its accuracy (summaries from before the tf32 ceiling lack it)."""
    out = {dt: meta[key] for dt, key in CEILING_KEYS.items() if key in meta}
    out["tf32x3"] = out["float32"]
    return out


def weights_bound(r: dict, ceiling: float, gbps: float) -> float:
    """The GEMM phase's best share (%) of `ceiling` (TFLOP/s a GPU) at the memory rate `gbps`
    (sim.metrics.weights_roofline): under 60 the bar on the GEMM phase cannot hold at that point."""
    return metrics.weights_roofline(Config.from_dict(r["config"]), r["kept_rows"], ceiling, gbps)


# the matrix's guess of a run's time (matrix_point_seconds, matrix_plan), from each point's roofline at the H100's
# datasheet rates: the kernel at KERNEL_OVER_ROOFLINE times it, the torch layers at TORCH_OVER_ROOFLINE
# times it plus TORCH_FIXED_MS (the host's read of the counts, the launches), the per-expert loop
# LOOP_MS_PER_EXPERT more an expert; POINT_SECONDS to set a point up, SPAWN_SECONDS (and
# SPAWN_SECONDS_PER_GPU a process) to start the processes of a GPU count, CEILINGS_SECONDS to
# measure the rates. One H100, six points of Qwen3-30B-A3B's and gpt-oss-120b's twins at 1K and 4K
# tokens, bf16 and tf32x3: 0.9-2.1 s a point, 21 s the run
KERNEL_OVER_ROOFLINE, TORCH_OVER_ROOFLINE, TORCH_FIXED_MS, LOOP_MS_PER_EXPERT = 3.0, 3.0, 1.0, 0.03
POINT_SECONDS, SPAWN_SECONDS, SPAWN_SECONDS_PER_GPU, CEILINGS_SECONDS = 1.0, 8.0, 4.0, 6.0
MEMORY_SHARE = 0.85  # of a GPU's memory a point may plan to take
H100_GB = 80.0  # the mission's GPU: the plans' memory where this machine has no GPU


def local_gpu_gb() -> float | None:
    """The first GPU's memory in GB (nvidia-smi), or None where there is none."""
    mib = command_output(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]).split()
    return float(mib[0]) * 2**20 / 1e9 if mib else None


def matrix_bytes(cfg: Config, kernel: bool = True) -> int:
    """Device memory one GPU takes for a matrix point, at least: the kernel layer's heap, working
    buffers and weight copies (gpu.layout.layer_bytes; not for a torch-only point), its local and shared
    experts' weights (float32 too for a torch-only point, as drawn) and the dropless torch layer's rows
    (k T rows of H six times, of I' twice). The padded layer is measured against the free memory by the
    worker."""
    eb = Sizes.of(cfg).elem_bytes
    per_expert = cfg.hidden * (ffn_in_width(cfg) + cfg.ffn)
    weights = (cfg.local_experts + cfg.shared_experts) * per_expert * (eb if kernel else eb + 4)
    rows = cfg.tokens * cfg.top_k * (6 * cfg.hidden + 2 * ffn_in_width(cfg)) * eb
    return (layer_bytes(cfg) if kernel else 0) + weights + rows


def matrix_skip(cfg: Config, gpu_gb: float, kernel: bool = True) -> str | None:
    """Why the matrix does not run a point (None: it runs): the kernel does not support it, or it
    does not fit a GPU of `gpu_gb` GB (a torch-only point (kernel false): only the last)."""
    if kernel:
        try:
            check_supported(cfg)
        except UnsupportedConfig as e:
            return f"not in the kernel: {e}"
    need = matrix_bytes(cfg, kernel)
    if need > MEMORY_SHARE * gpu_gb * 1e9:
        return f"needs {need / 1e9:.0f} GB a GPU, more than {MEMORY_SHARE:.0%} of {gpu_gb:g} GB"
    return None


def matrix_point_seconds(cfg: Config, gpu_gb: float, kernel: bool = True, hw_name: str = "h100-sxm",
                         torch_layers: bool = True) -> float:
    """The guess of one matrix point's time (see KERNEL_OVER_ROOFLINE): 13 timed and warm-up
    launches with and without telemetry and four more (none for a torch-only point), 14 calls of
    each torch layer and of the dropless one's experts alone, at most its time (with `torch_layers`;
    else one call of the dropless one, the point's check)."""
    hw = hardware.get(hw_name)
    even = [[cfg.tokens * cfg.top_k // cfg.experts] * cfg.experts] * cfg.ranks
    roof = metrics.layer_roofline(cfg, even, hw.tflops(cfg.precision), hw.hbm_gbps, hw.nvlink_gbps)["ms"]
    torch_ms = TORCH_OVER_ROOFLINE * roof + TORCH_FIXED_MS
    dt = "bfloat16" if cfg.dtype == "bfloat16" else "float32"
    padded = 0.0
    if padded_bytes(cfg, dt) < MEMORY_SHARE * gpu_gb * 1e9 - matrix_bytes(cfg, kernel):
        padded = TORCH_OVER_ROOFLINE * roof * cfg.experts * cfg.slots / max(1, cfg.tokens * cfg.top_k)
    torch_part = 14 * (3 * torch_ms + cfg.local_experts * LOOP_MS_PER_EXPERT + padded) if torch_layers else torch_ms
    ms = 30 * KERNEL_OVER_ROOFLINE * roof * kernel + torch_part
    return POINT_SECONDS + ms / 1e3


def matrix_plan(gpus: list[int], dtypes: list[str], layers: list[str], tokens: list[int], flashmoe: bool,
                gpu_gb: float, torch_models: bool = True) -> tuple[dict[int, list[dict]], list[dict], float]:
    """The matrix's cases per GPU count (gpu.cases.matrix_cases), the points it skips (results with
    `skipped`) and the guess of the whole run's seconds."""
    cases, skipped, seconds = {}, [], CEILINGS_SECONDS
    for p in gpus:
        cases[p] = []
        for dt in dtypes:
            for c in matrix_cases(p, dt, layers, tokens, flashmoe, torch_models):
                cfg, kernel = Config.from_dict(c["config"]), not c.get("torch_only")
                why = matrix_skip(cfg, gpu_gb, kernel)
                if why:
                    skipped.append({"name": c["name"], "config": c["config"], "skipped": why})
                else:
                    cases[p].append(c)
                    seconds += matrix_point_seconds(cfg, gpu_gb, kernel)
        seconds += SPAWN_SECONDS + SPAWN_SECONDS_PER_GPU * p if cases[p] else 0.0
    return cases, skipped, seconds


# ZOO_CASE_SECONDS a zoo check beyond its golden (the draw, the layer, one launch, the gathers),
# ZOO_GOLDEN_NS one host thread's nanoseconds per streamed expert weight and golden path (the copy
# off the GPU, the conversions, the product of the sampled rows; 25-30 on this project's loaded
# 2-core CI machine, DeepSeek-V3's experts): guesses until a device run measures them
ZOO_CASE_SECONDS, ZOO_GOLDEN_NS = 2.0, 8.0


def zoo_check_seconds(cfg: Config, samples: int) -> float:
    """The guess of one zoo check's time (gpu.worker.run_zoo_check): its fixed part, and the golden
    of the slowest rank, which streams its experts that the P x samples sampled tokens' k choices
    hit (expected, routes spread evenly) and its shared ones, once per golden path, in
    ZOO_GOLDEN_THREADS threads (the GPU machines have 16 cores a GPU)."""
    draws = cfg.ranks * min(samples, cfg.tokens) * cfg.top_k
    streamed = cfg.local_experts * (1 - (1 - 1 / cfg.experts) ** draws) + cfg.shared_experts
    paths = 2 if cfg.dtype == "bfloat16" else 1
    weights = cfg.hidden * (ffn_in_width(cfg) + cfg.ffn)
    return ZOO_CASE_SECONDS + streamed * weights * paths * ZOO_GOLDEN_NS / 1e9 / ZOO_GOLDEN_THREADS


def zoo_case_seconds(case: dict, gpu_gb: float, samples: int) -> float:
    """The guess of a zoo suite case's time: a check's (zoo_check_seconds; none where it is skipped),
    or a traced point's (matrix_point_seconds without the torch layers' timing)."""
    cfg = Config.from_dict(case["config"])
    if case.get("skip"):
        return 0.0
    if "zoo_samples" in case:
        return zoo_check_seconds(cfg, samples)
    return matrix_point_seconds(cfg, gpu_gb, torch_layers=False)


def zoo_plan(gpus: list[int], suites: list[str], prefix: str, seed: int, gpu_gb: float, samples: int,
             models: list[str]) -> tuple[dict[int, list[dict]], list[dict], float]:
    """The zoo suites' cases of `models` per GPU count (`zoo`: gpu.cases.zoo_check_cases, the worker skipping
    those past the GPUs' free memory; `zootrace`: zoo_trace_cases, those matrix_skip refuses left out
    here), the cases left out (results with `skipped`) and the guess of the whole run's seconds."""
    cases, skipped, seconds = {}, [], 0.0
    for p in gpus:
        cases[p] = zoo_check_cases(p, seed, samples, models) if "zoo" in suites else []
        for c in zoo_trace_cases(p, prefix, models) if "zootrace" in suites else []:
            why = c.get("skip") or matrix_skip(Config.from_dict(c["config"]), gpu_gb)
            if why:
                skipped.append({"name": c["name"], "config": c["config"], "skipped": why})
            else:
                cases[p].append(c)
        seconds += sum(zoo_case_seconds(c, gpu_gb, samples) for c in cases[p])
        seconds += SPAWN_SECONDS + SPAWN_SECONDS_PER_GPU * p if cases[p] else 0.0
    return cases, skipped, seconds


def zoo_line(r: dict) -> str:
    """One zoo check's result in a line: its errors against float64 and against the golden of its
    precision, its routing, its seconds; or why it did not run, or failed."""
    if "skipped" in r or "failed" in r:
        return f"{r['name']}: {'skipped: ' + r['skipped'] if 'skipped' in r else 'FAILED: ' + r['failed']}"
    f64 = r.get("rel_err_float64", r["rel_err"])
    own = f", vs {r['golden_path']} golden {r['rel_err']:.2e}" if "rel_err_float64" in r else ""
    routing = "routing equal" if r["routing_equal"] and r["counts_equal"] else "ROUTING DIFFERS"
    return (f"{r['name']}: rel err vs float64 {f64:.2e}{own}, {routing}, {r['seconds']:.1f} s "
            f"({r['samples']} tokens, {r['experts_streamed']} experts streamed, golden {r['golden_seconds']:.1f} s)")


def zoo_failed(r: dict) -> bool:
    """A zoo check that ran and missed: its routing, NaN left, or its precision's tolerance."""
    if "skipped" in r:
        return False
    if "failed" in r:
        return True
    precision = Config.from_dict(r["config"]).precision
    return not (r["routing_equal"] and r["counts_equal"] and not r["nan"]
                and r["rel_err"] < GOLDEN_TOLERANCE[precision]
                and r.get("rel_err_float64", 0.0) < GOLDEN_TOLERANCE["bfloat16"])


def disagrees_with_torch(r: dict) -> bool:
    """A timed point whose output is off the torch layer's by more than bf16's golden tolerance, in
    any precision: a wrong sum, not rounding (the validation suite checks against nothing else)."""
    return r.get("vs_baseline_rel_err", 0.0) > GOLDEN_TOLERANCE["bfloat16"]


def compact(results: list[dict], meta: dict) -> list[dict]:
    """Results without the per-iteration times, profiles, tracebacks and the run's meta they repeat:
    the matrix's committed JSON."""
    def kept(k, v):
        return not k.endswith(("_all", "_profile")) and k != "traceback" and not (k in meta and meta[k] == v)

    return [{k: v for k, v in r.items() if kept(k, v)} for r in results]


def roofline_share(gemm_pct: float, bound_pct: float) -> float:
    """The GEMM phase (% of the ceiling) as a share (%) of the most that point allows: the ceiling,
    or the weights' bound where that is lower (weights_bound)."""
    return 100 * gemm_pct / min(100.0, bound_pct)


TABLE_HEAD = ("point", "precision", "GPUs", "T/rank", "E", "k", "kernel ms", "dropless torch ms", "padded torch ms",
              "loop torch ms", "speedup", "roofline ms", "bound", "kernel / roofline", "torch experts alone ms",
              "kernel / torch experts", "TFLOP/s", "% ceil",
              "GEMM phase % ceil", "weights' bound % ceil", "GEMM phase % roofline", "SM util %",
              "overlap eff T(2)/T(N)", "telemetry +%", "rel err vs torch")


def torch_ms(r: dict, kind: str) -> float | str:
    """A point's time of the torch layer of `kind` in its precision (gpu.baseline.KINDS, or "experts":
    the dropless layer's expert FFNs alone): blank where the run did not time it, the reason where
    it skipped it."""
    dt = baseline_precision(Config.from_dict(r["config"]))
    key = f"torch_{dt}" if kind == "padded" else f"torch_{kind}_{dt}"
    return r.get(f"{key}_ms", r.get(f"{key}_skipped", ""))


def speedup(r: dict) -> float:
    """Torch's time over the kernel's: the fastest torch layer the run timed (dropless with a grouped
    GEMM or one matmul per expert, or padded, which wins at small T and few experts a GPU), the one a
    user would pick."""
    times = [t for t in (torch_ms(r, k) for k in ("dropless", "loop", "padded")) if isinstance(t, float)]
    return min(times) / r["kernel_ms"] if times else 0.0


def roofline_tflops(precision: str, ceilings: dict[str, float]) -> float:
    """The matmul ceiling of a GEMM precision for the roofline: tf32x3's is the faster way to
    float32's accuracy, float32's ceiling or a third of TF32's (three TF32 products a product)."""
    if precision == "tf32x3" and "tf32" in ceilings:
        return max(ceilings["float32"], ceilings["tf32"] / 3)
    return ceilings[precision]


def roofline(r: dict, ceilings: dict[str, float], gbps: float | None, nvlink: float | None) -> dict | None:
    """The point's roofline (sim.metrics.layer_roofline) at the run's measured rates; None where the
    result has no send counts (runs from before them), no memory rate, or moves NVLink bytes no
    rate was measured for."""
    cfg = Config.from_dict(r["config"])
    if "send_counts" not in r or gbps is None:
        return None
    try:
        return metrics.layer_roofline(cfg, r["send_counts"], roofline_tflops(cfg.precision, ceilings), gbps,
                                      nvlink)
    except ValueError:
        return None


def table_rows(all_results: list[dict], ceilings: dict[str, float], gbps: float | None = None,
               nvlink: float | None = None) -> list[tuple]:
    """One row (TABLE_HEAD) per bench point: the kernel against the torch layers of its own dtype
    (dropless, padded, dropless with one matmul per expert; `speedup` over the faster dropless one), its
    roofline (roofline(), at the memory rate `gbps` and NVLink rate `nvlink`; blank without) and the
    kernel's time over it, the dropless layer's expert FFNs alone on the rows it routes (its GEMMs at
    torch's grouped GEMM's rate: the fair bound where that rate is below the ceiling, as for
    fine-grained experts) and the kernel's time over theirs, its rate as a share of that dtype's
    ceiling, the GEMM phase's rate (GEMM FLOPs over the GEMM task time per processor block, from
    telemetry) as a share of it, the most
    the GPUs' memory allows it (weights_bound, at `gbps`; blank without) and the GEMM phase's share
    of the lesser of that and the ceiling (roofline_share), and FlashMoE's overlap efficiency
    T(2) / T(N) (sim.metrics.overlap_efficiency) where this run has the point on 2 GPUs too. A point
    the run skipped (result with `skipped`) gets its reason in the kernel's column."""
    def precision(r):
        return Config.from_dict(r["config"]).precision

    on_two = {(r["config"]["name"], precision(r)): r["kernel_ms"]
              for r in all_results if "kernel_ms" in r and r["config"]["ranks"] == 2}
    rows = []
    for r in all_results:
        c = r.get("config", {})
        if "skipped" in r:
            rows.append((r["name"], precision(r), c["ranks"], c["tokens"], c["experts"], c["top_k"],
                         f"skipped: {r['skipped']}", *[""] * (len(TABLE_HEAD) - 7)))
            continue
        if "kernel_skipped" in r:  # a layer the kernel does not run: the torch layers and the roofline
            roof = roofline(r, ceilings, gbps, nvlink)
            rows.append((r["name"], precision(r), c["ranks"], c["tokens"], c["experts"], c["top_k"],
                         r["kernel_skipped"], torch_ms(r, "dropless"), torch_ms(r, "padded"), torch_ms(r, "loop"), "",
                         "" if roof is None else roof["ms"], "" if roof is None else roof["bound"], "",
                         torch_ms(r, "experts"), *[""] * (len(TABLE_HEAD) - 15)))
            continue
        if "kernel_ms" not in r:
            continue
        dt = precision(r)
        ceil = ceilings[dt] * c["ranks"]
        tf = flops(r) / (r["kernel_ms"] * 1e-3) / 1e12
        gemm_tf = flops(r) / (r["gemm_ms_per_proc"] * 1e-3) / 1e12 if r.get("gemm_ms_per_proc") else 0.0
        two = on_two.get((c["name"], dt))
        gemm_pct, bound = 100 * gemm_tf / ceil, None if gbps is None else weights_bound(r, ceilings[dt], gbps)
        roof = roofline(r, ceilings, gbps, nvlink)
        experts = torch_ms(r, "experts")
        rows.append((r["name"], dt, c["ranks"], c["tokens"], c["experts"], c["top_k"], r["kernel_ms"],
                     torch_ms(r, "dropless"), torch_ms(r, "padded"), torch_ms(r, "loop"), speedup(r),
                     "" if roof is None else roof["ms"], "" if roof is None else roof["bound"],
                     "" if roof is None else r["kernel_ms"] / roof["ms"], experts,
                     r["kernel_ms"] / experts if isinstance(experts, float) else "", tf, 100 * tf / ceil, gemm_pct,
                     "" if bound is None else bound, "" if bound is None else roofline_share(gemm_pct, bound),
                     100 * r.get("sm_utilization", 0.0),
                     "" if two is None else metrics.overlap_efficiency(two, r["kernel_ms"]),
                     100 * (r["kernel_telemetry_ms"] / r["kernel_ms"] - 1), r.get("vs_baseline_rel_err", -1.0)))
    return rows


def table(all_results: list[dict], ceilings: dict[str, float], gbps: float | None = None,
          nvlink: float | None = None) -> str:
    return format_table(TABLE_HEAD, table_rows(all_results, ceilings, gbps, nvlink))


def ceiling_text(ceilings: dict[str, float]) -> str:
    return ", ".join(f"{dt} {t:.1f}" for dt, t in ceilings.items()) + " TFLOP/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1])
    ap.add_argument("--suite", nargs="+", default=["checks"], choices=["checks", "bench", "sitout", "matrix",
                                                                          "validate", "zoo", "zootrace"])
    ap.add_argument("--zoo-samples", type=int, default=ZOO_CHECK_SAMPLES, metavar="N",
                    help="tokens of each rank the zoo checks hold to the golden")
    ap.add_argument("--layers", nargs="+", default=[*presets.ZOO, "flashmoe"], choices=[*presets.ZOO, "flashmoe"],
                    help="the matrix's layers: zoo models (reference.presets.ZOO; their kernel twins, "
                         "gpu.cases.kernel_twin, where the kernel lacks what they need) and FlashMoE's token and "
                         "expert sweeps; the zoo suites' models")
    ap.add_argument("--tokens", nargs="+", type=int, default=list(MATRIX_TOKENS),
                    help="the matrix's tokens per GPU of the zoo models")
    ap.add_argument("--gpu-gb", type=float, default=None, help="memory of one GPU: the matrix skips points that "
                    f"would take more than {MEMORY_SHARE * 100:.0f}%% of it (default: this machine's first GPU's, "
                    f"else an H100's {H100_GB:g} GB)")
    ap.add_argument("--no-torch-models", action="store_true", help="leave out the matrix's torch-only points: "
                    "the zoo models the kernel runs as twins, timed in torch as they are")
    ap.add_argument("--estimate", action="store_true", help="print the matrix's points, what it skips and the "
                    "guess of its time, and stop (no GPU needed)")
    ap.add_argument("--compact", type=Path, metavar="FILE.json", help="also write the run as one compact JSON "
                    "(no per-iteration times, profiles) and its table beside it (FILE.txt)")
    ap.add_argument("--points", default="sweep", choices=["default", "sweep", "tiles"])
    ap.add_argument("--out", default="artifacts/gpu")
    ap.add_argument("--timeout", type=float, default=560.0, help="wall-clock limit per GPU count, seconds")
    ap.add_argument("--prefix", default="", help="prefix of the trace files' names (e.g. h200x4-)")
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(PRECISIONS),
                    help="kernels to bench (and, with bfloat16, tf32 or tf32x3, to check)")
    ap.add_argument("--untraced", nargs="*", default=[], choices=list(PRECISIONS),
                    help="dtypes whose bench points keep no telemetry trace")
    ap.add_argument("--dispatch", default="staged", choices=DISPATCH_PATHS,
                    help="how tiles move between GPUs: stores into the peer's memory where it is load/store "
                         "reachable, the peers' chunks sent by a few blocks one local expert after another "
                         "(staged, the kernel's default) or every chunk shared by all blocks at once (store: "
                         "names end in -store), or one put per tile (dispatched by one block, returned by "
                         "GEMM1's last task: names end in -put, untraced)")
    ap.add_argument("--staged-blocks", type=int, metavar="N",
                    help="with the staged dispatch, send the peers' chunks from N processors instead of the "
                         "kernel's 32: names end in -sendersN, untraced")
    ap.add_argument("--tile", type=tile_shape, help="run every bench point at this tile shape, MxNxK (e.g. "
                    "128x256x64), instead of its precision's bench tile: names gain -tileMxNxK")
    ap.add_argument("--apart", action="store_true", help="run only the points whose tiles merging sources changes, "
                    "each source's rows in tiles of their own (merge_sources false): names end in -apart")
    args = ap.parse_args()
    args.gpu_gb = args.gpu_gb or local_gpu_gb() or H100_GB
    if args.staged_blocks is not None and (args.staged_blocks < 1 or args.dispatch != "staged"):
        ap.error(f"--staged-blocks {args.staged_blocks}: a positive number of processors, with --dispatch staged")
    if args.tile:
        for dt in args.dtypes:
            try:
                check_supported(in_dtype(presets.get("flashmoe"), dt).replace(
                    tile_m=args.tile[0], tile_n=args.tile[1], tile_k=args.tile[2]))
            except (UnsupportedConfig, ConfigError) as e:
                ap.error(f"--tile {'x'.join(map(str, args.tile))} for {dt}: {e}")
    mplan, mskipped = {}, []
    if "matrix" in args.suite:
        layers = [x for x in args.layers if x != "flashmoe"]
        mplan, mskipped, guess = matrix_plan(args.gpus, args.dtypes, layers, args.tokens, "flashmoe" in args.layers,
                                             args.gpu_gb, not args.no_torch_models)
        print(f"matrix: {sum(map(len, mplan.values()))} points on {args.gpus} GPU(s), {len(mskipped)} skipped; "
              f"about {guess:.0f} s (a guess from the roofline at H100 datasheet rates)", flush=True)
        if args.estimate:
            guesses = [(c["name"], matrix_point_seconds(Config.from_dict(c["config"]), args.gpu_gb,
                                                        not c.get("torch_only"))) for p in args.gpus for c in mplan[p]]
            rows = [(name, f"{seconds:.1f}") for name, seconds in guesses]
            print(format_table(("point", "guess s"), rows + [(r["name"], r["skipped"]) for r in mskipped]))
            return 0
    if args.zoo_samples < 1:
        ap.error(f"--zoo-samples {args.zoo_samples}: a positive number of tokens per rank")
    seed = int.from_bytes(os.urandom(4), "little")
    zplan, zskipped = {}, []
    if {"zoo", "zootrace"} & set(args.suite):
        zplan, zskipped, guess = zoo_plan(args.gpus, args.suite, args.prefix, seed, args.gpu_gb, args.zoo_samples,
                                          [x for x in args.layers if x != "flashmoe"])
        print(f"zoo: {sum(map(len, zplan.values()))} cases on {args.gpus} GPU(s), {len(zskipped)} left out; about "
              f"{guess:.0f} s (a guess)", flush=True)
        if args.estimate:
            rows = [(c["name"], c.get("skip") or f"{zoo_case_seconds(c, args.gpu_gb, args.zoo_samples):.1f}")
                    for p in args.gpus for c in zplan[p]]
            print(format_table(("case", "guess s"), rows + [(r["name"], r["skipped"]) for r in zskipped]))
            return 0
    why = spawn.unmet(max(args.gpus))
    if why:
        ap.error(why)
    t0 = time.monotonic()
    meta = run_meta(shlex.join(["python3", *sys.argv]))
    ceilings, gbps, nvlink = {}, None, None
    if set(args.suite) != {"zoo"}:  # the zoo checks time nothing
        for dt, key in CEILING_KEYS.items():
            meta[key] = ceiling_tflops(dt)
        ceilings = ceilings_of(meta)
        meta["memory_gbps"] = gbps = memory_gbps()
        meta["nvlink_gbps"] = nvlink = nvlink_gbps(max(args.gpus))
        print(f"measured matmul ceilings per GPU: {ceiling_text(ceilings)}; memory {gbps:.0f} GB/s; NVLink of one "
              f"GPU to its peers {'-' if nvlink is None else f'{nvlink:.0f}'} GB/s", flush=True)
    meta["seed"] = seed
    everything = []
    for p in args.gpus:
        cases = []
        if "checks" in args.suite:
            cases += check_cases(p, seed, args.prefix)
            if "bfloat16" in args.dtypes:
                cases += bf16_check_cases(p, seed)
            if "tf32" in args.dtypes:
                cases += tf32_check_cases(p, seed)
            if "tf32x3" in args.dtypes:
                cases += tf32x3_check_cases(p, seed)
        if "bench" in args.suite:
            for dt in args.dtypes:
                cases += bench_cases(p, args.points, args.prefix, dt, trace=dt not in args.untraced,
                                     dispatch=args.dispatch, tile=args.tile, staged_blocks=args.staged_blocks,
                                     apart=args.apart)
        if "validate" in args.suite:
            runs, refused = validation_cases(p, args.prefix)
            cases += runs
            for name, why in refused:
                print(f"gpus={p}: {name} not run: {why}", flush=True)
        if "sitout" in args.suite and p > 1:
            cases.append(sit_out_case(p))
        cases += mplan.get(p, []) + zplan.get(p, [])
        for c in cases:
            c["meta"] = meta
        out = Path(args.out) / f"gpus-{p}"
        left = args.timeout - (time.monotonic() - t0)
        try:
            results = spawn.run(cases, p, out, timeout_s=max(left, 30))
        except spawn.SpawnError as e:
            print(f"gpus={p}: {e}", flush=True)
            results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else []
        everything += results
    everything += mskipped + zskipped
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps({"meta": meta, "results": everything},
                                                            separators=(",", ":"), default=str))
    for r in everything:
        if "failed" in r:
            print(r["name"], "FAILED:", r["failed"], flush=True)
    checks = [r for r in everything if r["name"].startswith(("check", "sit"))]
    for r in checks:
        keys = ("routing_equal", "counts_equal", "weight_max_abs_err", "rel_err", "golden_path", "rel_err_float64",
                "dropped", "nan",
                "telemetry_same_output", "sm_utilization", "raised", "seconds_to_raise", "error", "failed")
        print(r["name"], {k: r[k] for k in keys if k in r}, flush=True)
    zoo = [r for r in everything if r["name"].startswith("zoo-")]
    for r in zoo:
        print(zoo_line(r), flush=True)
    print(f"commit {meta['commit']}, {', '.join(meta['gpus_seen'])}, driver {meta['driver']}"
          + (f", ceilings per GPU: {ceiling_text(ceilings)}, memory {gbps:.0f} GB/s, NVLink {nvlink or '-'} GB/s"
             if ceilings else ""))
    text = table([r for r in everything if r not in zoo], ceilings, gbps, nvlink) if ceilings else ""
    print(text)
    if args.compact:
        args.compact.parent.mkdir(parents=True, exist_ok=True)
        args.compact.write_text(json.dumps({"meta": meta, "results": compact(everything, meta)}, default=str) + "\n")
        args.compact.with_suffix(".txt").write_text(text + "\n")
    failed = [r["name"] for r in zoo if zoo_failed(r)]
    if failed:
        print(f"{len(failed)} zoo check(s) missed: {', '.join(failed)}", flush=True)
    off = [f"{r['name']} ({r['vs_baseline_rel_err']:.3g})" for r in everything if disagrees_with_torch(r)]
    if off:
        print(f"{len(off)} point(s) disagree with the torch layer: {', '.join(off)}", flush=True)
    return 1 if failed or off else 0


if __name__ == "__main__":
    sys.exit(main())
