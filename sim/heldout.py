"""The validation set's verdict: its measured layers (reference/validation_set.py, never seen by a fit)
against their predictions, the bars they are held to, and their section of docs/validation.md, apart
from the fit set (the layers the calibration measured and fitted).

Bars (issue 39), over the validation set's measured layers of one GPU kind alone: every layer's
latency within LATENCY_BOUND, the mean |latency error| at most MEAN_BOUND, every phase's busy time
within PHASE_BOUND. `moelab compare --validation` prints them and exits non-zero where one fails.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from reference import Config, validation_set

from .calibrate import MEASUREMENTS
from .compare import LATENCY_BOUND, PHASE_BOUND, PHASES, Comparison, MeasuredRun

MEAN_BOUND = 0.05
MIN_LAYERS = 24  # measured validation layers a GPU kind needs before its bars are met


def _shape(cfg: Config) -> dict:
    """A layer as the set commits it: every field but the tile, which the bench chooses."""
    return {k: v for k, v in cfg.to_dict().items() if k not in ("tile_m", "tile_n", "tile_k")}


def is_validation(run: MeasuredRun) -> bool:
    """Whether the run measured a layer of the committed validation set (its name and its shape)."""
    want = next((c for c in validation_set.layers() if c.name == run.config.name), None)
    return want is not None and _shape(want) == _shape(run.config)


@dataclass
class Bars:
    """The bars over one GPU kind's measured validation layers."""

    gpu: str
    layers: int
    latency_within: int  # layers whose latency is within LATENCY_BOUND
    mean_abs_error: float
    phase_misses: list[tuple[str, str, float]]  # (run, phase, error) beyond PHASE_BOUND

    @property
    def ok(self) -> bool:
        return (self.layers >= MIN_LAYERS and self.latency_within == self.layers
                and self.mean_abs_error <= MEAN_BOUND and not self.phase_misses)

    def text(self) -> str:
        return (f"{self.gpu}: {self.layers} layers measured (bars need {MIN_LAYERS}); latency within "
                f"{LATENCY_BOUND:.0%}: {self.latency_within} of {self.layers}; mean |latency error| "
                f"{100 * self.mean_abs_error:.1f}% (bar {MEAN_BOUND:.0%}); phases beyond {PHASE_BOUND:.0%}: "
                f"{len(self.phase_misses)}: {'met' if self.ok else 'NOT met'}")


def _row(c: Comparison, prefix: str):
    return next((r for r in c.rows if r[0].startswith(prefix)), None)


def bars(comparisons: list[Comparison]) -> list[Bars]:
    """The bars per GPU kind over the comparisons of validation layers among `comparisons`."""
    by_gpu = defaultdict(list)
    for c in comparisons:
        if is_validation(c.run):
            by_gpu[c.run.gpu_tag].append(c)
    out = []
    for gpu, cs in sorted(by_gpu.items()):
        errors = [_row(c, "layer latency")[3] for c in cs]
        misses = [(c.run.name, ph, r[3]) for c in cs for ph in PHASES
                  if (r := _row(c, ph)) is not None and r[5] is False]
        out.append(Bars(gpu, len(cs), sum(abs(e) <= LATENCY_BOUND for e in errors),
                        sum(abs(e) for e in errors) / len(errors), misses))
    return out


def _layers_in(node, world: int, seen: set) -> None:
    """Gather (GPUs, tokens, experts) of every entry of a calibration file naming a layer."""
    if isinstance(node, dict):
        world = node.get("world", node.get("ranks", world))
        if "tokens" in node and "experts" in node:
            seen.add((world, node["tokens"], node["experts"]))
        for v in node.values():
            _layers_in(v, world, seen)
    elif isinstance(node, list):
        for v in node:
            _layers_in(v, world, seen)


def fit_layers_seen() -> dict[str, list[tuple]]:
    """Per current calibration file, the (GPUs, tokens, experts) of every layer its microbenchmarks
    measured in the megakernel (the fit set as the calibration recorded it)."""
    out = {}
    for path in sorted(MEASUREMENTS.glob("calibration-*.json")):
        if path.stem.count("-") > 1:  # an earlier kernel's, kept for its own runs
            continue
        doc, seen = json.loads(path.read_text()), set()
        _layers_in(doc, doc.get("world", 1), seen)
        out[path.name] = sorted(seen)
    return out


