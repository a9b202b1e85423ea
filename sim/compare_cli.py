"""`moelab compare`: one measured run against its prediction, or every committed run as a table
(`--all`), optionally written as docs/validation.md (`--markdown`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reference import ConfigError
from reference.cli import path_ending

from . import compare as cmp
from . import validation
from .calibrate import CalibrationError
from .hardware import HardwareError


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        if args.all:
            return _all(args)
        if not args.measured:
            raise cmp.CompareError("measured", None, "a measured-run file (--measured FILE) or --all")
        return _one(args)
    except (cmp.CompareError, CalibrationError, HardwareError, ConfigError) as e:
        print(f"moelab compare: error: {e}", file=sys.stderr)
        return 2


def _one(args) -> int:
    run = cmp.load_measured(args.measured)
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"simulating {run.config.name} on {run.config.ranks} GPU(s) with "
        f"{args.hardware or cmp.calibrated_for(run)}")
    c = cmp.compare(run, args.hardware, runs=cmp.measured_runs(Path(args.measured).resolve().parent))
    if args.json:
        print(json.dumps({"measured": str(run.path), "hardware": c.hardware.name,
                          "rows": [dict(zip(("quantity", "predicted", "measured", "error", "bound", "ok"), r))
                                   for r in c.rows]}, indent=2))
    else:
        print(cmp.table(c))
    if args.trace:
        say(f"writing {args.trace}")
        Path(args.trace).write_text(json.dumps(cmp.perfetto(c)))
    if args.png:
        say(f"drawing {args.png}")
        cmp.picture(c, args.png)
    return 0


def _all(args) -> int:
    runs = cmp.measured_runs()
    if not runs:
        raise cmp.CompareError("measured", str(cmp.MEASUREMENTS / "gpu"), "a folder holding measured runs")
    predict = cmp.Predictor()
    comparisons = []
    for i, run in enumerate(runs, 1):
        if not args.quiet:
            print(f"[{i}/{len(runs)}] {run.name}", file=sys.stderr, flush=True)
        comparisons.append(cmp.compare(run, args.hardware, runs=runs, predict=predict))
    if args.markdown:
        Path(args.markdown).write_text(validation.markdown(comparisons))
        print(f"wrote {args.markdown}")
    for c in comparisons:
        print(cmp.table(c) + "\n")
    return 0


def register(sub) -> None:
    p = sub.add_parser("compare", help="predicted vs measured: a committed GPU run against the calibrated simulator",
                       description="Simulate a measured run's config with the preset calibrated on that GPU's "
                                   "microbenchmarks and print predicted vs measured layer latency, per-phase busy "
                                   "time, SM utilization and overlap efficiency with their errors and bounds.")
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
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_compare)
