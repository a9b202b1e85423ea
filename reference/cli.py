"""`moelab configs` and `moelab golden`, and the config options every subcommand shares."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from . import budget, golden, golden_file, hf, plan, presets, routing, weights
from .config import Config, ConfigError, field_names, to_toml
from .files import check_output, finite_number
from .numerics import PATHS


def add_config_args(p: argparse.ArgumentParser, default: str = presets.DEFAULT) -> None:
    """--config NAME|FILE, --gpus N and --set FIELD=VALUE, shared by every subcommand."""
    p.add_argument("--config", default=default,
                   help=f"a preset name (see `moelab configs`) or a .toml/.json file (default: {default})")
    p.add_argument("--gpus", type=positive_int, metavar="N", help="override the number of ranks (GPUs)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. --set tokens=1024 (repeatable); fields: "
                        + ", ".join(field_names()))


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = presets.get(args.config)
    changes = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("--set", item, "FIELD=VALUE")
        changes[key] = _parse_value(value)
    edited = {k: v for k, v in changes.items() if k != "name" and getattr(cfg, k, None) != v}
    if edited and "name" not in changes:
        # an edited preset is no longer that preset: say so wherever the name is printed
        changes["name"] = cfg.name + "".join(f"+{k}={v}" for k, v in edited.items())
    if args.gpus is not None:
        changes["ranks"] = args.gpus
    return Config.from_dict({**cfg.to_dict(), **changes}) if changes else cfg


def path_ending(*suffixes: str):
    """An argparse type: a file path that must end in one of `suffixes` (the format it selects)."""
    def check(text: str) -> str:
        if not text.endswith(suffixes):
            raise argparse.ArgumentTypeError(f"{text!r} must end in {' or '.join(suffixes)}")
        return text
    return check


def number_at_least(kind: type, low: float, strict: bool, allowed: str):
    """An argparse type: a finite `kind` (int or float) at least `low` (above it where `strict`);
    anything else, NaN and inf included, is refused naming what is `allowed`."""
    def check(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not finite_number(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {allowed}")
        return value
    return check


positive_int = number_at_least(int, 1, False, "a whole number of at least 1")
non_negative_int = number_at_least(int, 0, False, "a whole number of at least 0")
positive_float = number_at_least(float, 0.0, True, "a finite number > 0")
non_negative_float = number_at_least(float, 0.0, False, "a finite number >= 0")


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class Progress:
    """Stage messages with elapsed time on stderr, for work that takes more than a moment."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.t0 = enabled, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {message}", file=sys.stderr, flush=True)


def cmd_configs(args: argparse.Namespace) -> int:
    if args.from_hf:
        return _from_hf(args)
    if args.out or args.tokens or args.ranks:
        raise ConfigError("--out/--tokens/--ranks", "given", "only with --from-hf")
    rows = [(c.name, c.tokens, c.hidden, c.ffn, c.experts, c.top_k, c.shared_experts,
             "none" if c.capacity_factor is None else f"{c.capacity_factor:g}", c.ranks, c.nodes,
             c.gate, c.activation, c.precision, presets.SOURCES[c.name]) for c in presets.PRESETS.values()]
    head = ("name", "T/rank", "H", "I", "E", "k", "shared", "cf", "GPUs", "nodes", "gate", "act", "precision", "source")
    if args.json:
        print(json.dumps([dict(zip(head, r)) for r in rows], indent=2))
        return 0
    print(format_table(head, rows))
    print("\nsweeps: " + "; ".join(f"{k}: {', '.join(c.name for c in v)}" for k, v in presets.SWEEPS.items()))
    return 0


def _from_hf(args: argparse.Namespace) -> int:
    """`configs --from-hf`: a Config from a Hugging Face config.json, printed (TOML, or JSON) or saved."""
    if args.out:  # before reading: a bad path fails now
        check_output(args.out, (".toml", ".json"))
    run = {k: v for k, v in (("tokens", args.tokens), ("ranks", args.ranks)) if v is not None}
    cfg = hf.from_hf(args.from_hf, **run)
    if args.out:
        cfg.save(args.out)
        print(f"wrote {args.out} ({cfg.name}); run it with --config {args.out}", file=sys.stderr)
    elif args.json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        print(to_toml(cfg.to_dict()), end="")
    return 0