def _pct(e) -> str:
    return "–" if e is None else f"{100 * e:+.1f}%"


def markdown(comparisons: list[Comparison]) -> str:
    """docs/validation.md's section on the fit set and the validation set, apart."""
    layers = validation_set.layers()
    measured = [c for c in comparisons if is_validation(c.run)]
    lines = ["## The fit set and the validation set", "",
             "**The fit set** is every layer whose measurements a calibrated figure is fitted to: the "
             "microbenchmarks' own kernels and the megakernel's pieces timed inside FlashMoE-shaped layers "
             "(H = I = 2048, top-2, relu; `gpu.microbench.fit_layers`). As the calibrations recorded them, "
             "(GPUs, tokens a GPU, experts):", ""]
    for name, seen in fit_layers_seen().items():
        lines.append(f"- `measurements/{name}`: " + ", ".join(f"({w}, {t}, {e})" for w, t, e in seen))
    v = validation_set
    lines += ["", f"**The validation set** (`reference/validation_set.py`, committed as "
              f"`reference/validation_set.json`, the draw of seed {v.SEED}): {len(layers)} bf16 layers, "
              f"{v.PER_GPU_COUNT} on each of {', '.join(map(str, v.GPU_COUNTS))} GPUs, E from "
              f"{min(v.EXPERTS)} to {max(v.EXPERTS)}, k from 1 to {v.TOP_K_MAX}, H and I from {v.WIDTH_RANGE[0]} "
              f"to {v.WIDTH_RANGE[1]}, skew 0 to {v.SKEW_MAX:g}, swiglu in {sum(c.gated for c in layers)}; no fit "
              "sees them (tests/test_validation_set.py checks that none is a fit layer or a committed run's "
              "layer). The `validate` part of `benchmarks/device_run.sh` measures those the kernel runs, at the "
              "bf16 bench tile.", "",
              f"Bars: every layer's latency within {LATENCY_BOUND:.0%}, mean |latency error| at most "
              f"{MEAN_BOUND:.0%}, every phase's busy time within {PHASE_BOUND:.0%}, over at least {MIN_LAYERS} "
              "layers per GPU kind (`moelab compare --validation` exits non-zero where one fails).", ""]
    for b in bars(comparisons):
        lines.append(f"- {b.text()}")
    if not measured:
        lines.append("- no validation layer is measured yet")
    lines += ["", "| layer | GPU | GPUs | T/GPU | H | I | E | k | act. | cf | skew | latency measured ms | "
              "predicted ms | latency | " + " | ".join(PHASES) + " | SM util meas / pred |",
              "| --- " * (15 + len(PHASES)) + "|"]
    by_name = defaultdict(list)
    for c in measured:
        by_name[c.run.config.name].append(c)
    for cfg in layers:
        cs = by_name.get(cfg.name) or [None]
        for c in cs:
            head = (f"| {cfg.name} | {c.run.gpu_tag if c else '–'} | {cfg.ranks} | {cfg.tokens} | {cfg.hidden} | "
                    f"{cfg.ffn} | {cfg.experts} | {cfg.top_k} | {cfg.activation} | {cfg.capacity_factor or 'none'} | "
                    f"{cfg.skew:g} | ")
            if c is None:
                lines.append(head + "not measured |" + " |" * (3 + len(PHASES)))
                continue
            lat, util = _row(c, "layer latency"), _row(c, "SM utilization")
            phases = [_pct(r[3]) + ("" if r[5] is not False else " **miss**") if (r := _row(c, ph)) else "–"
                      for ph in PHASES]
            lines.append(head + f"{lat[2]:.3f} | {lat[1]:.3f} | {_pct(lat[3])}{'' if lat[5] else ' **miss**'} | "
                         + " | ".join(phases) + f" | {util[2]:.3f} / {util[1]:.3f} |")
    return "\n".join(lines) + "\n"
