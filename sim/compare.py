"""Predicted against measured: the simulator on a measured run's config with the calibrated preset.

A measured run is a kernel telemetry trace (`.npz` of the trace schema, meta "source": "gpu"
with the run's "gpu" and the keys every trace has, sim.trace.META_KEYS) under measurements/gpu/,
or a benchmark summary JSON naming such a trace. Its prediction is `sim.simulate` of the same
config, dispatch path, senders and queue rule (the trace's meta), and the run's own routing (the
rows each GPU sent each expert, from its dispatch shares: the kernel draws its tokens on the GPU,
another sample than the reference's seeded ones, and the experts that finish last set the layer's
end), with
the preset calibrated on that GPU's microbenchmarks (measurements/calibrated-<gpu>.json, from
`moelab calibrate`; never fitted to layer runs), or, for a run of an earlier kernel whose
microbenchmarks are kept, on those (calibrated-<gpu>-<commit[:7]>.json, or the one
measurements/kernel-presets.json names for its commit). Both traces go through
one definition:

- layer latency: first start to last end of the trace;
- per-phase busy time: processor time in gate, dispatch, gemm0, gemm1 and combine intervals,
  per processor block (ms), so runs with different block counts compare;
- SM utilization: `sim.metrics` (busy processor time over processors x latency);
- overlap efficiency: `sim.metrics.overlap_efficiency`, T(2) / T(N) of the same layer on 2 and
  N GPUs; reported where the measured run on 2 GPUs of the same layer by the same kernel commit
  is committed too (on 2 GPUs it is 1 by definition).

Bounds: latency within 10%, every phase's busy time within 20%, overlap efficiency
within 0.1 absolute. A run that recorded no commit cannot be matched to the kernel the
microbenchmarks measured: it is compared, but not held to the bounds.

Which runs: the calibration measures each kernel build (float32, bf16) at one tile shape, and
the calibrated preset records it (`Hardware.require_tile`); `measured_runs` takes the runs of a
calibrated (dtype, tile), and `compare` with the calibrated preset refuses any other run with
an error naming the dtype and shape, since its figures were measured on another kernel.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from reference import Config, ConfigError, TilePlan
from reference import plan as tile_plan
from reference.files import FileError, read_json

from . import metrics
from .calibrate import GPU_PRESET, MEASUREMENTS
from .engine import simulate
from .hardware import Hardware, HardwareError
from .hardware import get as get_hardware
from .trace import KIND, ROLE, Trace, TraceError, check_meta, concat
from .variant import Variant

KERNEL_PRESETS = "kernel-presets.json"  # under MEASUREMENTS: kernel commits sharing a kept preset

PHASES = ("gate", "dispatch", "gemm0", "gemm1", "combine")
LATENCY_BOUND, PHASE_BOUND, OVERLAP_BOUND = 0.10, 0.20, 0.10
CALIBRATED = "calibrated"  # `compare`'s hardware: the preset calibrated on the run's GPU


class CompareError(ValueError):
    """A measured-run file or option that is not allowed."""

    def __init__(self, name: str, value, allowed: str):
        self.field, self.value, self.allowed = name, value, allowed
        super().__init__(f"compare option '{name}' = {value!r} is not allowed: {allowed}")


@dataclass(eq=False)
class MeasuredRun:
    path: Path
    config: Config
    trace: Trace  # first event at t = 0
    gpu: str
    processors: int

    @cached_property
    def send_counts(self) -> np.ndarray | None:
        """(P, E) rows each GPU sent each routed expert in the measured call, from its dispatch
        shares' bytes; None where the trace cannot tell (events dropped, a share without its
        expert, or rows that do not add up to its tokens' choices)."""
        cfg, tr = self.config, self.trace
        share = (tr["role"] == ROLE["processor"]) & (tr["kind"] == KIND["dispatch"])
        row = cfg.hidden * cfg.dtype_bytes
        expert, nbytes = tr["expert"][share], tr["bytes"][share]
        if (int(tr.meta.get("dropped_events", 0)) or not share.any() or np.any(expert < 0)
                or np.any(expert >= cfg.experts) or np.any(nbytes % row)):
            return None
        counts = np.zeros((cfg.ranks, cfg.experts), np.int64)
        np.add.at(counts, (tr["rank"][share], expert), nbytes // row)
        sent, choices = counts.sum(axis=1), cfg.tokens * cfg.top_k
        return counts if np.all(sent == choices if cfg.capacity_factor is None else sent <= choices) else None

    @cached_property
    def plan(self) -> TilePlan | None:
        """The measured call's tile plan (from send_counts), or None where they are not known."""
        counts = self.send_counts
        return None if counts is None else tile_plan.from_counts(self.config, counts)

    @property
    def routing(self) -> str:
        """Whose routing its prediction simulates."""
        return ("the run's own (its dispatch shares)" if self.plan is not None
                else "the reference's seeded one (the trace cannot tell its own)")

    @property
    def commit(self) -> str | None:
        """The commit whose kernel was measured, where the run recorded one."""
        c = str(self.trace.meta.get("commit", ""))
        return c if len(c) == 40 and all(ch in "0123456789abcdef" for ch in c) else None

    @cached_property
    def variant(self) -> Variant:
        """The measured kernel's variant, as its trace recorded it (Variant.recorded)."""
        return Variant.recorded(self.trace.meta)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def gpu_tag(self) -> str:
        return next((t for t in GPU_PRESET if t in self.gpu.lower()), "")


def shifted_to_zero(trace: Trace) -> Trace:
    t0 = float(trace["start"].min()) if len(trace) else 0.0
    cols = dict(trace.columns)
    cols["start"], cols["end"] = trace["start"] - t0, trace["end"] - t0
    return Trace(cols, dict(trace.meta))


def load_measured(path: str | Path) -> MeasuredRun:
    """A measured run from its telemetry trace (.npz) or a benchmark summary naming one (.json).
    An empty trace, or one whose times are not finite, is refused: it has nothing to compare."""
    path = Path(path)
    if path.suffix == ".json":
        path = _trace_of_summary(path)
    try:
        trace = Trace.load(path)
    except TraceError as e:
        raise CompareError("measured", str(path), f"a telemetry trace .npz ({e})") from e
    meta = trace.meta
    if meta.get("source") != "gpu":
        raise CompareError("measured", str(path), "a kernel telemetry trace (meta source 'gpu')")
    try:
        check_meta(meta)
    except TraceError as e:
        raise CompareError("measured", str(path), f"a trace of the meta schema ({e})") from e
    if not len(trace):
        raise CompareError("measured", str(path), "a trace of at least one event")
    if not (trace["end"] >= trace["start"]).all():
        raise CompareError("measured", str(path), "a trace of intervals that end after they start")
    try:
        cfg = Config.from_dict(meta["config"])
    except ConfigError as e:
        raise CompareError("measured", str(path), f"a trace whose meta config is allowed ({e})") from e
    return MeasuredRun(path, cfg, shifted_to_zero(trace), str(meta.get("gpu", "")), int(meta["processors"]))


def read_summary(path: str | Path) -> dict:
    """A GPU benchmark summary (benchmarks/bench_gpu.py's summary.json): its "meta" and a list of
    "results", each a JSON object; any failure is one FileError line."""
    expected = "a benchmark summary .json: an object with \"meta\" and a list of \"results\" objects"
    doc = read_json(path, expected)
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("results"), list) \
            or not all(isinstance(r, dict) for r in doc["results"]):
        raise FileError(path, "lacks an object \"meta\" or a list of \"results\" objects", expected)
    return doc



