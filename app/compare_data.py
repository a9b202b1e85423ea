"""A measured run next to its simulated prediction: find the traces, simulate, tabulate errors.

Measured telemetry traces are `sim.trace` `.npz` files under measurements/ whose meta holds the
run's "config" (and, when the run recorded them, "hardware" and "transport"). The prediction is
`sim.simulate` of that config; the error table compares `sim.metrics.compute` of both traces,
so measured and simulated numbers come from one definition. Shared with `moelab compare`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from reference import Config
from sim import TRANSPORTS, hardware, metrics, simulate
from sim.trace import Trace, TraceError

from .metrics_table import error_rows

REPO = Path(__file__).resolve().parent.parent


def measurements_dir() -> Path:
    """measurements/ of the repository, or $MOELAB_MEASUREMENTS."""
    return Path(os.environ.get("MOELAB_MEASUREMENTS", REPO / "measurements"))


def measured_traces(folder: Path | None = None) -> list[Path]:
    """The telemetry traces (.npz with a config in their meta) under `folder`, sorted."""
    out = []
    for path in sorted((folder or measurements_dir()).rglob("*.npz")):
        try:
            if "config" in Trace.load(path).meta:
                out.append(path)
        except TraceError:
            continue  # another kind of .npz (a golden, a table): not a trace
    return out


def shifted_to_zero(trace: Trace) -> Trace:
    """The trace with its first event at t = 0 (telemetry clocks start anywhere)."""
    t0 = float(trace["start"].min()) if len(trace) else 0.0
    cols = dict(trace.columns)
    cols["start"], cols["end"] = trace["start"] - t0, trace["end"] - t0
    return Trace(cols, dict(trace.meta))


@dataclass(frozen=True)
class Comparison:
    config: Config
    hardware: str
    transport: str
    measured: Trace
    simulated: Trace
    errors: list[dict]  # metric, predicted, measured, relative error


def run_options(meta: dict) -> tuple[str, str]:
    """The (hardware, transport) a measured run names in its meta, else the simulator's defaults."""
    hw = meta.get("hardware")
    tr = meta.get("transport")
    return (hw if hw in hardware.PRESETS else "h100-sxm",
            tr if tr in TRANSPORTS else "ibgda")


def compare(measured: Trace, hw: str | None = None, transport: str | None = None) -> Comparison:
    """Simulate the measured run's config and compare the two traces' metrics."""
    cfg = Config.from_dict(measured.meta["config"])
    default_hw, default_tr = run_options(measured.meta)
    hw, transport = hw or default_hw, transport or default_tr
    predicted = simulate(cfg, hardware=hw, transport=transport)
    measured = shifted_to_zero(measured)
    simulated = shifted_to_zero(predicted.trace)
    errors = error_rows(metrics.compute(simulated, cfg), metrics.compute(measured, cfg))
    return Comparison(cfg, hw, transport, measured, simulated, errors)
