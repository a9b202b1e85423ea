"""Compare page: a committed measured run next to its simulated prediction, on one time axis.
The prediction and the error table are sim.compare's, as `moelab compare` and CI compute them."""

import streamlit as st

from app import charts, compare_data, downloads, lanes
from reference import ConfigError
from sim import compare
from sim.compare import CompareError
from sim.hardware import HardwareError


@st.cache_resource(max_entries=4, show_spinner=False)
def comparison(path: str, hw: str):
    return compare.compare(compare.load_measured(path), hw)


def error_table(c: compare.Comparison) -> list[dict]:
    """The cross-check's rows: each quantity, both sides, its error and bound, and whether it holds."""
    def num(v):
        return None if v is None else float(v)

    return [{"quantity": q, "predicted": num(p), "measured": num(m),
             "error": "" if e is None else (f"{e:+.3f}" if "overlap" in q else f"{100 * e:+.1f}%"),
             "bound": b, "holds": {True: "yes", False: "MISS", None: ""}[ok]} for q, p, m, e, b, ok in c.rows]


st.title("Compare: measured against simulated")
folder = compare_data.measurements_dir()
paths = compare_data.measured_traces(folder)
if not paths:
    st.info(f"No measured runs yet: {folder} holds no kernel telemetry trace (a sim.trace .npz whose "
            "meta says source 'gpu' and names its config). Runs of the kernel with telemetry, committed there, appear "
            "here next to their simulated prediction.")
else:
    path = st.selectbox("measured run", paths, format_func=lambda p: str(p.relative_to(folder)))
    hw = st.selectbox("simulated hardware", compare_data.hardware_choices(),
                      help="calibrated: the preset `moelab calibrate` fitted on this GPU's microbenchmarks "
                           "(measurements/calibrated-<gpu>.json), the one CI holds to the bounds")
    try:
        with st.spinner("simulating the measured config"):
            c = comparison(str(path), hw)
    except (ConfigError, CompareError, HardwareError) as e:
        st.error(f"{path.name} cannot be compared: {e}")
        st.stop()
    panels = []
    for label, tr in (("measured · ", c.run.trace), ("simulated · ", c.predicted)):
        rows = lanes.rows_of(tr)
        # half the bar budget each: the two panels share one chart
        panels.append((label, rows, lanes.bars_of(tr, rows, max_bars=lanes.MAX_BARS // 2)))
    title = f"Timeline: {c.run.config.name} measured vs simulated ({c.hardware.name})"
    fig = charts.gantt(panels, title)
    st.plotly_chart(fig, key="compare.timeline")
    downloads.figure(fig, f"{path.stem}-vs-simulated", png=lambda: charts.gantt_png(panels, title))
    st.subheader("Predicted against measured")
    st.caption("Bounds: layer latency within 10%, each phase's busy time per processor block "
               "within 20%, overlap efficiency within 0.1 absolute.")
    st.dataframe(error_table(c), hide_index=True)
    st.subheader("Tasks, predicted against measured")
    st.caption("Each phase's processor tasks: how many, and the median and 90th percentile of their durations "
               "(us), then a phase's parts apart (\"combine: final\", a shared-expert layer's \"gemm1: shared\"). "
               "Where a phase's busy time is off, this says whether the model has too few tasks or too short ones.")
    st.dataframe(compare.tasks(c), hide_index=True)
    left, right = st.columns(2)
    with left:
        downloads.trace(c.run.trace, f"{path.stem}-measured")
    with right:
        downloads.trace(c.predicted, f"{path.stem}-simulated")
