"""A timeline picture of any trace: per GPU, how busy its processor blocks are with each kind of
work over time, and above that its links, NIC and proxy intervals. PNG (matplotlib, Agg) or a
self-contained HTML page holding the same picture inline (no network needed to open it).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np

from .trace import KIND, KINDS, ROLE, Trace

BINS = 400
MAX_GPUS = 8  # more panels than this would be unreadable; the first GPUs are drawn
COLORS = {"gate": "#8c564b", "dispatch": "#9467bd", "gemm0": "#1f77b4", "gemm1": "#2ca02c",
          "combine": "#ff7f0e", "put": "#7f7f7f", "fence": "#d62728", "signal": "#17becf",
          "wait": "#bcbd22", "idle": "#e0e0e0"}
# lanes drawn above the processors' busy fraction: (role, y of the row)
STRIPS = (("link", 1.1), ("nic", 1.3), ("proxy", 1.5))


def busy_fraction(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time covered by the intervals within each bin, over the bin width (may exceed 1 when they
    overlap: divide by the lanes to get a fraction)."""
    def covered(t):  # total length of the intervals' parts before each t
        s, e = np.sort(start), np.sort(end)
        cs, ce = np.r_[0.0, np.cumsum(s)], np.r_[0.0, np.cumsum(e)]
        ks, ke = np.searchsorted(s, t), np.searchsorted(e, t)
        return (ks * t - cs[ks]) - (ke * t - ce[ke])
    return np.diff(covered(edges)) / np.diff(edges)


def figure(trace: Trace, title: str = "", processors: dict[int, int] | None = None):
    """Per GPU, its processors' busy fraction by task kind and its link, NIC and proxy strips.
    `processors`: the processor blocks of each rank where ranks differ (a measured run beside its
    prediction on another preset); else the trace's meta "processors", else the lanes seen."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(int(r) for r in np.unique(trace["rank"]))[:MAX_GPUS]
    t0 = float(trace["start"].min()) if len(trace) else 0.0
    t1 = float(trace["end"].max()) if len(trace) else 1.0
    edges = np.linspace(t0, t1, BINS + 1)
    mid_us = (edges[:-1] + edges[1:]) / 2e3
    fig, axes = plt.subplots(len(ranks) or 1, 1, figsize=(12, 1.9 * max(1, len(ranks)) + 0.8),
                             sharex=True, squeeze=False)
    per_rank, processors = processors, trace.meta.get("processors")
    for ax, r in zip(axes[:, 0], ranks):
        mine = trace.select(trace["rank"] == r)
        proc = mine["role"] == ROLE["processor"]
        lanes = (per_rank or {}).get(r) or processors or max(1, np.unique(mine["lane"][proc]).size)
        layers, labels, colors = [], [], []
        for name in ("gate", "dispatch", "gemm0", "gemm1", "combine"):
            sel = proc & (mine["kind"] == KIND[name])
            if sel.any():
                layers.append(busy_fraction(mine["start"][sel], mine["end"][sel], edges) / lanes)
                labels.append(name)
                colors.append(COLORS[name])
        if layers:
            ax.stackplot(mid_us, layers, labels=labels, colors=colors, linewidth=0)
        for role, y in STRIPS:
            sel = mine["role"] == ROLE[role]
            for k in np.unique(mine["kind"][sel]):
                rows = sel & (mine["kind"] == k)
                spans = [(s / 1e3, max(e - s, (t1 - t0) / 2000) / 1e3)
                         for s, e in zip(mine["start"][rows], mine["end"][rows])]
                ax.broken_barh(spans, (y, 0.15), color=COLORS[KINDS[int(k)]], linewidth=0)
        ax.set_ylim(0, 1.7)
        ax.set_yticks([0.5, 1.175, 1.375, 1.575], ["blocks busy", "links", "NIC", "proxy"], fontsize=7)
        ax.set_ylabel(f"GPU {r}", fontsize=8)
    axes[-1, 0].set_xlabel("time (µs)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.legend(handles, list(COLORS), loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=len(COLORS),
               fontsize=7, frameon=False)
    return fig


def render(trace: Trace, path: str | Path, title: str | None = None) -> Path:
    """Write the timeline of `trace` to `path`: .png, or .html (the PNG inline)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix not in (".png", ".html"):
        raise ValueError(f"timeline path {str(path)!r} must end in .png or .html")
    meta = trace.meta
    title = title or " ".join(str(x) for x in (
        meta.get("config", {}).get("name", ""), "baseline" if meta.get("baseline") else "fused",
        meta.get("hardware", ""), meta.get("transport", "")) if x)
    fig = figure(trace, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    if path.suffix == ".png":
        path.write_bytes(buf.getvalue())
    else:
        img = base64.b64encode(buf.getvalue()).decode()
        path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                        f"</head><body><h3>{html.escape(title)}</h3>"
                        f"<img alt='timeline' src='data:image/png;base64,{img}'></body></html>\n")
    return path
