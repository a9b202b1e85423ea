"""Which measured runs the Compare page offers. The comparison itself is `sim.compare` (the
cross-check of `moelab compare` and CI, with the calibrated preset): one definition of the
prediction and its errors for the command, the tests and the page."""

from __future__ import annotations

import os
from pathlib import Path

from sim import hardware
from sim.compare import CALIBRATED
from sim.trace import Trace, TraceError

REPO = Path(__file__).resolve().parent.parent


def measurements_dir() -> Path:
    """measurements/ of the repository, or $MOELAB_MEASUREMENTS."""
    return Path(os.environ.get("MOELAB_MEASUREMENTS", REPO / "measurements"))


def measured_traces(folder: Path | None = None) -> list[Path]:
    """The kernel telemetry traces (.npz, meta source "gpu" with its config) under `folder`, sorted;
    a bad config is left for the page to name."""
    out = []
    for path in sorted((folder or measurements_dir()).rglob("*.npz")):
        try:
            meta = Trace.load(path).meta
        except TraceError:
            continue  # another kind of .npz (a golden, a table): not a trace
        if meta.get("source") == "gpu" and "config" in meta:
            out.append(path)
    return out


def hardware_choices() -> list[str]:
    """The calibrated preset of the run's GPU first (what CI holds to the bounds), then the presets."""
    return [CALIBRATED, *hardware.PRESETS]
