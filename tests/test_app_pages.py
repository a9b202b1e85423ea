"""Every page of the app under streamlit.testing's AppTest: it runs on the default config without
exceptions, a changed widget reruns it and changes what it shows, a bad config shows its error."""

import json
from pathlib import Path

import numpy as np
import pytest
from app_traces import pipeline_trace
from streamlit.testing.v1 import AppTest

import sim
from reference import presets
from sim.calibrate import MEASUREMENTS
from sim.trace import META_VERSION, ROLE

# the Simulate, Compare and Fences pages run the simulator (sim.simulate, being written)
needs_sim = pytest.mark.skipif(not hasattr(sim, "simulate"), reason="sim.simulate has not landed")

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


def page(name: str, timeout: float = 120) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=timeout).run()
    if name != "simulate":
        at.switch_page(f"views/{name}.py").run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def table(at: AppTest) -> list[dict]:
    """The page's one table, as records."""
    return at.dataframe[0].value.to_dict("records")


def metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def set_field(at: AppTest, field: str, value, form: str = "cfg") -> AppTest:
    at.sidebar.number_input(key=f"{form}.{field}").set_value(value).run()
    return at


def test_golden_page_routes_the_default_config_and_follows_the_form():
    at = page("golden")
    before = metrics(at)
    assert int(before["routed rows"].replace(",", "")) > 0
    set_field(at, "tokens", 2048)
    assert not at.exception and metrics(at)["routed rows"] != before["routed rows"]


def test_golden_page_shows_a_bad_config_next_to_its_field():
    at = set_field(page("golden"), "hidden", 100)
    assert not at.exception and not at.metric
    messages = [e.value for e in at.error]
    assert any("'hidden' = 100" in m and "multiple of tile_k" in m for m in messages)
    assert any("'hidden' = 100" in e.value for e in at.sidebar.error)


@needs_sim
def test_compare_page_says_plainly_when_nothing_was_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("compare")
    assert any("No measured runs yet" in i.value for i in at.info)


@needs_sim
def test_simulate_page_draws_the_timeline_and_metrics_of_the_default_config():
    at = page("simulate")
    chart = at.get("plotly_chart")[0].proto.spec
    assert '"Timeline: small' in chart
    before = table(at)
    assert before and all(set(r) == {"metric", "value"} for r in before)
    set_field(at, "tokens", 2048)
    assert not at.exception and table(at) != before


@needs_sim
def test_simulate_page_reruns_on_transport_and_shows_a_bad_config():
    at = page("simulate")
    before = table(at)
    at.sidebar.checkbox(key="sim.baseline").check().run()
    assert not at.exception and table(at) != before
    set_field(at, "experts", 6)
    assert any("'experts' = 6" in e.value for e in at.sidebar.error)
    assert not at.get("plotly_chart")


@needs_sim
def test_simulate_page_reruns_on_the_queue_rule():
    at = page("simulate")
    chart = at.get("plotly_chart")[0].proto.spec
    assert "(tile queue, staged dispatch)" in chart  # the default config is float32: its kernel queues each tile
    at.sidebar.selectbox(key="sim.queue").set_value("expert").run()
    assert not at.exception and "(expert queue, staged dispatch)" in at.get("plotly_chart")[0].proto.spec


@needs_sim
def test_simulate_page_reruns_on_the_dispatch_and_its_senders():
    at = page("simulate")
    before = table(at)
    at.sidebar.number_input(key="sim.staged_blocks").set_value(2).run()
    assert not at.exception and table(at) != before  # two senders carry every peer's chunks
    at.sidebar.selectbox(key="sim.dispatch").set_value("store").run()
    assert not at.exception and "store dispatch" in at.get("plotly_chart")[0].proto.spec
    assert at.sidebar.number_input(key="sim.staged_blocks").disabled