def _trace_of_summary(path: Path) -> Path:
    """The trace a benchmark summary's (first) layer result names, found beside the summary."""
    try:
        results = read_summary(path)["results"]
    except FileError as e:
        raise CompareError("measured", str(path), f"a benchmark summary ({e})") from e
    names = [r["trace"] for r in results if isinstance(r.get("trace"), str) and r["trace"] and "kernel_ms" in r]
    if not names:
        raise CompareError("measured", str(path), "a summary with a benchmark result naming its trace")
    prefix = path.name.split("-")[0] + "-"
    for candidate in (path.parent / names[0], path.parent / (prefix + names[0])):
        if candidate.is_file():
            return candidate
    raise CompareError("measured", names[0], f"a trace file beside {path}")


def measured_runs(folder: Path | None = None, calibrated_only: bool = True) -> list[MeasuredRun]:
    """Every committed layer run under measurements/gpu/ on a GPU with a preset; with
    `calibrated_only`, those whose dtype and tile shape its calibrated preset covers."""
    runs = []
    for p in sorted((folder or MEASUREMENTS / "gpu").glob("*.npz")):
        try:
            run = load_measured(p)
        except (CompareError, TraceError):
            continue
        if run.gpu_tag and (not calibrated_only or uncovered(run) is None):
            runs.append(run)
    return runs


