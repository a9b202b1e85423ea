"""Hostile inputs on the command line: bad options, values, sizes and output paths each end in
exit status 2 and one line naming what is wrong, before any work; never a traceback or a hang."""

from __future__ import annotations

import json
import socket

import pytest
from hostile import refused, run
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import budget
from reference.config import field_names

# "{d}" is a fresh folder of the case; "{d}/dir.png" etc. exist there as folders
OPTIONS = [
    # the command itself
    ([], "required"),
    (["nosuch"], "invalid choice"),
    (["golden", "--nosuch"], "unrecognized"),
    # --set and --gpus: a value that is not allowed names the field
    (["golden", "--config", "tiny", "--set", "tokens"], "FIELD=VALUE"),
    (["golden", "--config", "tiny", "--set", "tokens=abc"], "tokens"),
    (["golden", "--config", "tiny", "--set", "tokens=-1"], "tokens"),
    (["golden", "--config", "tiny", "--set", "tokens=0"], "tokens"),
    (["golden", "--config", "tiny", "--set", "tokens=1.5"], "tokens"),
    (["golden", "--config", "tiny", "--set", "tokens=nan"], "tokens"),
    (["golden", "--config", "tiny", "--set", "tokens=inf"], "tokens"),
    (["golden", "--config", "tiny", "--set", "tokens=true"], "tokens"),
    (["golden", "--config", "tiny", "--set", "capacity_factor=nan"], "capacity_factor"),
    (["golden", "--config", "tiny", "--set", "capacity_factor=-1"], "capacity_factor"),
    (["golden", "--config", "tiny", "--set", "capacity_factor=inf"], "capacity_factor"),
    (["golden", "--config", "tiny", "--set", "skew=inf"], "skew"),
    (["golden", "--config", "tiny", "--set", "skew=-0.5"], "skew"),
    (["golden", "--config", "tiny", "--set", "dtype=float16"], "dtype"),
    (["golden", "--config", "tiny", "--set", "gate=foo"], "gate"),
    (["golden", "--config", "tiny", "--set", "activation=tanh"], "activation"),
    (["golden", "--config", "tiny", "--set", "nosuch=3"], "nosuch"),
    (["golden", "--config", "tiny", "--set", "seed=-1"], "seed"),
    (["golden", "--config", "tiny", "--set", "top_k=0"], "top_k"),
    (["golden", "--config", "tiny", "--set", "top_k=99"], "top_k"),
    (["golden", "--config", "tiny", "--set", "tile_k=7"], "tile_k"),
    (["golden", "--config", "tiny", "--set", "tf32=yes"], "tf32"),
    (["golden", "--config", "tiny", "--set", "precision=float16"], "precision"),
    (["golden", "--config", "tiny", "--set", "tf32=true"], "tf32"),  # an old field (precision-codemod: keep)
    (["golden", "--config", "tiny", "--set", "name="], "name"),
    (["golden", "--config", "tiny", "--gpus", "3"], "experts"),
    (["golden", "--config", "tiny", "--gpus", "0"], "--gpus"),
    (["golden", "--config", "tiny", "--gpus", "-2"], "--gpus"),
    (["golden", "--config", "nosuch"], "preset"),
    (["golden", "--config", ""], "preset"),
    # golden's own options
    (["golden", "--config", "tiny", "--out", "{d}/g.txt"], ".npz"),
    (["golden", "--config", "tiny", "--out", "{d}/none/g.npz"], "does not exist"),
    (["golden", "--config", "tiny", "--out", "{d}/dir.npz"], "is a folder"),
    (["golden", "--check", "{golden}", "--tolerance", "nan"], "finite"),
    (["golden", "--check", "{golden}", "--tolerance", "inf"], "finite"),
    (["golden", "--check", "{golden}", "--tolerance", "-1"], "finite"),
    (["golden", "--check", "{golden}", "--tolerance", "abc"], "finite"),
    (["golden", "--check", "{golden}", "--out", "{d}/g.npz"], "--check"),
    # configs --from-hf
    (["configs", "--from-hf", "{d}/none.json"], "does not exist"),
    (["configs", "--from-hf", "{d}/dir.json"], "is a folder"),
    (["configs", "--from-hf", "tests/hf_configs/mixtral-8x7b.json", "--out", "{d}/none/x.toml"], "does not exist"),
    (["configs", "--from-hf", "tests/hf_configs/mixtral-8x7b.json", "--out", "{d}/dir.json"], "is a folder"),
    (["configs", "--from-hf", "tests/hf_configs/mixtral-8x7b.json", "--tokens", "0"], "tokens"),
    (["configs", "--tokens", "64"], "--from-hf"),
    # sizes: estimated before the work, refused past the memory or (without --long) a few minutes
    (["golden", "--config", "tiny", "--set", "tokens=1000000000"], "too large"),
    (["sim", "--config", "tiny", "--set", "tokens=1000000000"], "too large"),
    (["golden"], "flashmoe"),  # too large or too long, as the machine has memory
    (["sim", "--config", "perseus-comm", "--gpus", "512", "--set", "experts=512"], "perseus-comm"),  # 64 nodes
    # sim's options
    (["sim", "--config", "tiny", "--staged-blocks", "100000"], "staged_blocks"),
    (["sim", "--config", "tiny", "--staged-blocks", "527"], "at most 526"),
    (["sim", "--config", "tiny", "--staged-blocks", "0"], "at least 1"),
    (["sim", "--config", "tiny", "--staged-blocks", "x"], "at least 1"),
    (["sim", "--config", "tiny", "--nodes", "3"], "nodes"),
    (["sim", "--config", "tiny", "--nodes", "0"], "nodes"),
    (["sim", "--config", "tiny", "--nodes", "x"], "--nodes"),
    (["sim", "--config", "tiny", "--transport", "rdma"], "invalid choice"),
    (["sim", "--config", "tiny", "--dispatch", "copy"], "invalid choice"),
    (["sim", "--config", "tiny", "--queue", "fifo"], "invalid choice"),
    (["sim", "--config", "tiny", "--hardware", "a100"], "hardware"),
    (["sim", "--config", "tiny", "--sweep", "nosuch"], "invalid choice"),
    (["sim", "--config", "tiny", "--trace", "{d}/t.txt"], ".json or .npz"),
    (["sim", "--config", "tiny", "--trace", "{d}/none/t.npz"], "does not exist"),
    (["sim", "--config", "tiny", "--trace", "{d}/dir.npz"], "is a folder"),
    (["sim", "--config", "tiny", "--timeline", "{d}/t.svg"], ".png or .html"),
    (["sim", "--config", "tiny", "--timeline", "{d}/none/t.png"], "does not exist"),
    (["sim", "--config", "tiny", "--timeline", "{d}/dir.png"], "is a folder"),
    # compare's options, checked before any comparison
    (["compare"], "--measured"),
    (["compare", "--all", "--markdown", "{d}/none/v.md"], "does not exist"),
    (["compare", "--all", "--markdown", "{d}/v.txt"], ".md"),
    (["compare", "--measured", "{run}", "--markdown", "{d}/v.md"], "--all"),
    (["compare", "--measured", "{run}", "--png", "{d}/none/p.png"], "does not exist"),
    (["compare", "--measured", "{run}", "--trace", "{d}/dir.json"], "is a folder"),
    (["compare", "--measured", "{run}", "--trace", "{d}/t.npz"], ".json"),
    (["compare", "--measured", "{run}", "--hardware", "a100.toml"], "hardware"),
    (["compare", "--all", "--measured", "{run}"], "--all"),
    # calibrate writes nothing unless told where
    (["calibrate"], "--out"),
    (["calibrate", "--out", "{d}/none/c.json"], "does not exist"),
    (["calibrate", "--out", "{d}/c.txt"], ".json"),
    (["calibrate", "--out", "{d}/dir.json"], "is a folder"),
    (["calibrate", "--base", "a100", "--out", "{d}/c.json"], "invalid choice"),
    # app
    (["app", "--port", "99999"], "1024 to 65535"),
    (["app", "--port", "0"], "1024 to 65535"),
    (["app", "--port", "-1"], "1024 to 65535"),
    (["app", "--port", "http"], "1024 to 65535"),
    # gpu: arguments refused before any build or launch, also on a machine without GPUs
    (["gpu", "--config", "tiny", "--iters", "0"], "--iters"),
    (["gpu", "--config", "tiny", "--warmup", "-1"], "--warmup"),
    (["gpu", "--config", "tiny", "--timeout-ms", "nan"], "--timeout-ms"),
    (["gpu", "--config", "tiny", "--wall-timeout", "-5"], "--wall-timeout"),
    (["gpu", "--config", "tiny", "--trace", "{d}/t.txt"], ".npz or .json"),
    (["gpu", "--config", "tiny", "--trace", "{d}/none/t.npz"], "does not exist"),
    (["gpu", "--config", "tiny", "--out", "{golden}"], "is a file"),
    (["gpu", "--config", "tiny", "--inputs", "zeros"], "invalid choice"),
    (["gpu", "--config", "tiny", "--set", "tokens=-3"], "tokens"),
]
ALREADY = {"{golden}": "tests/golden/relu-drop.npz",
           "{run}": "measurements/gpu/h200x4-trace-flashmoe-tokens-1k-p1.npz"}