@needs_sim
def test_simulate_page_reruns_on_the_gemm_precision():
    at = page("simulate")
    before = metrics_of(at)
    at.sidebar.selectbox(key="cfg.precision").set_value("tf32x3").run()
    split = metrics_of(at)
    at.sidebar.selectbox(key="cfg.precision").set_value("tf32").run()
    tf32 = metrics_of(at)
    assert not at.exception
    # three TF32 products per float32 one: between TF32's time and the FMAs' (the H100 preset's rates)
    assert tf32["latency_ns"] < split["latency_ns"] < before["latency_ns"]
    at.sidebar.selectbox(key="cfg.precision").set_value("bfloat16").run()
    assert not at.exception and metrics_of(at)["latency_ns"] < tf32["latency_ns"]


def metrics_of(at: AppTest) -> dict:
    """The metrics table as numbers by name."""
    return {r["metric"]: float(r["value"]) for r in table(at) if _number(r["value"])}


def _number(text) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def gpu_run(tr):
    """A test trace as a kernel telemetry run on an H200 (what sim.compare reads), with the meta the
    kernel's telemetry writes (sim.trace.META_KEYS)."""
    processors = int(np.unique(tr["lane"][tr["role"] == ROLE["processor"]]).size)
    tr.meta = {**{k: v for k, v in tr.meta.items() if k != "producer"}, "meta_version": META_VERSION,
               "source": "gpu", "gpu": "NVIDIA H200", "processors": processors, "dispatch": "staged",
               "staged_blocks": 16, "queue": "tile"}
    return tr


def calibrated_tile(tr):
    """The run's config at the tile shape the committed H200 float32 calibration measured."""
    m, n, k = json.loads((MEASUREMENTS / "calibrated-h200.json").read_text())["dtypes"]["float32"]["tile"]
    tr.meta["config"] = presets.get(tr.meta["config"]["name"]).replace(tile_m=m, tile_n=n, tile_k=k).to_dict()
    return tr


@needs_sim
def test_compare_page_puts_a_measured_run_beside_its_prediction(tmp_path, monkeypatch):
    calibrated_tile(gpu_run(pipeline_trace(ranks=2, blocks=8, config="tiny"))).save(tmp_path / "tiny-run.npz")
    (tmp_path / "not-a-trace.npz").write_bytes(b"junk")
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("compare")
    spec = at.get("plotly_chart")[0].proto.spec
    assert '"Timeline: tiny measured vs simulated (h200-sxm+calibrated' in spec  # sim.compare's preset
    errors = table(at)
    assert {"quantity", "predicted", "measured", "error", "bound", "holds"} == set(errors[0])
    assert errors[0]["quantity"] == "layer latency (ms)" and errors[0]["bound"] == "±10%"
    tasks = at.dataframe[1].value.to_dict("records")  # the second table: each phase's tasks
    phases = [t["phase"] for t in tasks]
    # each phase, then its parts ("combine: final" ...) right after it
    assert {"gemm0", "gemm1"} <= set(phases)
    assert phases == sorted(phases, key=lambda p: sim.compare.PHASES.index(p.split(":")[0]))
    assert all(t["measured_tasks"] > 0 and t["predicted_p50_us"] > 0 for t in tasks if t["phase"].startswith("gemm"))
    at.selectbox[1].set_value("h100-sxm").run()
    assert not at.exception and table(at) != errors


@needs_sim
def test_compare_page_names_a_run_the_calibration_does_not_cover(tmp_path, monkeypatch):
    gpu_run(pipeline_trace(ranks=2, blocks=8, config="tiny")).save(tmp_path / "tiny-run.npz")  # 32x32x8 tiles
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("compare")
    assert any("'dtypes.float32.tile' = '32x32x8'" in e.value for e in at.error)
    assert not at.get("plotly_chart")
    at.selectbox[1].set_value("h200-sxm").run()  # a named preset predicts any run
    assert not at.exception and at.get("plotly_chart")


@needs_sim
def test_compare_page_names_a_measured_run_whose_config_is_bad(tmp_path, monkeypatch):
    tr = gpu_run(pipeline_trace(ranks=1, blocks=2, tasks=2))
    tr.meta["config"]["tokens"] = 0
    tr.save(tmp_path / "bad-run.npz")
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("compare")
    assert any("bad-run.npz" in e.value and "'tokens' = 0" in e.value for e in at.error)