def kernel_presets() -> dict[str, dict[str, str]]:
    """KERNEL_PRESETS' "presets" (none where the folder has no such file): for each GPU tag, the
    kernel commits (their first 7 hex digits) whose runs an earlier kernel's kept preset describes,
    each with that preset's file name under MEASUREMENTS (the kernels between two calibrations
    share one)."""
    path = MEASUREMENTS / KERNEL_PRESETS
    if not path.is_file():
        return {}
    expected = ('an object whose "presets" maps GPU tags to objects of 7-hex kernel commits, each naming a '
                'calibrated-<gpu>-<kernel>.json file beside it')
    presets = read_json(path, expected).get("presets")
    if not (isinstance(presets, dict) and all(
            isinstance(by, dict) and all(isinstance(c, str) and re.fullmatch("[0-9a-f]{7}", c) and isinstance(f, str)
                                         and f.startswith(f"calibrated-{gpu}-") and (path.parent / f).is_file()
                                         for c, f in by.items()) for gpu, by in presets.items())):
        raise FileError(path, "holds a \"presets\" entry that is not such a map, or names a missing file", expected)
    return presets


def calibrated_for(run: MeasuredRun) -> Path:
    """The preset calibrated on the run's GPU: where the microbenchmarks of an earlier kernel are
    kept, the one of the run's own kernel commit (calibrated-<gpu>-<commit[:7]>.json) or the one
    KERNEL_PRESETS names for it; else the GPU's current one."""
    short = (run.commit or "")[:7]
    own = MEASUREMENTS / f"calibrated-{run.gpu_tag}-{short}.json"
    if run.commit and own.is_file():
        return own
    named = kernel_presets().get(run.gpu_tag, {}).get(short) if run.commit else None
    if named:
        return MEASUREMENTS / named
    path = MEASUREMENTS / f"calibrated-{run.gpu_tag}.json"
    if not path.is_file():
        raise CompareError("hardware", str(path), f"a calibrated preset for {run.gpu!r}: run `moelab calibrate`")
    return path


def tile_of(cfg: Config) -> tuple[int, int, int]:
    return cfg.tile_m, cfg.tile_n, cfg.tile_k


def uncovered(run: MeasuredRun) -> str | None:
    """Why the calibrated preset of the run's GPU cannot predict it (no preset, or no section
    for its dtype at its tile shape), or None when it can."""
    try:
        # by GEMM precision: a tf32 or tf32x3 run is float32 data on another build than float32's
        get_hardware(str(calibrated_for(run))).require_tile(run.config.precision, tile_of(run.config))
    except (CompareError, HardwareError) as e:
        return str(e)
    return None