def format_table(head, rows) -> str:
    """A plain text table, columns right-aligned except the first."""
    cells = [[str(h) for h in head]] + [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r]
                                        for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = [" ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, " ".join("-" * w for w in widths))
    return "\n".join(lines)


def compute(cfg: Config, progress: Progress, paths=PATHS) -> dict:
    """Inputs, weights, routing, plan and outputs of `cfg` on each precision path."""
    progress(f"drawing inputs and weights ({cfg.experts + cfg.shared_experts} experts, "
             f"{cfg.ranks} x {cfg.tokens} tokens)")
    w = weights.draw(cfg)
    progress("routing and tile plan")
    r = routing.route(cfg, w.x, w.wg, w.gate_bias, w.wg_bias)
    tp = plan.build(cfg, r)
    out = {"weights": w, "routing": r, "plan": tp}
    for path in paths:
        progress(f"dense forward, {path}")
        out[f"y_{path}"] = golden.dense(cfg, w, r, path)
    return out


# float32 and bf16 results may move by a rounding step with another BLAS; semantics changes move
# them by O(1). Inputs and routing must match exactly.
TOLERANCES = {"routing": 0.0, "routing_weight": 1e-15, "float64": 1e-12, "float32": 1e-6,
              "bfloat16": 5e-3, "tf32": 1e-6}


def tolerance_of(quantity: str) -> float:
    """Tolerance of a `check_golden` quantity ("inputs:x", "routing", "output:float32", ...)."""
    return 0.0 if quantity.startswith("inputs:") else TOLERANCES[quantity.split(":")[-1]]


def check_golden(path: str, progress: Progress, go_on: bool = False) -> dict:
    """Recompute a golden file from its stored inputs and from its config's seed; max rel. errors.
    Past budget.LONG_S it refuses unless `go_on`."""
    g = golden_file.load(path)
    cfg, stored, stored_r = g.config, g.weights, g.routing
    progress(f"checking the golden of {cfg.name}: {budget.check(cfg, 'golden', go_on).text()}")
    fresh = compute(cfg, progress, paths=list(g.outputs))
    errors = {}
    for k in golden_file.WEIGHTS:
        errors[f"inputs:{k}"] = golden.max_rel_error(getattr(fresh["weights"], k), getattr(stored, k))
    r = fresh["routing"]
    errors["routing"] = float(not (np.array_equal(r.expert, stored_r.expert) and np.array_equal(r.slot, stored_r.slot)))
    errors["routing_weight"] = golden.max_rel_error(r.weight, stored_r.weight)
    for path, y in g.outputs.items():
        progress(f"recomputing {path} from the stored inputs")
        errors[f"output:{path}"] = golden.max_rel_error(golden.dense(cfg, stored, stored_r, path), y)
        errors[f"regenerated:{path}"] = golden.max_rel_error(fresh[f"y_{path}"], y)
    return {"config": cfg.name, "errors": errors}


def cmd_golden(args: argparse.Namespace) -> int:
    progress = Progress(not args.quiet)
    if args.check:
        if args.out:
            raise ConfigError("--out", args.out, "not given with --check (--check reads a golden, --out writes one)")
        report = check_golden(args.check, progress, args.long)
        rows = [(q, err, tolerance_of(q) if args.tolerance is None else args.tolerance)
                for q, err in sorted(report["errors"].items())]
        bad = [q for q, err, tol in rows if not err <= tol]
        if args.json:
            print(json.dumps({**report, "mismatches": bad}, indent=2))
        else:
            print(format_table(("quantity", "max rel. error", "tolerance"), rows))
            print("OK" if not bad else "MISMATCH: " + ", ".join(bad))
        return 0 if not bad else 1
    if args.out:
        check_output(args.out, (".npz",))
    cfg = config_from_args(args)
    est = budget.check(cfg, "golden", args.long)
    progress(f"golden of {cfg.name}: {est.text()}")
    result = compute(cfg, progress)
    tp = result["plan"]
    progress("tile walk, float64")
    walk = golden.tile_walk(cfg, result["weights"], tp, "float64")
    summary = {"config": cfg.name, **tp.summary(), "dropped": result["routing"].dropped,
               "tile_walk_vs_dense_float64": golden.max_rel_error(walk, result["y_float64"]),
               **{f"{p}_vs_float64": golden.max_rel_error(result[f"y_{p}"], result["y_float64"])
                  for p in PATHS if p != "float64"}}
    if args.out:
        progress(f"writing {args.out}")
        golden_file.save(args.out, cfg, result["weights"], result["routing"], tp.summary(),
                         {k[2:]: v for k, v in result.items() if k.startswith("y_")})
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        # errors in one fixed width: the tile walk's is 0 or a few 1e-16, as the machine's BLAS orders its sums
        print(format_table(("quantity", "value"), [(k, f"{v:.1e}" if k.endswith("_float64") else v)
                                                   for k, v in summary.items()]))
    return 0


def register(sub) -> None:
    p = sub.add_parser("configs", help="list the preset configurations, or build one from a Hugging Face config",
                       description="List the named presets with their key numbers and sources, and the sweeps; "
                                   "with --from-hf, build a config from a Hugging Face model's config.json (on disk, "
                                   "no network) and print it as TOML or save it as a file the other commands take "
                                   "(--config FILE).")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table (or TOML)")
    p.add_argument("--from-hf", metavar="PATH/config.json", help="a Hugging Face config.json, " + hf.FAMILIES_HELP)
    p.add_argument("--out", metavar="FILE.toml", type=path_ending(".toml", ".json"),
                   help="with --from-hf: save the config to this .toml (or .json) file")
    p.add_argument("--tokens", type=positive_int, metavar="T",
                   help=f"with --from-hf: tokens per GPU (default {hf.DEFAULTS['tokens']})")
    p.add_argument("--ranks", type=positive_int, metavar="P",
                   help=f"with --from-hf: GPUs (default {hf.DEFAULTS['ranks']})")
    p.set_defaults(func=cmd_configs)

    p = sub.add_parser("golden", help="run the golden MoE forward (NumPy) on a config",
                       description="Compute the golden MoE layer (dense formula in float64, float32, "
                                   "emulated bf16 and TF32, plus the tile walk) and optionally save it. The "
                                   "memory and time it needs are estimated first: past the free memory it "
                                   "stops, past a few minutes it asks for --long.",
                       epilog="exit status: 0 done (with --check: every quantity within its tolerance), "
                              "1 --check found a mismatch, 2 a bad option, config or file.")
    add_config_args(p)
    p.add_argument("--out", metavar="FILE.npz", type=path_ending(".npz"),
                   help="write inputs, weights, routing and outputs to exactly this .npz")
    p.add_argument("--check", metavar="FILE.npz",
                   help="recompute a saved golden and report the max relative errors")
    p.add_argument("--long", action="store_true", help=f"go on with a config estimated to take over "
                                                        f"{budget.LONG_S:.0f} s (the default, flashmoe, takes minutes)")
    p.add_argument("--tolerance", type=non_negative_float,
                   help="--check fails above this max relative error (default: exact inputs and "
                        "routing, 1e-12 float64, 1e-6 float32 and tf32, 5e-3 bfloat16)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_golden)
