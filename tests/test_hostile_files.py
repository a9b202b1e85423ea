"""Hostile files: every loader (config, hardware, calibration, golden, measured trace, benchmark
summary) turns a missing, folder, empty, truncated, mis-encoded, mis-shaped or NaN file into one
line naming the file, through the CLI; property-based inputs never escape as another exception."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hostile import refused, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference import Config, ConfigError, golden_file
from reference.files import FileError
from reference.numerics import PATHS
from sim import hardware
from sim.hardware import HardwareError
from sim.trace import COLUMNS, Trace, TraceError

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "relu-drop.npz"
RUN = REPO / "measurements" / "gpu" / "h200x4-trace-flashmoe-tokens-1k-p1.npz"
PARTNER = RUN.with_name(RUN.name.replace("-p1", "-p2"))

# bytes of a file any loader must refuse (None: the path is a folder; "missing": no file)
BROKEN = {
    "missing": "missing",
    "folder": None,
    "empty": b"",
    "latin1": "tokens = 3 # caf\xe9\n".encode("latin-1"),
    "binary": bytes(range(256)),
}
CONFIG = {**BROKEN, "truncated": b"tokens = [1,", "list": b"[1, 2]", "number": b"3", "nan": b'{"tokens": NaN}',
          "huge": b'{"capacity_factor": 1e999}', "string": b'{"tokens": "many"}', "unknown": b'{"tokenz": 3}',
          "none": b"{}", "comment": b"# nothing here\n", "negative": b"tokens = -4\n", "bool": b"tokens = true\n"}
HARDWARE = {**BROKEN, "truncated": b'{"base": "h100-sxm",', "list": b"[1]",
            "nan": b'{"base": "h100-sxm", "nic_gbps": NaN}',
            "inf": b'{"base": "h100-sxm", "nic_gbps": 1e999}', "unknown": b'{"base": "h100-sxm", "nic_speed": 1}',
            "nobase": b"{}", "string": b'{"base": "h100-sxm", "nic_gbps": "fast"}', "negative":
            b'{"base": "h100-sxm", "fence_ns": -5}', "base": b'{"base": "a100"}', "dtypes": b'{"base": "h100-sxm", '
            b'"dtypes": []}', "sources": b'{"base": "h100-sxm", "sources": 3}'}
CALIBRATION = {**BROKEN, "truncated": b'{"meta": ', "list": b"[]", "meta-list": b'{"meta": []}',
               "no-gpu": b'{"meta": {}}', "a100": b'{"meta": {"gpu": "A100"}}',
               "bare": b'{"meta": {"gpu": "NVIDIA H200"}}',
               "wrong-shape": b'{"meta": {"gpu": "NVIDIA H200"}, "gemm": 3, "tile": [1], "occupancy": "x"}'}
SUMMARY = {**BROKEN, "truncated": b'{"results": [', "list": b"[]", "no-results": b'{"meta": {}}',
           "results-object": b'{"meta": {}, "results": {}}', "results-numbers": b'{"meta": {}, "results": [1, 2]}',
           "no-trace": b'{"meta": {}, "results": [{"kernel_ms": 1}]}',
           "trace-missing": b'{"meta": {}, "results": [{"kernel_ms": 1, "trace": "gone.npz"}]}'}


def _write(folder: Path, name: str, content) -> Path:
    path = folder / name
    if content is None:
        path.mkdir()
    elif content != "missing":
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("cmd", ["golden", "sim"])
@pytest.mark.parametrize("case", list(CONFIG))
def test_a_broken_config_file_is_one_line_naming_it(case, cmd, tmp_path):
    content = CONFIG[case]
    suffix = ".json" if isinstance(content, bytes) and content[:1] in (b"[", b"{", b"3") else ".toml"
    path = _write(tmp_path, f"{case}{suffix}", CONFIG[case])
    line = refused([cmd, "--config", str(path), "--quiet"], str(path))
    assert "Traceback" not in line


@pytest.mark.parametrize("case", list(HARDWARE))
def test_a_broken_hardware_file_is_one_line_naming_it(case, tmp_path):
    path = _write(tmp_path, f"{case}.json", HARDWARE[case])
    refused(["sim", "--config", "tiny", "--hardware", str(path), "--quiet"], str(path))


@pytest.mark.parametrize("case", list(CALIBRATION))
def test_a_broken_calibration_file_is_one_line(case, tmp_path):
    path = _write(tmp_path, f"calibration-{case}.json", CALIBRATION[case])
    out = tmp_path / "calibrated.json"
    refused(["calibrate", "--calibration", str(path), "--out", str(out)], "calibration" if case not in BROKEN
            else str(path))
    assert not out.exists()


@pytest.mark.parametrize("case", list(SUMMARY))
def test_a_broken_benchmark_summary_is_one_line(case, tmp_path):
    path = _write(tmp_path, f"h200x4-bench-{case}.json", SUMMARY[case])
    refused(["compare", "--measured", str(path)], "measured")


def _golden_data() -> dict:
    with np.load(GOLDEN) as f:
        return {k: f[k] for k in f.files}


def _golden_variants() -> dict:
    """name -> a change to the golden's arrays that makes it no golden file."""
    def without(key):
        return lambda d: d.pop(key)

    def setting(key, value):
        return lambda d: d.__setitem__(key, value)

    def scaled(key, value):
        return lambda d: d.__setitem__(key, d[key] * value)

    def reshaped(key):
        return lambda d: d.__setitem__(key, d[key][:1])

    def config(text):
        return lambda d: d.__setitem__("config", np.array(text))

    return {"no-config": without("config"), "no-x": without("w_x"), "no-routing": without("route_slot"),
            "no-outputs": lambda d: [d.pop(k) for k in [k for k in d if k.startswith("y_")]],
            "nan-output": scaled("y_float32", np.float32("nan")), "inf-weight": scaled("w_w1", np.float32("inf")),
            "short-x": reshaped("w_x"), "short-y": reshaped("y_float64"), "config-list": config("[1, 2]"),
            "config-garbage": config("{tokens"), "config-bad": config(json.dumps({"tokens": -1})),
            "config-array": setting("config", np.zeros(3)), "unknown-path": setting("y_float16", np.zeros(1)),
            "expert-out-of-range": scaled("route_expert", 100)}