def summary(trace: Trace, processors: int, ranks: int) -> dict:
    """Latency, per-phase busy ms per processor block and SM utilization of one trace (`processors`
    blocks on each of `ranks` GPUs)."""
    start, end, role, kind = trace["start"], trace["end"], trace["role"], trace["kind"]
    proc = role == ROLE["processor"]
    latency = float(end.max() - start.min()) if len(trace) else 0.0
    out = {"latency_ms": latency / 1e6}
    processors *= ranks
    for ph in PHASES:
        sel = proc & (kind == KIND[ph])
        out[f"{ph}_ms"] = float((end[sel] - start[sel]).sum()) / processors / 1e6
    busy = proc & ~np.isin(kind, metrics.NOT_BUSY)
    out["sm_utilization"] = float((end[busy] - start[busy]).sum()) / (processors * latency) if latency else 0.0
    return out


@dataclass
class Comparison:
    run: MeasuredRun
    hardware: Hardware
    predicted: Trace
    measured: dict
    model: dict
    rows: list = field(default_factory=list)  # (quantity, predicted, measured, error, bound, ok or None)

    @property
    def ok(self) -> bool:
        return all(r[5] is not False for r in self.rows)


class Predictor:
    """Simulations of configs on presets, each run once (partners for overlap efficiency reuse them)."""

    def __init__(self):
        self.cache: dict[tuple[str, str, Variant, str | None], object] = {}

    def __call__(self, cfg: Config, hw: Hardware, variant: Variant, plan: TilePlan | None = None):
        """`cfg` on `hw` by the kernel of `variant`; `plan`: the call's own (a measured run's), default
        the reference's seeded routing."""
        figures = hw.for_config(cfg).to_dict()  # what simulate runs with
        routing = None if plan is None else plan.send_counts.tobytes().hex()
        key = (json.dumps(cfg.to_dict(), sort_keys=True), json.dumps(figures, sort_keys=True), variant, routing)
        if key not in self.cache:
            self.cache[key] = simulate(cfg, hardware=hw, plan=plan, **variant.fields())
        return self.cache[key]


def partner(run: MeasuredRun, runs: list[MeasuredRun]) -> MeasuredRun | None:
    """The measured run of the same layer on 2 GPUs of the same kind by the same kernel (commit)
    moving its rows the same way (dispatch path, staged senders), if committed."""
    want = run.config.replace(ranks=2, gpus_per_node=run.config.gpus_per_node).to_dict()
    want.pop("name")
    for r in runs:
        d = r.config.to_dict()
        d.pop("name")
        if d == want and r.gpu_tag == run.gpu_tag and r.commit == run.commit and r.variant == run.variant:
            return r
    return None


