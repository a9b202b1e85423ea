"""The Streamlit app's entry (`moelab app` runs `streamlit run` on this file): the five pages.

Simulate: a config's simulated timeline and metrics. Compare: a measured run next to its
prediction. Benchmarks: a GPU benchmark run's table, its GEMM phases against the memory's
roofline and its speedups over torch. Fences: the Perseus story across nodes and transports.
Golden: the routing of a config.
"""

import sys
from pathlib import Path

import streamlit as st

# `streamlit run app/main.py` puts app/ first on sys.path; the pages import the `app` package
# and its siblings (`reference`, `sim`) from the repository root, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import forms  # noqa: E402

st.set_page_config(page_title="moelab", layout="wide")
forms.keep_state()
PAGES = Path(__file__).parent / "views"
st.navigation([
    st.Page(PAGES / "simulate.py", title="Simulate", default=True),
    st.Page(PAGES / "compare.py", title="Compare"),
    st.Page(PAGES / "bench.py", title="Benchmarks"),
    st.Page(PAGES / "fences.py", title="Fences"),
    st.Page(PAGES / "golden.py", title="Golden"),
]).run()