@needs_sim
def test_fences_page_sets_ibrc_beside_perseus_and_follows_the_form():
    at = page("fences")
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert any('"Timeline: node 0 proxy and NIC, ibrc' in s for s in specs)
    before = table(at)
    set_field(at, "tokens", 192, "fences")
    assert not at.exception and table(at) != before
    set_field(at, "gpus_per_node", 3, "fences")
    assert any("'ranks' = 4" in e.value for e in at.sidebar.error)


@needs_sim
def test_fences_page_runs_every_transport_on_a_perseus_model():
    at = page("fences")
    at.selectbox(key="perseus.model").set_value("qwen3-30b-a3b")
    at.selectbox(key="perseus.gpus").set_value(8)
    at.button(key="perseus.run").click().run()
    assert not at.exception
    rows = at.dataframe[1].value.to_dict("records")
    assert [r["transport"] for r in rows] == list(sim.TRANSPORTS)
    # one node of 8 GPUs: nothing crosses a NIC, so every transport takes as long and fences nothing
    assert {r["latency_ms"] for r in rows} == {rows[0]["latency_ms"]} and not any(r["fences"] for r in rows)


def bench_summary(folder, gpu="NVIDIA H200", memory_gbps=None, stream_gbps=None):
    """A made-up bench_gpu summary of the bf16 FlashMoE layer at 1K tokens on one and two GPUs
    (and a weight-stream file for its GPU) under folder/gpu/."""
    (folder / "gpu").mkdir(parents=True, exist_ok=True)
    meta = {"gpus_seen": [gpu], "driver": "580", "commit": "0" * 40, "command": "bench",
            "fp32_ceiling_tflops": 50.0, "bf16_ceiling_tflops": 800.0, "tf32_ceiling_tflops": 400.0,
            "nvlink_gbps": 400.0, **({"memory_gbps": memory_gbps} if memory_gbps else {})}
    results = []
    for p in (1, 2):
        cfg = presets.get("flashmoe").replace(ranks=p, tokens=1024, precision="bfloat16", tile_m=128, tile_n=256,
                                               tile_k=64)
        results.append({"name": f"bench-flashmoe-tokens-1k-bf16-p{p}", "config": cfg.to_dict(),
                         "kept_rows": 2048 * p, "kernel_ms": 0.4 / p, "kernel_telemetry_ms": 0.41 / p,
                         "torch_bfloat16_ms": 1.2, "gemm_ms_per_proc": 0.3, "sm_utilization": 0.8,
                         "send_counts": [[32] * 64] * p, **({"torch_experts_bfloat16_ms": 0.32} if p == 1 else {})})
    (folder / "gpu" / "x-bench-bf16.json").write_text(json.dumps({"meta": meta, "results": results}))
    if stream_gbps:
        (folder / "gpu" / "x-weight-stream.json").write_text(json.dumps(
            {"gpu": gpu, "variants": [{"weight_gbps": stream_gbps / 2}, {"weight_gbps": stream_gbps}]}))


