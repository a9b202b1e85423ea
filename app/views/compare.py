"""Compare page: a committed measured run next to its simulated prediction, on one time axis."""

import streamlit as st

from app import charts, compare_data, downloads, lanes
from reference import ConfigError
from sim import TRANSPORTS, hardware
from sim.trace import Trace


@st.cache_resource(max_entries=4, show_spinner=False)
def comparison(path: str, hw: str, transport: str):
    return compare_data.compare(Trace.load(path), hw, transport)


st.title("Compare: measured against simulated")
folder = compare_data.measurements_dir()
paths = compare_data.measured_traces(folder)
if not paths:
    st.info(f"No measured runs yet: {folder} holds no telemetry trace (a sim.trace .npz whose "
            "meta names its config). Runs of the kernel with telemetry, committed there, appear "
            "here next to their simulated prediction.")
else:
    path = st.selectbox("measured run", paths, format_func=lambda p: str(p.relative_to(folder)))
    hw0, tr0 = compare_data.run_options(Trace.load(path).meta)
    left, right = st.columns(2)
    hw = left.selectbox("simulated hardware", list(hardware.PRESETS),
                        index=list(hardware.PRESETS).index(hw0))
    transport = right.selectbox("simulated transport", list(TRANSPORTS),
                                index=list(TRANSPORTS).index(tr0))
    try:
        with st.spinner("simulating the measured config"):
            c = comparison(str(path), hw, transport)
    except ConfigError as e:
        st.error(f"{path.name} names a config that is not valid: {e}")
        st.stop()
    panels = []
    for label, tr in (("measured · ", c.measured), ("simulated · ", c.simulated)):
        rows = lanes.rows_of(tr)
        # half the bar budget each: the two panels share one chart
        panels.append((label, rows, lanes.bars_of(tr, rows, max_bars=lanes.MAX_BARS // 2)))
    title = f"Timeline: {c.config.name} measured vs simulated ({hw}, {transport})"
    fig = charts.gantt(panels, title)
    st.plotly_chart(fig, key="compare.timeline")
    downloads.figure(fig, f"{path.stem}-vs-simulated", png=lambda: charts.gantt_png(panels, title))
    st.subheader("Predicted against measured")
    st.dataframe([{**r, "relative error": None if r["relative error"] is None
                   else f"{100 * r['relative error']:+.1f}%"} for r in c.errors],
                 hide_index=True)
    left, right = st.columns(2)
    with left:
        downloads.trace(c.measured, f"{path.stem}-measured")
    with right:
        downloads.trace(c.simulated, f"{path.stem}-simulated")
