"""`moelab compare`: one measured run against its prediction, or every committed run as a table
(`--all`), optionally written as docs/validation.md (`--markdown`), or the validation set's runs and
the bars they are held to (`--validation`: exits 1 until they are met, unless `--no-fail`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from reference import ConfigError
from reference.budget import format_seconds
from reference.cli import path_ending
from reference.files import FileError, check_output

from . import compare as cmp
from . import heldout, validation
from .calibrate import CalibrationError
from .hardware import HardwareError


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        for name in ("trace", "png", "markdown"):  # before the work: a bad path fails now, not after it
            if getattr(args, name):
                check_output(getattr(args, name))
        if args.markdown and not args.all:
            raise cmp.CompareError("markdown", args.markdown, "given with --all (the table of every run)")
        if args.all and args.measured:
            raise cmp.CompareError("measured", args.measured, "not given with --all")
        if args.validation and (args.all or args.measured):
            raise cmp.CompareError("validation", True, "not given with --all or --measured (it compares the "
                                   "validation set's runs)")
        if args.all or args.validation:
            return _all(args)
        if not args.measured:
            raise cmp.CompareError("measured", None, "a measured-run file (--measured FILE) or --all")
        return _one(args)
    except (cmp.CompareError, CalibrationError, HardwareError, ConfigError, FileError) as e:
        print(f"moelab compare: error: {e}", file=sys.stderr)
        return 2


def _status(args, comparisons: list) -> int:
    """1 where a run missed a bound (unless --no-fail), after saying which."""
    missed = [c for c in comparisons if not c.ok]
    for c in missed:
        print(f"moelab compare: {c.run.name} misses a bound: "
              + ", ".join(r[0] for r in c.rows if r[5] is False), file=sys.stderr)
    return 1 if missed and not args.no_fail else 0


def _one(args) -> int:
    run = cmp.load_measured(args.measured)
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"simulating {run.config.name} on {run.config.ranks} GPU(s) with "
        f"{args.hardware or cmp.calibrated_for(run)}")
    c = cmp.compare(run, args.hardware, runs=cmp.measured_runs(Path(args.measured).resolve().parent))
    if args.json:
        doc = {"measured": str(run.path), "hardware": c.hardware.name, "routing": run.routing,
               "rows": [dict(zip(("quantity", "predicted", "measured", "error", "bound", "ok"), r)) for r in c.rows]}
        if args.tasks:
            doc["tasks"] = cmp.tasks(c)
        print(json.dumps(doc, indent=2))
    else:
        print(cmp.table(c))
        if args.tasks:
            print(cmp.task_table(c))
    if args.trace:
        say(f"writing {args.trace}")
        Path(args.trace).write_text(json.dumps(cmp.perfetto(c)))
    if args.png:
        say(f"drawing {args.png}")
        cmp.picture(c, args.png)
    return _status(args, [c])


def _all(args) -> int:
    runs = cmp.measured_runs()
    compared = [r for r in runs if heldout.is_validation(r)] if args.validation else runs
    if args.validation and not compared:
        print("moelab compare: no validation layer is measured (benchmarks/device_run.sh ... validate)",
              file=sys.stderr)
        return 0 if args.no_fail else 1
    if not runs:
        raise cmp.CompareError("measured", str(cmp.MEASUREMENTS / "gpu"), "a folder holding measured runs")
    predict = cmp.Predictor()
    comparisons = []
    t0 = time.perf_counter()
    for i, run in enumerate(compared, 1):
        if not args.quiet:  # the time left at the pace so far
            left = f", about {format_seconds((time.perf_counter() - t0) / (i - 1) * (len(compared) - i + 1))} left" \
                if i > 1 else ""
            print(f"[{i}/{len(compared)}] {run.name}{left}", file=sys.stderr, flush=True)
        comparisons.append(cmp.compare(run, args.hardware, runs=runs, predict=predict))
    if args.markdown:
        Path(args.markdown).write_text(validation.markdown(comparisons))
        print(f"wrote {args.markdown}")
    for c in comparisons:
        print(cmp.table(c) + ("\n" + cmp.task_table(c) if args.tasks else "") + "\n")
    if args.validation:
        verdicts = heldout.bars(comparisons)
        for b in verdicts:
            print(b.text())
        return 0 if args.no_fail or all(b.ok for b in verdicts) else 1
    return _status(args, comparisons)


def register(sub) -> None:
    p = sub.add_parser("compare", help="predicted vs measured: a committed GPU run against the calibrated simulator",
                       description="Simulate a measured run's config with the preset calibrated on that GPU's "
                                   "microbenchmarks and print predicted vs measured layer latency, per-phase busy "
                                   "time, SM utilization and overlap efficiency with their errors and bounds.",
                       epilog="exit status: 0 every run within its bounds, 1 a run missed a bound (0 with "
                              "--no-fail), 2 a bad option or file (an empty trace, or one with NaN or inf "
                              "times, is refused, not compared).")
    p.add_argument("--measured", metavar="FILE", help="a measured run: a telemetry trace .npz under measurements/gpu/ "
                                                      "or a benchmark summary .json naming one")
    p.add_argument("--all", action="store_true", help="every committed measured run under measurements/gpu/")
    p.add_argument("--hardware", metavar="FILE", help="a calibrated preset .json (default: "
                                                      "measurements/calibrated-<gpu>.json of the run's GPU)")
    p.add_argument("--trace", metavar="FILE", type=path_ending(".json"),
                   help="write both timelines into one Perfetto .json (measured above predicted)")
    p.add_argument("--png", metavar="FILE", type=path_ending(".png"), help="draw both timelines into one picture")
    p.add_argument("--markdown", metavar="FILE", type=path_ending(".md"),
                   help="with --all: write the error table and findings (docs/validation.md)")
    p.add_argument("--validation", action="store_true",
                   help="the validation set's measured runs (reference/validation_set.py) and the bars they are held "
                        f"to per GPU kind: every latency within {100 * cmp.LATENCY_BOUND:.0f}%%, mean |error| at most "
                        f"{100 * heldout.MEAN_BOUND:.0f}%%, every phase within {100 * cmp.PHASE_BOUND:.0f}%%; exit "
                        "status 1 until they are met")
    p.add_argument("--tasks", action="store_true",
                   help="also each phase's tasks, predicted against measured: their count and the median and 90th "
                        "percentile of their durations (where a phase's busy time is off: too few tasks, or too "
                        "short), and the parts of a phase apart: the combine's per-tile tasks and final sum, a "
                        "shared-expert layer's routed and shared GEMM tasks")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even where a run misses a bound or a bar")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_compare)
