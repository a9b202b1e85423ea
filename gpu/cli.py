"""`moelab gpu`: run the megakernel on N local GPUs (one process each), check it, time it, trace it."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from reference.cli import (
    Progress,
    add_config_args,
    config_from_args,
    format_table,
    non_negative_int,
    path_ending,
    positive_float,
    positive_int,
)
from reference.files import FileError, check_output


def cmd_gpu(args: argparse.Namespace) -> int:
    from . import cases, layout, provenance, spawn

    if args.trace:  # before the build and launch: a bad path fails now, not after them
        check_output(args.trace)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise FileError(args.out, "is a file", "a folder for the workers' results (--out DIR)")
    cfg = config_from_args(args)
    layout.check_supported(cfg)
    if args.gpus is None:
        args.gpus = cfg.ranks
    progress = Progress(not args.quiet)
    case = {"name": cfg.name, "config": cfg.to_dict(), "inputs": args.inputs, "seed": cfg.seed,
            "golden": args.check and args.inputs == "reference", "baseline_check": args.check,
            # torch layers of the kernel's GEMM precision first (a float32 layer of bf16 tokens is no baseline)
            "bench": args.bench, "baselines": list(cases.PRECISIONS[cfg.precision][2]),
            "warmup": args.warmup, "iters": args.iters,
            "trace": "trace.npz" if args.trace else None, "timeout_ms": args.timeout_ms}
    why = spawn.unmet(args.gpus)
    if why:
        print(f"moelab gpu: error: {why}", file=sys.stderr)
        return 2
    # the trace names its kernel and command, as the benchmarks' do (a committed run is matched by them)
    case["meta"] = provenance.run_meta(shlex.join(["moelab", *args.argv]))
    progress(f"{cfg.name} on {args.gpus} GPU(s): spawning the workers")
    results = spawn.run([case], args.gpus, args.out, timeout_s=args.wall_timeout, echo=not args.quiet)
    res = results[0]
    if args.trace and "trace" in res:
        from sim.trace import Trace

        trace = Trace.load(f"{args.out}/trace.npz")
        trace.save(args.trace)
        progress(f"trace written to {args.trace} ({len(trace)} events)")
    if args.json:
        print(json.dumps(res, indent=2, default=str))
    else:
        keys = ("failed", "routing_equal", "counts_equal", "golden_path", "rel_err", "rel_err_float64",
                "vs_baseline_rel_err", "dropped", "telemetry_same_output", "sm_utilization", "kernel_ms",
                "kernel_telemetry_ms", *(f"torch_{kind}{dt}_ms" for kind in ("dropless_", "experts_", "loop_", "")
                                           for dt in ("float32", "tf32", "bfloat16")), "grid")
        print(format_table(("quantity", "value"), [(k, res[k]) for k in keys if k in res]))
    tolerance = cases.GOLDEN_TOLERANCE[cfg.precision]
    bad = "failed" in res or (args.check and (res.get("rel_err", 0.0) > tolerance or res.get("routing_equal") is False))
    return 1 if bad else 0


def register(sub) -> None:
    p = sub.add_parser("gpu", help="run the CUDA megakernel on local GPUs",
                       description="Build (cached), launch and check the megakernel of the config's precision "
                                   "(float32; tf32, the TF32 tensor-core kernel; tf32x3, the split TF32 one at "
                                   "float32's accuracy; or bfloat16, the bf16 tensor-core kernel) on N GPUs of this "
                                   "host, one process each; optionally time it against the torch layer and save "
                                   "its telemetry trace.",
                       epilog="exit status: 0 done (with --check: within the golden's tolerance), 1 a worker "
                              "failed or --check found a mismatch, 2 a bad option or config, or GPUs missing.")
    add_config_args(p)
    p.add_argument("--check", action="store_true",
                   help="compare with the golden (reference inputs; float64, the bf16-emulated path for "
                        "bfloat16, the tf32 path for tf32; float64 for tf32x3) and the torch layer")
    p.add_argument("--bench", action="store_true", help="time kernel and torch layer (CUDA events, median)")
    p.add_argument("--trace", metavar="OUT.npz|OUT.json", type=path_ending(".npz", ".json"),
                   help="save the kernel's telemetry trace (.npz, or Perfetto .json)")
    p.add_argument("--inputs", choices=["reference", "random"], default="reference",
                   help="the reference's seeded inputs (drawn on the CPU) or random ones drawn on the GPU")
    p.add_argument("--warmup", type=non_negative_int, default=3, metavar="N",
                   help="untimed launches before --bench times (default: 3)")
    p.add_argument("--iters", type=positive_int, default=20, metavar="N",
                   help="timed launches of --bench; the median is reported (default: 20)")
    p.add_argument("--timeout-ms", type=positive_float, default=5000.0, metavar="MS",
                   help="the kernel's bound on every wait, ms: a hung wait fails the run (default: 5000)")
    p.add_argument("--wall-timeout", type=positive_float, default=900.0, metavar="S",
                   help="kill the workers after this many seconds (default: 900)")
    p.add_argument("--out", default="artifacts/gpu-cli", metavar="DIR",
                   help="folder for the workers' results, made if missing (default: artifacts/gpu-cli)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress messages or worker output")
    p.set_defaults(func=cmd_gpu)