def _fill(argv: list[str], d) -> list[str]:
    out = []
    for a in argv:
        for k, v in ALREADY.items():
            a = a.replace(k, v)
        out.append(a.replace("{d}", str(d)))
    return out


@pytest.mark.parametrize("argv,needle", OPTIONS, ids=[" ".join(a) or "(none)" for a, _ in OPTIONS])
def test_a_bad_option_is_one_line_and_status_2(argv, needle, tmp_path):
    for name in ("dir.npz", "dir.png", "dir.json"):
        (tmp_path / name).mkdir()
    refused(_fill(argv, tmp_path), needle)


def test_output_paths_are_checked_before_the_work(tmp_path):
    """`compare --all` would run every committed comparison; a bad --markdown fails at once."""
    rc, _, _, seconds = run(["compare", "--all", "--quiet", "--markdown", str(tmp_path / "none" / "v.md")])
    assert rc == 2 and seconds < 3, seconds


@pytest.mark.parametrize("changes", [{"tokens": 10**9}, {"ranks": 1024, "experts": 1024}, {"experts": 10**6}],
                         ids=str)
@pytest.mark.parametrize("cmd", ["golden", "sim"])
def test_huge_sizes_are_refused_before_the_work(cmd, changes, monkeypatch):
    """On a machine with 2 GB free the sizes of the issue cannot run: each is one line, at once."""
    monkeypatch.setattr(budget, "available_bytes", lambda: 2e9)
    sets = [a for k, v in changes.items() for a in ("--set", f"{k}={v}")]
    line = refused([cmd, "--config", "tiny", *sets, "--quiet"], "too large", timeout_s=10)
    assert "2.0 GB is free" in line


