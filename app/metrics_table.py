"""Metrics dicts (from sim.metrics.compute) as display tables, and predicted-vs-measured errors."""

from __future__ import annotations

import math


def flatten(metrics: dict, prefix: str = "") -> dict:
    """Nested metric dicts as one level, keys joined by '.' ("busy.gemm0")."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def fmt(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.4e}"


def rows(metrics: dict) -> list[dict]:
    """One {metric, value} row per metric, values formatted for reading."""
    return [{"metric": k, "value": fmt(v)} for k, v in flatten(metrics).items()]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def error_rows(predicted: dict, measured: dict) -> list[dict]:
    """Per metric both sides report as numbers: predicted, measured, relative error
    (predicted - measured) / |measured| (None where measured is 0)."""
    p, m = flatten(predicted), flatten(measured)
    out = []
    for k in p:
        if k in m and _number(p[k]) and _number(m[k]):
            err = (p[k] - m[k]) / abs(m[k]) if m[k] else None
            out.append({"metric": k, "predicted": p[k], "measured": m[k], "relative error": err})
    return out
