"""Simulate page: a config's simulated layer call as a Gantt timeline, with its metrics."""

import numpy as np
import streamlit as st

import sim
from app import charts, downloads, forms, lanes, metrics_table
from reference import Config


@st.cache_resource(max_entries=4, show_spinner=False)
def simulate(cfg_dict: dict, hardware: str, transport: str, baseline: bool, queue: str | None, dispatch: str | None,
             staged_blocks: int):
    return sim.simulate(Config.from_dict(cfg_dict), hardware=hardware, transport=transport,
                        baseline=baseline, queue=queue, dispatch=dispatch, staged_blocks=staged_blocks)


def default_gpus(cfg: Config, ranks: list[int]) -> list[int]:
    """The first four GPUs, and the first GPU of the second node when there is one."""
    shown = ranks[:4]
    if cfg.nodes > 1 and cfg.gpus_per_node in ranks and cfg.gpus_per_node not in shown:
        shown.append(cfg.gpus_per_node)
    return shown


st.title("Simulate: one MoE layer call, tile by tile")
cfg, opt = forms.config_sidebar("cfg", sim_options=True, job="sim")
if cfg is not None:
    with st.spinner(f"simulating {cfg.name} on {cfg.ranks} {opt.hardware} GPUs ({opt.transport})"):
        result = simulate(cfg.to_dict(), opt.hardware, opt.transport, opt.baseline, opt.queue, opt.dispatch,
                          opt.staged_blocks)
    trace = result.trace
    ranks = sorted(int(r) for r in np.unique(trace["rank"]))
    end_us = float(trace["end"].max()) / 1e3 if len(trace) else 1.0
    pick, span = st.columns([2, 3])
    shown = pick.multiselect("GPUs shown", ranks, default=default_gpus(cfg, ranks),
                             help="every GPU's lanes are in the metrics; draw the ones to look at")
    window = span.slider("time window (µs)", 0.0, end_us, (0.0, end_us), format="%.1f",
                         help="zoom here to re-aggregate at a finer time step; drag on the chart "
                              "to zoom into what is drawn")
    sub = trace.select(np.isin(trace["rank"], shown))
    what = "bulk-synchronous baseline" if opt.baseline else \
        f"single kernel ({trace.meta['queue']} queue, {trace.meta['dispatch']} dispatch)"
    title = f"Timeline: {cfg.name}, {what} on {opt.hardware}, {opt.transport}"
    chart, table = st.columns([3, 1])
    with chart:
        if len(sub):
            rows = lanes.rows_of(sub)
            bars = lanes.bars_of(sub, rows, window=(window[0] * 1e3, window[1] * 1e3))
            panels = [("", rows, bars)]
            fig = charts.gantt(panels, title)
            st.plotly_chart(fig, key="sim.timeline")
            hw = sim.hardware.get(opt.hardware)
            st.caption(f"A processor row is one of the kernel's processor blocks, not an SM: {opt.hardware} runs "
                       f"{hw.processors} on each GPU ({hw.blocks_per_sm} per SM on {hw.sms} SMs, one block kept "
                       "for the scheduler and subscriber warps).")
            if bars.exact:
                st.caption(f"{len(bars):,} intervals in {len(rows)} lanes, each drawn as it is.")
            else:
                st.caption(
                    f"{len(sub):,} intervals in {len(rows)} rows drawn "
                    f"as {len(bars):,} bars: each row is cut into {bars.bin_ns / 1e3:.3g} µs bins "
                    f"(at most {lanes.MAX_BARS:,} bars in all, the bound that stays responsive); a "
                    "bar's colour is the busiest kind, its opacity the share of the row's lanes "
                    "busy, its hover the breakdown. Narrow the time window for exact intervals.")
            downloads.figure(fig, f"{cfg.name}-timeline",
                             png=lambda: charts.gantt_png(panels, title))
        else:
            st.info("Pick at least one GPU to draw.")
        downloads.trace(trace, f"{cfg.name}-{opt.transport}")
    with table:
        st.subheader("Metrics")
        st.dataframe(metrics_table.rows(result.metrics), hide_index=True)