def test_a_long_run_asks_for_long_and_says_its_estimate(monkeypatch):
    monkeypatch.setattr(budget, "available_bytes", lambda: 1e12)
    line = refused(["golden", "--quiet"], "--long")
    assert "flashmoe" in line and "min" in line


def test_a_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        refused(["app", "--port", str(s.getsockname()[1]), "--headless"], "in use")


def test_the_app_without_streamlit_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    refused(["app", "--headless"], "pip install")


def test_staged_blocks_up_to_the_processors_but_one_run():
    rc, out, err, _ = run(["sim", "--config", "tiny", "--staged-blocks", "526", "--quiet", "--json"])
    assert rc == 0 and '"staged_blocks": 526' in out, err


@pytest.mark.parametrize("argv,needles", [
    (["--version"], ["moelab 0."]),
    (["--help"], ["exit status"]),
    (["app", "--help"], ["Simulate", "Compare", "Benchmarks", "Fences", "Golden"]),
    (["sim", "--help"], ["16 blocks", "exit status", "--long"]),
    (["compare", "--help"], ["--no-fail", "exit status"]),
    (["golden", "--help"], ["exit status", "--long"]),
    (["calibrate", "--help"], ["--out", "exit status"]),
    (["gpu", "--help"], ["exit status"]),
])
def test_help_says_what_a_user_needs(argv, needles):
    rc, out, err, _ = run(argv)
    text = " ".join(out.split())
    assert rc == 0 and all(n in text for n in needles), (text[-600:], err)


def test_every_gpu_flag_has_help():
    from moelab.cli import parser

    sub = next(a for a in parser()._actions if a.dest == "command").choices["gpu"]
    assert [a.option_strings for a in sub._actions if not a.help] == []


def test_sim_prints_ms_and_mb_in_one_pass():
    rc, out, err, _ = run(["sim", "--config", "tiny"])
    assert rc == 0, err
    rows = dict(line.split(None, 1) for line in out.splitlines()[2:])
    assert "latency_ns" not in rows and float(rows["latency_ms"]) > 0 and len(rows["latency_ms"].strip()) <= 8
    assert "MB.nvlink" in rows and "bytes.nvlink" not in rows
    assert "estimate for tiny: about" in err and "routing and tile plan" in err
    assert all(line.startswith("[") for line in err.splitlines())
    events = [line for line in err.splitlines() if "events" in line]
    assert len(events) <= 1 and "pass" not in err, err  # one simulation pass


SET_VALUES = st.one_of(st.integers(-5, 300).map(str), st.floats().map(str),
                       st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=6),
                       st.sampled_from(["true", "false", "none", "", "1e999", "0x10", "2**8"]))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(field_names() + ["nosuch"]), SET_VALUES)
def test_any_set_value_runs_or_is_one_line(field, value):
    """`golden --set FIELD=VALUE` on tiny with any value: a result (exit 0, JSON) or one error line."""
    rc, out, err, _ = run(["golden", "--config", "tiny", "--set", f"{field}={value}", "--quiet", "--json"])
    assert "Traceback" not in err and rc in (0, 2), (field, value, rc, err)
    if rc == 0:
        assert json.loads(out)["tiles"] > 0 and not err
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("moelab golden: error: "), err