# a file's bytes that no .npz reader may take (as BROKEN), cut from a good file where truncated
def _raw_npz(good: Path, cut: int, **more) -> dict:
    return {**{k: BROKEN[k] for k in ("missing", "folder", "empty")}, "truncated": good.read_bytes()[:cut], **more}


GOLDEN_RAW = _raw_npz(GOLDEN, 2000, **{"not-zip": b"PK\x03\x04 not really"})


@pytest.mark.parametrize("case", [*GOLDEN_RAW, "npy", "pickle", *_golden_variants()])
def test_a_broken_golden_file_is_one_line_naming_it(case, tmp_path):
    path = _write(tmp_path, f"{case}.npz", GOLDEN_RAW.get(case, "missing"))
    data = _golden_data()
    if case == "npy":
        with path.open("wb") as f:
            np.save(f, np.zeros(3))
    elif case == "pickle":
        np.savez(path, **data, extra=np.array([{"a": 1}], dtype=object))
    elif case not in GOLDEN_RAW:
        _golden_variants()[case](data)
        np.savez(path, **data)
    refused(["golden", "--check", str(path), "--quiet"], str(path))


def test_a_golden_check_that_fails_exits_1(tmp_path):
    data = _golden_data()
    data["y_float32"] = data["y_float32"] * np.float32(1.001)
    np.savez(tmp_path / "moved.npz", **data)
    rc, out, err, _ = run(["golden", "--check", str(tmp_path / "moved.npz"), "--quiet"])
    assert rc == 1 and "MISMATCH: " in out and "float32" in out.splitlines()[-1], err


def test_committed_goldens_are_in_the_current_format():
    for path in sorted(GOLDEN.parent.glob("*.npz")):
        g = golden_file.load(path)
        assert sorted(g.outputs) == sorted(PATHS), path.name
        with np.load(path) as f:
            assert set(json.loads(str(f["config"]))) == set(Config().to_dict()), path.name
        assert g.config == Config.load(path.with_suffix(".toml")), path.name


def _trace_data() -> dict:
    with np.load(RUN) as f:
        return {k: f[k] for k in f.files}


def _trace_variants() -> dict:
    def change(fn):
        def apply(d):
            fn(d)
        return apply

    def meta(update):
        def apply(d):
            m = json.loads(str(d["meta"]))
            m.update(update)
            d["meta"] = np.array(json.dumps(m))
        return apply

    return {
        "empty-trace": change(lambda d: d.update({c: d[c][:0] for c in COLUMNS})),
        "nan-start": change(lambda d: d["start"].__setitem__(0, np.nan)),
        "inf-end": change(lambda d: d["end"].__setitem__(-1, np.inf)),
        "backwards": change(lambda d: d.update(end=d["start"] - 1)),
        "no-start": change(lambda d: d.pop("start")),
        "ragged": change(lambda d: d.update(end=d["end"][:-1])),
        "strings": change(lambda d: d.update(rank=np.array(["a"] * len(d["rank"])))),
        "no-meta": change(lambda d: d.pop("meta")),
        "meta-garbage": change(lambda d: d.update(meta=np.array("{source"))),
        "meta-list": change(lambda d: d.update(meta=np.array("[]"))),
        "sim-source": meta({"source": "sim"}),
        "config-list": meta({"config": [1]}),
        "config-bad": meta({"config": {"tokens": 0}}),
        "n-proc-junk": meta({"n_proc": "many"}),
    }


TRACE_RAW = _raw_npz(RUN, 5000, **{"not-npz": b"rank,start,end\n0,0,1\n"})