def compare(run: MeasuredRun, hardware: str | Path | Hardware | None = None, runs: list[MeasuredRun] | None = None,
            predict: Predictor | None = None) -> Comparison:
    """Predict `run` and tabulate predicted vs measured with each quantity's error and bound."""
    predict = predict or Predictor()
    calibrated = hardware in (None, CALIBRATED)
    hw = get_hardware(str(calibrated_for(run)) if calibrated else
                      str(hardware) if isinstance(hardware, Path) else hardware)
    if calibrated:
        try:
            hw.require_tile(run.config.precision, tile_of(run.config))
        except HardwareError as e:
            raise CompareError("measured", run.name, f"a run the calibration covers: {e}") from e
    hw = hw.for_config(run.config)
    result = predict(run.config, hw, run.variant, run.plan)
    pred_trace = shifted_to_zero(result.trace)
    procs = int(result.trace.meta["processors"])
    ranks = run.config.ranks
    meas, model = summary(run.trace, run.processors, ranks), summary(pred_trace, procs, ranks)
    c = Comparison(run, hw, pred_trace, meas, model)
    c.rows.append(_row("layer latency (ms)", model["latency_ms"], meas["latency_ms"], LATENCY_BOUND))
    for ph in PHASES:
        if meas[f"{ph}_ms"] or model[f"{ph}_ms"]:
            c.rows.append(_row(f"{ph} busy (ms per block)", model[f"{ph}_ms"], meas[f"{ph}_ms"], PHASE_BOUND))
    c.rows.append(_row("SM utilization", model["sm_utilization"], meas["sm_utilization"], None))
    two = partner(run, runs if runs is not None else [run])
    if two is not None and run.config.ranks != 2:
        pred_two = predict(two.config, hw, two.variant, two.plan).metrics["latency_ns"] / 1e6
        meas_two = summary(two.trace, two.processors, 2)["latency_ms"]
        oe_p = metrics.overlap_efficiency(pred_two, model["latency_ms"])
        oe_m = metrics.overlap_efficiency(meas_two, meas["latency_ms"])
        c.rows.append(("overlap efficiency T(2)/T(N)", oe_p, oe_m, oe_p - oe_m, f"±{OVERLAP_BOUND} abs",
                       abs(oe_p - oe_m) <= OVERLAP_BOUND))
    elif run.config.ranks == 2:
        c.rows.append(("overlap efficiency T(2)/T(N)", 1.0, 1.0, 0.0, "1 on 2 GPUs", None))
    else:
        c.rows.append(("overlap efficiency T(2)/T(N)", None, None, None, "no 2-GPU run of this layer and kernel", None))
    return c


def _row(name: str, predicted: float, measured: float, bound: float | None):
    err = (predicted - measured) / measured if measured else None
    ok = None if bound is None or err is None else abs(err) <= bound
    return (name, predicted, measured, err, f"±{bound:.0%}" if bound is not None else "", ok)


def _num(v) -> str:
    """A table cell: four significant digits, blank for None."""
    return "" if v is None else f"{v:.4g}"


def table(c: Comparison) -> str:
    from reference.cli import format_table

    rows = [(q, _num(p), _num(m), "" if e is None else (f"{e:+.3f}" if "overlap" in q else f"{100 * e:+.1f}%"), b,
             {True: "ok", False: "MISS", None: ""}[ok]) for q, p, m, e, b, ok in c.rows]
    head = (f"{c.run.name}: {c.run.config.ranks} x {c.run.gpu}, T={c.run.config.tokens}/GPU, E={c.run.config.experts}"
            f"; predicted with {c.hardware.name}, routing {c.run.routing}")
    return head + "\n" + format_table(("quantity", "predicted", "measured", "error", "bound", ""), rows)


TASK_QUANTILES = (0.5, 0.9)  # the task durations `tasks` compares: median and 90th percentile


def task_durations(trace: Trace, kind: str, part=None) -> np.ndarray:
    """The durations (ns) of every processor task of phase `kind` in a trace (those `part` of the
    trace selects, where given)."""
    sel = (trace["role"] == ROLE["processor"]) & (trace["kind"] == KIND[kind])
    if part is not None:
        sel &= part(trace)
    return trace["end"][sel] - trace["start"][sel]


def task_parts(cfg: Config) -> dict[str, tuple[tuple[str, object], ...]]:
    """The parts of a phase whose tasks differ in kind, each phase's own rows beside it: the
    combine's per-tile tasks and its final sum (no tile); with shared experts, a GEMM phase's routed
    and shared experts' tasks."""
    parts = {"combine": (("per tile", lambda tr: tr["tile"] >= 0), ("final", lambda tr: tr["tile"] < 0))}
    if cfg.shared_experts:
        for ph in ("gemm0", "gemm1"):
            parts[ph] = (("routed", lambda tr: tr["expert"] < cfg.experts),
                         ("shared", lambda tr: tr["expert"] >= cfg.experts))
    return parts


