"""Which GPU benchmark runs the Benchmarks page offers, and their rows. The rows are
benchmarks/bench_gpu.py's table (one definition for the device run's printout and the page); the
weights' roofline and each point's layer roofline are sim.metrics'."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_gpu import TABLE_HEAD, ceilings_of, table_rows
from reference import Config
from reference.files import FileError, read_json
from sim import metrics
from sim.compare import read_summary

from .compare_data import measurements_dir


def summaries(folder: Path | None = None) -> list[Path]:
    """The benchmark summaries (`bench_gpu.py`'s summary.json, committed as
    measurements/gpu/<gpu>-bench-*.json) under `folder`: files whose results time the kernel."""
    out = []
    for path in sorted(((folder or measurements_dir()) / "gpu").glob("*.json")):
        try:
            d = read_summary(path)
        except FileError:
            continue  # another kind of JSON (experiments, microbenchmarks): not a summary
        if any("kernel_ms" in r for r in d["results"]):
            out.append(path)
    return out


def load(path: Path) -> tuple[dict, list[dict]]:
    d = read_summary(path)
    return d["meta"], d["results"]


def stream_gbps(gpu: str, folder: Path | None = None) -> float | None:
    """The fastest weight stream measured on `gpu` (benchmarks/weight_stream.py's files), GB/s:
    the rate for runs from before the benchmark measured its GPU's memory; None where none was."""
    rates = []
    for path in ((folder or measurements_dir()) / "gpu").glob("*weight-stream.json"):
        d = read_json(path, "benchmarks/weight_stream.py's result: an object with \"gpu\" and \"variants\"")
        if d.get("gpu") == gpu:
            rates += [v["weight_gbps"] for v in d.get("variants", [])]
    return max(rates) if rates else None


def config_of(result: dict) -> Config:
    return Config.from_dict(result["config"])


def rows(meta: dict, results: list[dict], gbps: float) -> list[dict]:
    """One record per benchmark point: the table's columns, and the kept rows an expert."""
    measured = [r for r in results if "kernel_ms" in r]
    table = table_rows(measured, ceilings_of(meta), gbps, meta.get("nvlink_gbps"))
    per_expert = {r["name"]: r["kept_rows"] / config_of(r).experts for r in measured}
    return [{**dict(zip(TABLE_HEAD, row)), "rows an expert": per_expert[row[0]]} for row in table]


def torch_only_rows(meta: dict, results: list[dict], gbps: float) -> list[dict]:
    """The table's records of the layers the kernel does not run yet, timed in torch alone."""
    alone = [r for r in results if "kernel_skipped" in r]
    keep = ("point", "precision", "GPUs", "T/rank", "E", "k", "kernel ms", "dropless torch ms", "padded torch ms",
            "loop torch ms", "roofline ms", "bound")
    table = table_rows(alone, ceilings_of(meta), gbps, meta.get("nvlink_gbps"))
    return [{k: v for k, v in zip(TABLE_HEAD, row) if k in keep} for row in table]


def skipped(results: list[dict]) -> list[str]:
    """The points the run did not time, each with its reason."""
    return [f"{r['name']}: {r['skipped']}" for r in results if "skipped" in r]


def roofline_curves(meta: dict, results: list[dict], gbps: float, per_expert: list[float]) -> dict[str, tuple]:
    """Per GEMM precision of the run, its weights' roofline (% of that precision's ceiling, at most
    100) over kept rows an expert `per_expert`, for a layer like the run's first of that precision."""
    ceilings, curves = ceilings_of(meta), {}
    for r in results:
        if "kernel_ms" not in r:
            continue
        c = config_of(r)
        name = f"{c.precision} weights' roofline ({gbps:.0f} GB/s)"
        if name not in curves:
            curves[name] = (list(per_expert), [min(100.0, metrics.weights_roofline(
                c, rows * c.experts, ceilings[c.precision], gbps)) for rows in per_expert])
    return curves
