"""Download buttons: every chart as HTML (self-contained) or PNG, every trace as Perfetto JSON.

The files are made only when a button is clicked (Streamlit calls the data function then), so a
large trace costs nothing until someone asks for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import plotly.graph_objects as go
import streamlit as st

from sim.trace import Trace

from .charts import to_html


def figure(fig: go.Figure, name: str, png: Callable[[], bytes] | None = None) -> None:
    """Download buttons for `fig`: HTML, and PNG when a PNG maker is given."""
    cols = st.columns(2 if png else 1)
    cols[0].download_button("chart as HTML", lambda: to_html(fig), file_name=f"{name}.html",
                            mime="text/html", key=f"dl.{name}.html", on_click="ignore")
    if png:
        cols[1].download_button("chart as PNG", png, file_name=f"{name}.png", mime="image/png",
                                key=f"dl.{name}.png", on_click="ignore")


def trace(tr: Trace, name: str) -> None:
    """A download button for `tr` as Chrome/Perfetto trace JSON (opens in ui.perfetto.dev)."""
    st.download_button("trace as Perfetto JSON", lambda: json.dumps(tr.to_perfetto()),
                       file_name=f"{name}.perfetto.json", mime="application/json",
                       key=f"dl.{name}.perfetto", on_click="ignore",
                       help="open it in ui.perfetto.dev or chrome://tracing")
