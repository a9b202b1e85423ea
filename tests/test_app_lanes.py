"""The app's data side without a server: Gantt rows and bars, figures, metric tables, measured
traces (app/lanes.py, charts.py, metrics_table.py, golden_data.py)."""

import time

import numpy as np
import pytest
from app_traces import pipeline_trace

from app import charts, lanes, metrics_table
from app.golden_data import routing_tables
from reference import presets
from sim.trace import KIND, TraceBuilder


def busy_time(trace, window=None):
    s, e = trace["start"], trace["end"]
    if window:
        s, e = np.clip(s, *window), np.clip(e, *window)
    return float(((e - s) * (trace["kind"] != KIND["idle"])).sum())


def drawn_busy_time(rows, bars):
    return float((bars.busy * (bars.end - bars.start) * rows.lanes[bars.row]).sum())


def test_rows_one_per_lane_in_role_order_with_labels():
    tr = pipeline_trace(ranks=2, blocks=4, tasks=3)
    rows = lanes.rows_of(tr)
    assert rows.labels == ["GPU0 block 0", "GPU0 block 1", "GPU0 block 2", "GPU0 block 3", "GPU0 scheduler",
                           "GPU0 proxy", "GPU0 NIC", "GPU0 link→1",
                           "GPU1 block 0", "GPU1 block 1", "GPU1 block 2", "GPU1 block 3", "GPU1 scheduler",
                           "GPU1 proxy", "GPU1 NIC", "GPU1 link→0"]
    assert not rows.grouped
    label = np.array(rows.labels)[rows.of_event]
    assert all(lab.startswith(f"GPU{r} ") for lab, r in zip(label, tr["rank"]))


def test_many_blocks_are_grouped_into_sm_groups():
    tr = pipeline_trace(ranks=1, blocks=132, tasks=2)
    rows = lanes.rows_of(tr)
    sm = [lab for lab in rows.labels if "block" in lab]
    assert len(sm) <= lanes.ROW_CAPS["processor"] and sm[0] == "GPU0 blocks 0–8"
    assert rows.lanes[: len(sm)].sum() == 132


def test_small_trace_is_drawn_exactly():
    tr = pipeline_trace(ranks=2, blocks=4, tasks=3)
    rows = lanes.rows_of(tr)
    bars = lanes.bars_of(tr, rows)
    assert bars.exact and len(bars) == len(tr)
    assert np.array_equal(bars.start, tr["start"]) and np.array_equal(bars.expert, tr["expert"])


@pytest.mark.parametrize("window", [None, (1000.0, 4000.0)])
def test_aggregated_bars_keep_every_nanosecond_of_work(window):
    tr = pipeline_trace(ranks=2, blocks=40)
    rows = lanes.rows_of(tr)
    bars = lanes.bars_of(tr, rows, window=window)
    assert not bars.exact and rows.grouped
    assert drawn_busy_time(rows, bars) == pytest.approx(busy_time(tr, window), rel=1e-9)
    assert np.allclose(bars.share.sum(axis=1), bars.busy)
    assert (bars.busy <= 1 + 1e-9).all()
    if window:
        assert bars.start.min() >= window[0] and bars.end.max() <= window[1] + 1e-6


def test_too_many_intervals_are_binned_within_the_bound():
    tr = pipeline_trace(ranks=1, blocks=8, tasks=40)  # 320+ intervals, 12 rows
    rows = lanes.rows_of(tr)
    bars = lanes.bars_of(tr, rows, max_bars=300)
    assert not bars.exact and len(bars) <= 300
    assert drawn_busy_time(rows, bars) == pytest.approx(busy_time(tr), rel=1e-9)


def test_a_large_trace_aggregates_fast_to_a_bounded_chart():
    tr = pipeline_trace(ranks=8, blocks=132, tasks=200)  # 211k intervals
    t = time.perf_counter()
    rows = lanes.rows_of(tr)
    bars = lanes.bars_of(tr, rows)
    fig = charts.gantt([("", rows, bars)], "big")
    assert time.perf_counter() - t < 10
    assert len(bars) <= lanes.MAX_BARS and len(rows) <= 8 * (lanes.ROW_CAPS["processor"] + 4)
    assert sum(len(d.x) for d in fig.data) == len(bars)


def test_gantt_figure_has_a_trace_per_kind_and_stacks_panels():
    tr = pipeline_trace(ranks=2, blocks=4, tasks=6)
    rows = lanes.rows_of(tr)
    bars = lanes.bars_of(tr, rows)
    fig = charts.gantt([("measured · ", rows, bars), ("simulated · ", rows, bars)], "Timeline: t")
    assert fig.layout.title.text == "Timeline: t"
    names = [d.name for d in fig.data]
    assert len(names) == 2 * len(set(names)) and set(names) <= set(charts.KIND_COLORS)
    assert [d.showlegend for d in fig.data].count(True) == len(set(names))
    ticks = list(fig.layout.yaxis.ticktext)
    assert len(ticks) == 2 * len(rows) and ticks[len(rows)] == "simulated · GPU0 block 0"
    assert max(max(d.y) for d in fig.data) == 2 * len(rows) - 1
    html = charts.to_html(fig)
    assert html.startswith(b"<!doctype html>") and b"plotly.js v" in html  # self-contained
    png = charts.gantt_png([("", rows, bars)], "Timeline: t")
    assert png.startswith(b"\x89PNG")


def test_metric_tables_flatten():
    assert metrics_table.rows({"latency_us": 12.5, "busy": {"gemm0": 3}}) == [
        {"metric": "latency_us", "value": "12.5"}, {"metric": "busy.gemm0", "value": "3"}]


def test_routing_tables_match_the_plan():
    cfg = presets.get("tiny")
    t = routing_tables(cfg)
    assert t.kept.sum() == t.summary["rows"]
    assert t.bytes_between.sum() == sum(t.summary[f"bytes_{k}"] for k in ("local", "nvlink", "network"))
    assert t.kept.sum() + t.dropped.sum() == cfg.ranks * cfg.tokens * cfg.top_k
    assert (np.diag(t.link) == 0).all()


def test_empty_window_draws_nothing():
    tb = TraceBuilder()
    tb.add(0, 0, 0, "processor", "gemm0", 0, 10)
    tr = tb.build()
    rows = lanes.rows_of(tr)
    assert len(lanes.bars_of(tr, rows, window=(20.0, 30.0))) == 0
