"""Benchmarks page: a committed GPU benchmark run (benchmarks/bench_gpu.py) as its table (each point
against the torch layers and its roofline), its GEMM phases against the memory's roofline, and its
speedups over the fastest torch layer."""

import numpy as np
import streamlit as st

from app import bench_data, charts, downloads

BAR = 60.0  # the project's bar: GEMM phases at 60% or more of the dtype's matmul ceiling

st.title("Benchmarks: the kernel against torch and the memory's roofline")
files = bench_data.summaries()
if not files:
    st.info(f"No benchmark runs yet: {bench_data.measurements_dir() / 'gpu'} holds no summary of "
            "`benchmarks/bench_gpu.py` (a JSON with meta and results that time the kernel).")
    st.stop()
default = next((i for i, p in enumerate(files) if p.name == "h200x4-bench-bf16-fcd262e.json"), 0)
path = st.selectbox("benchmark run", files, index=default, format_func=lambda p: p.name)
meta, results = bench_data.load(path)
gpu = (meta.get("gpus_seen") or ["unknown GPU"])[0]
st.caption(f"{len(meta.get('gpus_seen', []))} x {gpu}, driver {meta.get('driver', '?')}, commit "
           f"{str(meta.get('commit', '?'))[:7]}: `{meta.get('command', '')}`")
measured = meta.get("memory_gbps")
fallback = bench_data.stream_gbps(gpu)
gbps = st.number_input(
    "memory rate for the roofline (GB/s)", min_value=100.0, max_value=20000.0, step=50.0,
    value=float(measured or fallback or 3000.0), key=f"bench.gbps.{path.name}",
    help="measured by the run (torch copy and sum of 1 GiB)" if measured else
    ("not measured by this run: the fastest weight stream measured on this GPU "
     "(benchmarks/weight_stream.py)" if fallback else "not measured on this GPU: set it"))
rows = bench_data.rows(meta, results, gbps)
if meta.get("nvlink_gbps"):
    st.caption(f"NVLink of one GPU to its peers, measured by the run: {meta['nvlink_gbps']:.0f} GB/s")
for line in bench_data.skipped(results):
    st.caption(f"not timed: {line}")
held, faster, cannot = (sum(1 for r in rows if r["GEMM phase % ceil"] >= BAR), sum(1 for r in rows if r["speedup"] > 1),
                        sum(1 for r in rows if r["weights' bound % ceil"] < BAR))
of_roofline = sum(1 for r in rows if r["GEMM phase % roofline"] >= BAR)
roofs = [r["kernel / roofline"] for r in rows if isinstance(r["kernel / roofline"], float)]
over_experts = [r["kernel / torch experts"] for r in rows if isinstance(r["kernel / torch experts"], float)]
cols = st.columns(7)
cols[0].metric("points", len(rows))
cols[1].metric("faster than torch", f"{faster} of {len(rows)}",
               help="than the fastest torch layer the run timed (dropless, per-expert matmuls or padded)")
cols[2].metric(f"GEMM phase at {BAR:g}% or more", f"{held} of {len(rows)}")
cols[3].metric(f"roofline under {BAR:g}%", cannot,
               help="points whose weights' roofline, at the memory rate above, leaves the bar out of reach")
cols[4].metric(f"at {BAR:g}% of their roofline", f"{of_roofline} of {len(rows)}",
               help="points whose GEMM phase reaches the bar's share of the lesser of the ceiling and the weights' "
                    "roofline: the bar where the memory, not the tensor cores, sets the most a GEMM phase can do")
cols[5].metric("kernel / roofline, median", f"{sorted(roofs)[len(roofs) // 2]:.2f}" if roofs else "-",
               help="each point's latency over its roofline: the largest of its GEMM FLOPs at the matmul ceiling, "
                    "its weight bytes at the memory rate, its NVLink bytes at one GPU's rate to its peers "
                    "(runs from before the send counts were kept have none)")
cols[6].metric("kernel / torch experts, median",
               f"{sorted(over_experts)[len(over_experts) // 2]:.2f}" if over_experts else "-",
               help="each point's latency over the time torch's grouped GEMMs take for its expert FFNs alone, on "
                    "the rows the layer routes (the slowest GPU's): its GEMMs at the rate the fastest library "
                    "reaches at its shapes, the fair bound where that rate is far below the ceiling (runs from "
                    "before the run timed them have none)")
st.dataframe(rows, hide_index=True)

alone = bench_data.torch_only_rows(meta, results, gbps)
if alone:
    st.subheader("Layers the kernel does not run yet, in torch alone")
    st.caption("Each beside its roofline; the kernel ran the layer's twin (its name ends in -twin above).")
    st.dataframe(alone, hide_index=True)

st.subheader("GEMM phase against the weights' roofline")
st.caption("A GEMM task reads its expert's weight slice however few rows the tile holds: with R kept rows an "
           "expert a bf16 weight byte carries R FLOPs (float32: R / 2), so the GEMM phase can at best run at R "
           "times the memory's rate. Left of where a curve crosses the bar, the bar cannot hold.")
curves = bench_data.roofline_curves(meta, results, gbps, list(np.geomspace(8, 8192, 120)))
points = [{**r, "series": f"{r['precision']}, {r['GPUs']} GPU(s)"} for r in rows]
fig = charts.roofline(points, "rows an expert", "GEMM phase % ceil", "series", curves, BAR,
                      f"{path.stem}: GEMM phase over kept rows an expert", "kept rows an expert",
                      "% of the dtype's matmul ceiling")
st.plotly_chart(fig, key="bench.roofline")
downloads.figure(fig, f"{path.stem}-roofline")

st.subheader("Speedup over the fastest torch layer of the same precision")


def layer(r: dict) -> str:
    """The point's layer, without the GPU count (bench-flashmoe-tokens-1k-bf16-p2 -> flashmoe-tokens-1k-bf16)."""
    return r["point"].removeprefix("bench-").rsplit("-p", 1)[0]


names = list(dict.fromkeys(layer(r) for r in rows))
by_gpus = {}
for r in rows:
    by_gpus.setdefault(f"{r['GPUs']} GPU(s)", {})[layer(r)] = r["speedup"]
fig2 = charts.grouped_bars(names, {k: [v.get(n, 0.0) for n in names] for k, v in by_gpus.items()},
                           f"{path.stem}: torch time over kernel time (above 1: the kernel is faster)", "speedup")
st.plotly_chart(fig2, key="bench.speedup")
downloads.figure(fig2, f"{path.stem}-speedup")