def test_bench_page_sets_each_gemm_phase_against_the_weights_roofline(tmp_path, monkeypatch):
    bench_summary(tmp_path, stream_gbps=4000.0)
    (tmp_path / "gpu" / "x-experiments.json").write_text(json.dumps({"meta": {}, "experiments": []}))
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("bench")
    assert [s.value.name for s in at.selectbox] == ["x-bench-bf16.json"]  # the experiments file is no run
    # no rate in the run: the fastest weight stream measured on its GPU
    assert at.number_input(key="bench.gbps.x-bench-bf16.json").value == 4000.0
    rows = {r["point"]: r for r in table(at)}
    # 2048 kept rows over 64 experts: 32 FLOPs a bf16 weight byte, at 4000 GB/s 128 TFLOP/s, 16% of 800
    assert rows["bench-flashmoe-tokens-1k-bf16-p1"]["weights' bound % ceil"] == pytest.approx(16.0)
    assert rows["bench-flashmoe-tokens-1k-bf16-p2"]["rows an expert"] == pytest.approx(64.0)
    assert rows["bench-flashmoe-tokens-1k-bf16-p1"]["speedup"] == pytest.approx(3.0)
    # both points beat torch; their GEMM phases (14% each) sit under bounds (16% and 32%) under 60:
    # 88% of the first's, 44% of the second's
    shown = metrics(at)
    assert shown.pop("kernel / roofline, median") == \
        f"{sorted(r['kernel / roofline'] for r in rows.values())[1]:.2f}"
    # the one-GPU point timed torch's experts alone: 0.4 ms over 0.32; the other has none
    assert rows["bench-flashmoe-tokens-1k-bf16-p2"]["kernel / torch experts"] == ""
    assert shown == {"points": "2", "faster than torch": "2 of 2", "GEMM phase at 60% or more": "0 of 2",
                     "roofline under 60%": "2", "at 60% of their roofline": "1 of 2",
                     "kernel / torch experts, median": "1.25"}
    # one GPU streams all 64 experts' bf16 weights from memory at 4000 GB/s
    one = rows["bench-flashmoe-tokens-1k-bf16-p1"]
    cfg = presets.get("flashmoe")
    assert one["bound"] == "weights"
    assert one["roofline ms"] == pytest.approx(64 * 2 * cfg.hidden * cfg.ffn * 2 / 4000e6)
    assert one["kernel / roofline"] == pytest.approx(0.4 / one["roofline ms"])
    assert rows["bench-flashmoe-tokens-1k-bf16-p1"]["GEMM phase % roofline"] == pytest.approx(
        100 * rows["bench-flashmoe-tokens-1k-bf16-p1"]["GEMM phase % ceil"] / 16.0)
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert "GEMM phase over kept rows an expert" in specs[0]
    assert "bfloat16 weights' roofline (4000 GB\\u002fs)" in specs[0]  # plotly escapes the slash
    assert "torch time over kernel time" in specs[1]
    at.number_input(key="bench.gbps.x-bench-bf16.json").set_value(8000.0).run()
    assert not at.exception
    assert {r["point"]: r for r in table(at)}["bench-flashmoe-tokens-1k-bf16-p1"]["weights' bound % ceil"] == \
        pytest.approx(32.0)


def test_bench_page_lists_torch_only_layers_and_skipped_points(tmp_path, monkeypatch):
    bench_summary(tmp_path, memory_gbps=3000.0)
    path = tmp_path / "gpu" / "x-bench-bf16.json"
    d = json.loads(path.read_text())
    cfg = presets.ZOO["qwen3-30b-a3b"].to_dict()
    d["results"] += [{"name": "matrix-qwen3-30b-a3b-bf16-p4", "config": cfg, "kernel_skipped": "not in the kernel: x",
                      "torch_dropless_bfloat16_ms": 3.5, "send_counts": [[256] * 128] * 4, "kept_rows": 4 * 32768},
                     {"name": "matrix-big-p4", "config": cfg, "skipped": "needs 99 GB a GPU"}]
    path.write_text(json.dumps(d))
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("bench")
    assert not at.exception
    assert any("matrix-big-p4: needs 99 GB a GPU" in c.value for c in at.caption)
    alone = at.dataframe[1].value.to_dict("records")
    assert [(r["point"], r["dropless torch ms"], r["kernel ms"]) for r in alone] == [
        ("matrix-qwen3-30b-a3b-bf16-p4", 3.5, "not in the kernel: x")]
    assert alone[0]["bound"] == "nvlink" and alone[0]["roofline ms"] > 0


def test_bench_page_takes_the_runs_own_memory_rate(tmp_path, monkeypatch):
    bench_summary(tmp_path, memory_gbps=3000.0, stream_gbps=4000.0)
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("bench")
    assert at.number_input(key="bench.gbps.x-bench-bf16.json").value == 3000.0
    assert table(at)[0]["weights' bound % ceil"] == pytest.approx(12.0)


def test_bench_page_says_plainly_when_nothing_was_benchmarked(tmp_path, monkeypatch):
    monkeypatch.setenv("MOELAB_MEASUREMENTS", str(tmp_path))
    at = page("bench")
    assert any("No benchmark runs yet" in i.value for i in at.info) and not at.dataframe


def test_bench_page_opens_on_the_committed_four_gpu_bf16_run():
    at = page("bench")
    assert at.selectbox[0].value.name == "h200x4-bench-bf16-fcd262e.json"
    assert len(table(at)) == 30 and len(at.get("plotly_chart")) == 2
