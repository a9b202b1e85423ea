"""Fences page: the Perseus story. Proxy-based transports fence every tile; the fences drain the
NIC and serialize the proxy, so latency grows with nodes; Perseus' fixes remove the stalls."""

import numpy as np
import streamlit as st

from app import charts, downloads, forms, lanes, metrics_table
from reference import Config
from sim import TRANSPORTS, simulate, sweeps
from sim.trace import ROLE

PRESET = "tiny-nodrop"  # 4 GPUs on 2 nodes: a network path to look at, simulated in a moment
STORY = """
Across nodes, a tile goes GPU → **proxy** thread (CPU) → **NIC**. With NVSHMEM's proxy transport
(`ibrc`) each tile's put must be ordered before its completion signal, so the proxy issues a
**fence** after every tile: the fence waits until the NIC has drained every transfer in flight,
and its cost grows with the transfers in flight. With many small experts the compute cannot
hide it and latency grows with the number of nodes. Perseus' fixes: **decoupled** signaling
batches the fences per destination; **NIC-side ordering** puts a fence flag on the NIC's work
request, so the proxy never blocks. `ibgda` (the GPU drives the NIC itself) is the yardstick.
"""


@st.cache_resource(max_entries=8, show_spinner=False)
def run(cfg_dict: dict, transport: str):
    return simulate(Config.from_dict(cfg_dict), transport=transport)


@st.cache_data(max_entries=16, show_spinner=False)
def model_rows(model: str, gpus: int) -> list[dict]:
    """Every transport on one of Perseus' models (sweeps.perseus_layer): the sweep's rows."""
    return sweeps.multinode(sweeps.perseus_layer(model, gpus), nodes=(max(1, gpus // sweeps.GPUS_PER_NODE),),
                            gpus_per_node=min(gpus, sweeps.GPUS_PER_NODE), workers=1)  # no forks of the server


def proxy_and_nic(trace, node: int):
    """The proxy and NIC lanes of one node."""
    keep = (trace["node"] == node) & np.isin(trace["role"], [ROLE["proxy"], ROLE["nic"]])
    return trace.select(keep)


st.title("Fences: hidden serialization across nodes")
st.markdown(STORY)
cfg, _ = forms.config_sidebar("fences", preset=PRESET, job="sim")
if cfg is not None and cfg.nodes < 2:
    st.info(f"{cfg.name} fits on one node: its tiles never reach a proxy or a NIC. Give it more "
            "GPUs than GPUs per node (or pick perseus-comm) to see fences.")
elif cfg is not None:
    st.subheader("One proxy and NIC, per-tile fences against Perseus")
    others = [t for t in TRANSPORTS if t != "ibrc"]
    # Perseus applies both fixes; among the schemes that is the last one listed before ibgda
    fixed = [t for t in others if t != "ibgda"]
    left, right = st.columns(2)
    against = left.selectbox("against", others, index=others.index(fixed[-1]) if fixed else 0)
    node = right.number_input("node", min_value=0, max_value=cfg.nodes - 1, value=0, step=1)
    with st.spinner(f"simulating {cfg.name} with ibrc and {against}"):
        results = {t: run(cfg.to_dict(), t) for t in ("ibrc", against)}
    picked = {t: proxy_and_nic(r.trace, node) for t, r in results.items()}
    end = max(float(tr["end"].max()) for tr in picked.values() if len(tr)) if any(
        len(tr) for tr in picked.values()) else 0.0
    for col, (t, tr) in zip(st.columns(2), picked.items()):
        with col:
            if not len(tr):
                st.info(f"{t}: node {node}'s proxy and NIC did nothing in this layer call.")
                continue
            rows = lanes.rows_of(tr)
            panels = [("", rows, lanes.bars_of(tr, rows, window=(0.0, end)))]
            title = f"Timeline: node {node} proxy and NIC, {t}"
            fig = charts.gantt(panels, title)
            fig.update_xaxes(range=[0, end / 1e3])  # one time scale for both sides
            st.plotly_chart(fig, key=f"fences.timeline.{t}")
            downloads.figure(fig, f"{cfg.name}-proxy-nic-{t}",
                             png=lambda panels=panels, title=title: charts.gantt_png(panels, title))
            downloads.trace(results[t].trace, f"{cfg.name}-{t}")
    st.subheader("Metrics of the layer call")
    flat = {t: metrics_table.flatten(r.metrics) for t, r in results.items()}
    st.dataframe([{"metric": k, **{t: metrics_table.fmt(flat[t].get(k, "")) for t in flat}}
                  for k in flat["ibrc"]], hide_index=True)

st.subheader("Perseus' models across nodes")
st.markdown(f"""The layers Perseus evaluates, from the model zoo, in bf16 at {sweeps.PERSEUS_TOKENS} tokens
per GPU on nodes of {sweeps.GPUS_PER_NODE} GPUs: every transport, with each one's latency over `ibgda`'s
and `ibrc`'s over Perseus'. Decoupled signaling divides the fences by the tiles a GPU sends one peer in one
phase: 8 where a GPU holds 8 experts (Qwen3-30B-A3B and gpt-oss-120b on 16 GPUs, DeepSeek-V3 on 32).""")
left, right = st.columns(2)
model = left.selectbox("model", sweeps.PERSEUS_MODELS, key="perseus.model")
gpus = right.selectbox("GPUs", sweeps.PERSEUS_GPUS, index=1, key="perseus.gpus")
if st.button("simulate every transport", key="perseus.run"):
    with st.spinner(f"simulating {model} on {gpus} GPUs with {len(TRANSPORTS)} transports"):
        rows = model_rows(model, gpus)
    base = {r["transport"]: r for r in rows}
    st.dataframe([{**{k: r[k] for k in ("transport", "latency_ms", "fences", "blocking_fences", "signals",
                                         "proxy_blocked_us")},
                   "over ibgda": r["latency_ms"] / base["ibgda"]["latency_ms"]} for r in rows], hide_index=True)
    st.caption(f"ibrc over perseus: {base['ibrc']['latency_ms'] / base['perseus']['latency_ms']:.2f}x; "
               f"fences ibrc over decoupled: {base['ibrc']['fences'] / max(base['decoupled']['fences'], 1):.1f}x")
