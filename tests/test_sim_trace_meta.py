"""The trace meta's schema (sim.trace META_KEYS): both producers fill it, readers check it, and files
of the version before it read through one upgrade."""

import json

import numpy as np
import pytest

import sim
from reference import presets
from sim.calibrate import MEASUREMENTS
from sim.trace import META_KEYS, META_VERSION, Trace, TraceError, check_meta, upgrade_meta


def test_a_simulated_trace_fills_the_schema_and_keeps_it_through_a_file(tmp_path):
    cfg = presets.get("tiny").replace(seed=int(np.random.default_rng().integers(1 << 30)))
    trace = sim.simulate(cfg).trace
    check_meta(trace.meta)
    assert trace.meta["source"] == "sim" and trace.meta["config"] == cfg.to_dict()
    trace.save(tmp_path / "t.npz")
    assert Trace.load(tmp_path / "t.npz").meta == trace.meta


def test_a_meta_number_that_is_not_finite_is_saved_as_null_and_reads_back(tmp_path):
    # a kernel's error against an output it left garbage is NaN: the file must still load
    cfg = presets.get("tiny").replace(seed=int(np.random.default_rng().integers(1 << 30)))
    trace = sim.simulate(cfg).trace
    trace.meta.update(rel_err=float("nan"), kernel_ms_all=[1.0, float("inf")], nested={"x": float("-inf")})
    for name in ("t.npz", "t.json"):
        trace.save(tmp_path / name)
    meta = Trace.load(tmp_path / "t.npz").meta
    assert meta["rel_err"] is None and meta["kernel_ms_all"] == [1.0, None] and meta["nested"] == {"x": None}
    assert json.loads((tmp_path / "t.json").read_text(), parse_constant=lambda c: pytest.fail(c))["otherData"][
        "rel_err"] is None


def test_every_committed_measured_trace_reads_as_the_schema():
    paths = sorted((MEASUREMENTS / "gpu").glob("*-trace-*.npz"))
    assert paths
    for path in paths:
        meta = Trace.load(path).meta
        check_meta(meta)
        assert meta["source"] == "gpu" and meta["processors"] > 0, path.name


def test_a_measured_file_from_before_the_schema_is_upgraded():
    rng = np.random.default_rng()
    procs = int(rng.integers(1, 300))
    old = {"source": "gpu", "config": presets.get("tiny").to_dict(), "n_proc": procs, "gpu": "NVIDIA H100"}
    del old["config"]["merge_sources"]
    new = upgrade_meta(old)
    check_meta(new)
    assert (new["processors"], new["dispatch"], new["staged_blocks"], new["queue"]) == (procs, "put", 32, "tile")
    assert new["config"]["merge_sources"] is False and "n_proc" not in new
    assert upgrade_meta(new) == new


def test_a_simulated_file_from_before_the_schema_says_producer():
    old = {"producer": "sim", "config": presets.get("tiny").to_dict(), "processors": 8, "dispatch": "staged",
           "staged_blocks": 16, "queue": "tile"}
    new = upgrade_meta(old)
    check_meta(new)
    assert new["source"] == "sim" and "producer" not in new


@pytest.mark.parametrize("change, needle", [
    ({"processors": None}, "no 'processors'"),
    ({"dispatch": "teleport"}, "'dispatch' = 'teleport'"),
    ({"source": "cpu"}, "'source' = 'cpu'"),
    ({"staged_blocks": -1}, "'staged_blocks' = -1"),
    ({"config": "tiny"}, "'config' = 'tiny'"),
])
def test_check_names_the_key_and_what_is_allowed(change, needle):
    meta = {"meta_version": META_VERSION, "source": "gpu", "config": {}, "processors": 2, "dispatch": "staged",
            "staged_blocks": 16, "queue": "tile"}
    assert set(meta) == set(META_KEYS)
    meta.update(change)
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(TraceError, match=needle.replace("(", r"\(")):
        check_meta(meta)


def test_a_newer_meta_version_is_refused():
    with pytest.raises(TraceError, match="meta_version 99"):
        upgrade_meta({"meta_version": 99})