def _task_row(name: str, pred: np.ndarray, meas: np.ndarray) -> dict:
    row = {"phase": name, "predicted_tasks": int(len(pred)), "measured_tasks": int(len(meas))}
    for q in TASK_QUANTILES:
        for who, d in (("predicted", pred), ("measured", meas)):
            row[f"{who}_p{round(100 * q)}_us"] = float(np.quantile(d, q)) / 1e3 if len(d) else None
    mp, mm = row["predicted_p50_us"], row["measured_p50_us"]
    row["median_error"] = (mp - mm) / mm if mp is not None and mm else None
    return row


def tasks(c: Comparison) -> list[dict]:
    """Per phase, the processors' tasks predicted and measured: how many, and the median and 90th
    percentile of their durations in us with the median's error: where a phase's busy time is off,
    whether its tasks are too few or too short; after a phase, its parts (task_parts) where both
    hold tasks, named "phase: part"."""
    out = []
    parts = task_parts(c.run.config)
    for ph in PHASES:
        pred, meas = task_durations(c.predicted, ph), task_durations(c.run.trace, ph)
        if not len(pred) and not len(meas):
            continue
        out.append(_task_row(ph, pred, meas))
        split = [(name, task_durations(c.predicted, ph, part), task_durations(c.run.trace, ph, part))
                 for name, part in parts.get(ph, ())]
        if sum(1 for _, p, m in split if len(p) or len(m)) > 1:
            out.extend(_task_row(f"{ph}: {name}", p, m) for name, p, m in split)
    return out


def task_table(c: Comparison) -> str:
    from reference.cli import format_table

    rows = [(t["phase"], f"{t['predicted_tasks']} / {t['measured_tasks']}",
             f"{_num(t['predicted_p50_us'])} / {_num(t['measured_p50_us'])}",
             "" if t["median_error"] is None else f"{100 * t['median_error']:+.1f}%",
             f"{_num(t['predicted_p90_us'])} / {_num(t['measured_p90_us'])}") for t in tasks(c)]
    return format_table(("tasks", "count pred / meas", "median us pred / meas", "median error",
                         "p90 us pred / meas"), rows)


def perfetto(c: Comparison) -> dict:
    """Both timelines in one Chrome/Perfetto trace: measured GPUs above the predicted ones."""
    events = []
    for side, trace, offset in (("measured", c.run.trace, 0), ("predicted", c.predicted, 1000)):
        for ev in trace.to_perfetto()["traceEvents"]:
            ev = dict(ev, pid=ev["pid"] + offset)
            if ev["ph"] == "M" and ev["name"] == "process_name":
                ev["args"] = {"name": f"{side} GPU {ev['pid'] - offset}"}
                events.append({"ph": "M", "name": "process_sort_index", "pid": ev["pid"],
                               "args": {"sort_index": ev["pid"]}})
            events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"measured": str(c.run.path), "hardware": c.hardware.name, "routing": c.run.routing}}


def picture(c: Comparison, path: str | Path) -> None:
    """One PNG: each measured GPU's panel above its predicted panel."""
    figure(c).savefig(path, dpi=110)


def figure(c: Comparison):
    """The matplotlib figure of `picture`."""
    from . import timeline

    ranks = c.run.config.ranks
    moved = dict(c.predicted.columns)
    moved["rank"] = c.predicted["rank"] + ranks
    both = concat([c.run.trace, Trace(moved, {})], meta={})
    # each panel's busy fraction over its own processors: the preset may run another block count
    predicted = int(c.predicted.meta["processors"])
    lanes = {r: c.run.processors for r in range(ranks)} | {r + ranks: predicted for r in range(ranks)}
    fig = timeline.figure(both, title=f"{c.run.name}: measured (top) and predicted ({c.hardware.name})",
                          processors=lanes)
    for i, ax in enumerate(fig.axes[: 2 * ranks]):
        ax.set_ylabel(f"{'measured' if i < ranks else 'predicted'}\nGPU {i % ranks}", fontsize=8)
    return fig
