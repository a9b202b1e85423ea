"""Metrics of a hand-made trace (any producer), the Perfetto/npz round trip, the timeline
picture and the `moelab sim` command."""

import json

import numpy as np
import pytest

import sim
from moelab.cli import main
from reference import presets
from sim import metrics, sweeps, timeline
from sim.trace import Trace, TraceBuilder


def hand_trace() -> Trace:
    """2 GPUs of 2 processors on 2 nodes; GPU 1 finishes last at 1000 ns."""
    tb = TraceBuilder()
    tb.add(0, 0, 0, "processor", "gemm0", 0, 400, expert=0, tile=0)
    tb.add(0, 0, 1, "processor", "gemm1", 100, 300, expert=0, tile=0)
    tb.add(0, 0, 1, "processor", "idle", 300, 900)
    tb.add(1, 1, 0, "processor", "combine", 700, 1000, tile=0)
    tb.add(0, 0, 0, "link", "put", 0, 50, tile=0, peer=0, nbytes=64)
    tb.add(0, 0, 0, "nic", "put", 400, 600, tile=0, peer=1, nbytes=1000)
    tb.add(0, 0, 0, "proxy", "put", 380, 400, tile=0, peer=1, nbytes=1000)
    tb.add(0, 0, 0, "proxy", "fence", 400, 650, peer=1)
    tb.add(0, 0, 0, "nic", "signal", 660, 690, peer=1)
    return tb.build({"producer": "test", "processors": 2})


def test_metrics_of_a_hand_made_trace():
    cfg = presets.get("tiny-nodrop").replace(ranks=2, gpus_per_node=1)
    m = metrics.compute(hand_trace(), cfg, latency_2gpu_ns=800.0)
    assert m["latency_ns"] == 1000
    assert m["sm_utilization"]["max"] == pytest.approx(600 / 2000)
    assert m["sm_utilization"]["min"] == pytest.approx(300 / 2000)
    assert m["bytes"] == {"local": 64, "nvlink": 0, "network": 1000}
    assert m["fences"] == {"total": 1, "blocking": 1, "nic_ordered": 0}
    assert m["signals"] == 1
    assert m["proxy_blocked_us"]["total"] == pytest.approx(0.25)
    assert m["overlap_efficiency"] == pytest.approx(0.8)
    cp = m["critical_path"]
    # GPU 1 computes 700..1000; the proxy's and NIC's work addressed to it covers 380..650, 660..690
    assert cp["gpu"] == 1 and cp["last_kind"] == "combine"
    assert cp["compute_us"] == pytest.approx(0.3)
    assert cp["exposed_comm_us"] == pytest.approx(0.3)
    assert cp["idle_us"] == pytest.approx(0.4)


def test_union_of_intervals():
    s, e = np.array([0.0, 5, 1, 20]), np.array([2.0, 6, 3, 21])
    assert metrics.union_ns(s, e) == 5.0


def test_trace_round_trips_and_exports(tmp_path):
    r = sim.simulate(presets.get("tiny-nodrop"), transport="perseus")
    r.trace.save(tmp_path / "t.npz")
    back = Trace.load(tmp_path / "t.npz")
    assert back.meta["transport"] == "perseus" and back.meta["config"]["name"] == "tiny-nodrop"
    assert metrics.compute(back, presets.get("tiny-nodrop")) == r.metrics
    r.trace.save(tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sum(ev["ph"] == "X" for ev in events) == len(r.trace)


@pytest.mark.parametrize("suffix", [".png", ".html"])
def test_timeline_picture(tmp_path, suffix):
    r = sim.simulate(presets.get("tiny-nodrop"), transport="ibrc")
    path = timeline.render(r.trace, tmp_path / f"t{suffix}")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"data:image/png;base64," in data


def test_cli_table_json_trace_and_timeline(tmp_path, capsys):
    assert main(["sim", "--config", "tiny-nodrop", "--nodes", "2", "--transport", "ibrc", "--quiet",
                 "--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.html")]) == 0
    out = capsys.readouterr().out
    assert "fences.blocking" in out and "latency_ms" in out and "overlap_efficiency" in out
    assert (tmp_path / "t.json").exists() and (tmp_path / "t.html").exists()
    assert main(["sim", "--config", "tiny", "--baseline", "--json"]) == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert d["kernel"] == "baseline" and d["latency_ms"] > 0 and d["bytes.nvlink"] > 0
    assert "simulating" in captured.err  # progress on stderr


def test_cli_nodes_sweep_prints_the_perseus_tables(monkeypatch, capsys):
    monkeypatch.setattr(sweeps, "NODES", (1, 2))
    monkeypatch.setattr(sweeps, "GPUS_PER_NODE", 1)
    monkeypatch.setattr(sweeps, "COMM_BOUND", presets.get("tiny-nodrop").replace(ranks=2, gpus_per_node=2))
    assert main(["sim", "--sweep", "nodes", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "latency (ms) vs nodes" in out and "ibrc/ibgda" in out and "fences, signals" in out
