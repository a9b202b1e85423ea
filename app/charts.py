"""Figures: a trace's Gantt timeline (plotly, and matplotlib for PNG) and the small charts.

Every figure is built from plain arrays and tables so that the pages only choose what to show.
Time is drawn in microseconds; traces hold nanoseconds.
"""

from __future__ import annotations

import io

import numpy as np
import plotly.graph_objects as go

from sim.trace import KINDS

from .lanes import Bars, Rows

KIND_COLORS = {
    "gate": "#8c564b", "dispatch": "#1f77b4", "gemm0": "#2ca02c", "gemm1": "#98df8a",
    "combine": "#9467bd", "put": "#17becf", "fence": "#d62728", "signal": "#ff7f0e",
    "wait": "#bcbd22", "idle": "#d3d3d3",
}
ROW_PX = 16  # height of one Gantt row


def gantt(panels: list[tuple[str, Rows, Bars]], title: str) -> go.Figure:
    """A Gantt chart on one time axis: one row per lane (or lane group), one trace per kind of
    work; each panel (a label prefix, its rows and bars) below the previous one."""
    fig = go.Figure()
    labels: list[str] = []
    edges: list[float] = []
    shown: set[str] = set()
    for prefix, rows, bars in panels:
        offset = len(labels)
        for tr in _bar_traces(rows, bars, offset):
            tr.showlegend = tr.name not in shown
            shown.add(tr.name)
            fig.add_trace(tr)
        labels += [f"{prefix}{label}" for label in rows.labels]
        edges += [offset + e for e in _gpu_edges(rows)]
        if offset:
            edges.append(offset - 0.5)
    _style_gantt(fig, labels, title, edges)
    return fig


def _bar_traces(rows: Rows, bars: Bars, row_offset: int) -> list[go.Bar]:
    """The plotly bars of `bars`, one trace per kind present, rows shifted by `row_offset`."""
    out = []
    labels = np.array(rows.labels, dtype=object)
    for k in np.unique(bars.kind):
        m = bars.kind == k
        kind = KINDS[int(k)]
        start, dur = bars.start[m] / 1e3, (bars.end[m] - bars.start[m]) / 1e3
        if bars.exact:
            custom = np.stack([labels[bars.row[m]], start, dur, bars.expert[m], bars.tile[m],
                               bars.peer[m], bars.nbytes[m]], axis=1)
            hover = (f"<b>{kind}</b> %{{customdata[0]}}<br>%{{customdata[1]:.3f}} µs + "
                     "%{customdata[2]:.3f} µs<br>expert %{customdata[3]}, tile %{customdata[4]}, "
                     "peer %{customdata[5]}, %{customdata[6]:,} bytes<extra></extra>")
            opacity = 1.0
        else:
            custom = np.stack([labels[bars.row[m]], start, start + dur,
                               _share_text(bars.share[m])], axis=1)
            hover = ("%{customdata[0]}<br>%{customdata[1]:.3f}–%{customdata[2]:.3f} µs<br>"
                     "%{customdata[3]}<extra></extra>")
            opacity = np.clip(bars.busy[m], 0.25, 1.0)
        out.append(go.Bar(
            # an explicit width: plotly would size bars by the gap between a trace's rows
            y=bars.row[m] + row_offset, x=dur, base=start, orientation="h", name=kind, width=0.8,
            legendgroup=kind, customdata=custom, hovertemplate=hover,
            marker={"color": KIND_COLORS[kind], "opacity": opacity, "line": {"width": 0}}))
    return out


def _style_gantt(fig: go.Figure, labels: list[str], title: str, edges: list[float]) -> None:
    """Axes, size and GPU separators of a Gantt figure whose rows are `labels`, top to bottom."""
    fig.update_layout(
        title={"text": title}, barmode="overlay", bargap=0.15, height=160 + ROW_PX * len(labels),
        margin={"l": 10, "r": 10, "t": 70, "b": 40},
        legend={"orientation": "h", "x": 0, "y": 1.0, "xanchor": "left", "yanchor": "bottom"},
        xaxis={"title": {"text": "time (µs)"}, "zeroline": False},
        yaxis={"tickmode": "array", "tickvals": list(range(len(labels))), "ticktext": labels,
               "range": [len(labels) - 0.5, -0.5], "tickfont": {"size": 10}, "fixedrange": False},
        hoverlabel={"align": "left"}, uirevision=title)
    for y in edges:
        fig.add_hline(y=y, line={"color": "#888", "width": 1})


def _gpu_edges(rows: Rows) -> list[float]:
    return [i - 0.5 for i in np.flatnonzero(np.diff(rows.rank)) + 1]


def _share_text(share: np.ndarray) -> list[str]:
    """'busy 78%: gemm0 50%, gemm1 28%' for each aggregated bar."""
    out = []
    for s in share:
        order = np.argsort(-s)
        parts = [f"{KINDS[i]} {100 * s[i]:.0f}%" for i in order if s[i] >= 0.005]
        out.append(f"busy {100 * s.sum():.0f}%: " + ", ".join(parts))
    return out


