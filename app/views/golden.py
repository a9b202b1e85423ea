"""Golden page: how a config routes its tokens (tokens per expert, drops, bytes between GPUs)."""

import numpy as np
import streamlit as st

from app import charts, downloads, forms
from app.golden_data import link_names, routing_tables
from reference import Config


@st.cache_data(max_entries=8, show_spinner=False)
def tables(cfg_dict: dict):
    return routing_tables(Config.from_dict(cfg_dict))


st.title("Golden: the routing of a config")
cfg, _ = forms.config_sidebar("cfg")
if cfg is not None:
    with st.spinner(f"routing {cfg.ranks} x {cfg.tokens} tokens"):
        t = tables(cfg.to_dict())
    s = t.summary
    cols = st.columns(5)
    cols[0].metric("routed rows", f"{s['rows']:,}")
    cols[1].metric("dropped assignments", f"{s['dropped']:,}",
                   help=f"of {s['assignments']:,} (token, choice) pairs; capacity "
                        f"{'none' if t.capacity is None else f'{t.capacity} rows per (GPU, expert)'}")
    cols[2].metric("tiles", f"{s['tiles']:,}")
    cols[3].metric("NVLink bytes", f"{s['bytes_nvlink']:,}")
    cols[4].metric("network bytes", f"{s['bytes_network']:,}")

    names = [f"E{e}" for e in range(cfg.experts)] + [f"S{s}" for s in range(cfg.shared_experts)]
    dropped = np.r_[t.dropped, np.zeros(cfg.shared_experts, np.int64)]
    fig = charts.grouped_bars(names, {"kept": t.kept.tolist(), "dropped": dropped.tolist()},
                              f"Tokens per expert: {cfg.name}", "rows", stacked=True)
    st.plotly_chart(fig, key="golden.experts")
    downloads.figure(fig, f"{cfg.name}-tokens-per-expert")

    fig = charts.heatmap(t.bytes_between, f"Bytes per (source, destination) GPU: {cfg.name}",
                         "destination GPU", "source GPU", "bytes", text=link_names(t.link))
    st.plotly_chart(fig, key="golden.bytes")
    downloads.figure(fig, f"{cfg.name}-bytes-between-gpus")
    st.caption("Dispatch and combine tiles, padding-free; the diagonal stays on its GPU (local "
               "copy), NVLink joins GPUs of one node, the network the rest.")
    st.dataframe([{"quantity": k, "value": v} for k, v in s.items()], hide_index=True)