@pytest.mark.parametrize("case", [*TRACE_RAW, *_trace_variants()])
def test_a_broken_measured_trace_is_refused_not_compared(case, tmp_path):
    path = _write(tmp_path, f"h200x4-{case}.npz", TRACE_RAW.get(case, "missing"))
    if case not in TRACE_RAW:
        data = _trace_data()
        _trace_variants()[case](data)
        np.savez(path, **data)
    refused(["compare", "--measured", str(path), "--quiet"], str(path))


def _latency_row(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("layer latency"))


def test_a_corrupt_npz_beside_the_run_is_passed_over_and_a_miss_exits_1(tmp_path):
    """The run's folder holds a broken .npz (and its 2-GPU partner): it is compared as usual. The
    same run made three times slower misses its latency bound: status 1, 0 with --no-fail."""
    shutil.copy(RUN, tmp_path / RUN.name)
    shutil.copy(PARTNER, tmp_path / PARTNER.name)
    (tmp_path / "h200x4-trace-broken.npz").write_bytes(b"PK\x03\x04 broken")
    rc, out, err, _ = run(["compare", "--measured", str(tmp_path / RUN.name), "--quiet"], timeout_s=60)
    assert "Traceback" not in err and _latency_row(out).endswith("ok"), out
    assert rc == (1 if "MISS" in out else 0), (rc, out, err)
    data = _trace_data()
    data["start"], data["end"] = data["start"] * 3, data["end"] * 3
    slow = tmp_path / RUN.name.replace("-p1", "-slow-p1")
    np.savez(slow, **data)
    rc, out, err, _ = run(["compare", "--measured", str(slow), "--quiet"], timeout_s=60)
    assert rc == 1 and _latency_row(out).endswith("MISS") and "misses a bound: layer latency" in err, (out, err)
    rc, out, err, _ = run(["compare", "--measured", str(slow), "--quiet", "--no-fail"], timeout_s=60)
    assert rc == 0 and "MISS" in out, err


def test_calibrate_writes_only_where_told(tmp_path):
    tracked = REPO / "measurements" / "calibrated-h200.json"
    before = tracked.read_bytes()
    refused(["calibrate"], "--out")
    out = tmp_path / "calibrated-h200.json"
    rc, _, err, _ = run(["calibrate", "--out", str(out)])
    assert rc == 0 and out.is_file(), err
    assert tracked.read_bytes() == before


# property-based: whatever a file or a dict holds, the loaders say so in their own error

def one_line_or_none(load, errors) -> None:
    """`load()` succeeds or raises one of `errors` with a one-line message (any other exception fails)."""
    try:
        load()
    except errors as e:
        assert str(e) and "\n" not in str(e).strip(), repr(e)

FIELD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                         st.text(max_size=8), st.lists(st.integers(), max_size=3))
FIELDS = st.sampled_from(sorted(Config().to_dict()) + ["tokenz", ""])
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(st.dictionaries(FIELDS, FIELD_VALUES, max_size=4))
def test_any_config_dict_is_a_config_or_a_config_error(d):
    one_line_or_none(lambda: Config.from_dict({**Config().replace(tokens=8, hidden=16, ffn=16).to_dict(), **d}),
                     ConfigError)


@FAST
@given(st.binary(max_size=200), st.sampled_from([".toml", ".json"]))
def test_any_config_bytes_load_or_fail_in_one_line(tmp_path, data, suffix):
    path = tmp_path / f"c{suffix}"
    path.write_bytes(data)
    one_line_or_none(lambda: Config.load(path), (ConfigError, FileError))


HW_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=False),
                      st.text(max_size=5), st.lists(st.integers(), max_size=2),
                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@FAST
@given(st.dictionaries(st.sampled_from(hardware.field_names() + ["base", "sources", "dtypes", "x"]), HW_VALUES,
                       max_size=4))
def test_any_hardware_dict_is_hardware_or_a_hardware_error(d):
    one_line_or_none(lambda: hardware.from_dict({"base": "h100-sxm", **d}), HardwareError)


@FAST
@given(st.binary(max_size=300))
def test_any_npz_bytes_are_a_trace_or_a_trace_error(tmp_path, data):
    path = tmp_path / "t.npz"
    path.write_bytes(b"PK\x03\x04" + data if data[:1] == b"\x00" else data)
    one_line_or_none(lambda: Trace.load(path), TraceError)


@FAST
@given(st.sets(st.sampled_from(sorted(golden_file.REQUIRED)), max_size=3))
def test_a_golden_lacking_any_arrays_names_them(tmp_path, dropped):
    data = {k: v for k, v in _golden_data().items() if k not in dropped}
    np.savez(tmp_path / "g.npz", **data)
    if not dropped:
        golden_file.load(tmp_path / "g.npz")
        return
    with pytest.raises(FileError, match="lacks the array"):
        golden_file.load(tmp_path / "g.npz")