def gantt_png(panels: list[tuple[str, Rows, Bars]], title: str) -> bytes:
    """The same Gantt chart as a PNG (matplotlib), for slides and reports."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n_rows = sum(len(rows) for _, rows, _ in panels)
    height = min(2 + 0.18 * n_rows, 60)
    fig, ax = plt.subplots(figsize=(12, height), dpi=100)
    labels: list[str] = []
    present: set[int] = set()
    for prefix, rows, bars in panels:
        offset = len(labels)
        rgba = [(*matplotlib.colors.to_rgb(KIND_COLORS[KINDS[int(k)]]), a)
                for k, a in zip(bars.kind, np.clip(bars.busy, 0.25, 1.0))]
        ax.barh(bars.row + offset, (bars.end - bars.start) / 1e3, left=bars.start / 1e3,
                height=0.85, color=rgba, linewidth=0)
        for y in _gpu_edges(rows) + ([-0.5] if offset else []):
            ax.axhline(offset + y, color="#888", linewidth=0.8)
        labels += [f"{prefix}{label}" for label in rows.labels]
        present |= {int(k) for k in np.unique(bars.kind)}
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("time (µs)")
    ax.set_title(title)
    kinds = [KINDS[k] for k in sorted(present)]
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.08 if height < 6 else -0.02), ncol=max(len(kinds), 1),
              fontsize=8, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def lines(table: list[dict], x: str, y: str, series: str, title: str, y_title: str,
          log_y: bool = False) -> go.Figure:
    """One line per value of `series` through the (x, y) points of `table`'s rows."""
    fig = go.Figure()
    for name in dict.fromkeys(r[series] for r in table):
        pts = sorted((r[x], r[y]) for r in table if r[series] == name)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=str(name),
                                 mode="lines+markers"))
    fig.update_layout(title={"text": title}, xaxis={"title": {"text": x}},
                      yaxis={"title": {"text": y_title}, "type": "log" if log_y else "linear"},
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def roofline(points: list[dict], x: str, y: str, series: str, curves: dict[str, tuple[list, list]],
             bar: float, title: str, x_title: str, y_title: str) -> go.Figure:
    """Measured points (one marker series per value of `series`) over roofline curves (name ->
    (xs, ys)), with the bar as a dashed line, on a log-2 x axis."""
    fig = go.Figure([go.Scatter(x=xs, y=ys, name=name, mode="lines") for name, (xs, ys) in curves.items()])
    for name in dict.fromkeys(r[series] for r in points):
        pts = [r for r in points if r[series] == name]
        fig.add_trace(go.Scatter(x=[r[x] for r in pts], y=[r[y] for r in pts], name=str(name), mode="markers",
                                 text=[r["point"] for r in pts], hovertemplate="%{text}: %{y:.1f}<extra></extra>"))
    fig.add_hline(y=bar, line_dash="dash", line_color="grey", annotation_text=f"the bar: {bar:g}")
    fig.update_layout(title={"text": title}, xaxis={"title": {"text": x_title}, "type": "log", "dtick": 0.30103},
                      yaxis={"title": {"text": y_title}}, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def grouped_bars(categories: list[str], values: dict[str, list[float]], title: str,
                 y_title: str, stacked: bool = False) -> go.Figure:
    """Bars per category, one bar series per key of `values`."""
    fig = go.Figure([go.Bar(x=categories, y=v, name=name) for name, v in values.items()])
    fig.update_layout(title={"text": title}, barmode="stack" if stacked else "group",
                      yaxis={"title": {"text": y_title}}, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def heatmap(matrix: np.ndarray, title: str, x_title: str, y_title: str, unit: str,
            text: np.ndarray | None = None) -> go.Figure:
    """A matrix as a heat map, row 0 at the top, exact values (and `text`) on hover."""
    n_y, n_x = matrix.shape
    extra = " (%{text})" if text is not None else ""
    fig = go.Figure(go.Heatmap(
        z=matrix, x=list(range(n_x)), y=list(range(n_y)), colorscale="Viridis", text=text,
        colorbar={"title": {"text": unit}},
        hovertemplate=f"{y_title} %{{y}} → {x_title} %{{x}}: %{{z:,}} {unit}{extra}<extra></extra>"))
    ticks = {"dtick": 1} if max(n_x, n_y) <= 16 else {}  # label every GPU while they fit
    fig.update_layout(title={"text": title}, xaxis={"title": {"text": x_title}, **ticks},
                      yaxis={"title": {"text": y_title}, "autorange": "reversed", **ticks},
                      height=520, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def to_html(fig: go.Figure) -> bytes:
    """A self-contained HTML file of `fig` (plotly.js inlined: opens offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True).encode()
