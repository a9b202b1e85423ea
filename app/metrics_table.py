"""Metrics dicts (from sim.metrics.compute) as display tables."""

from __future__ import annotations


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
