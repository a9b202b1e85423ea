"""The CLI end to end on tiny configs, and the committed goldens regenerated and compared."""

import json
from pathlib import Path

import numpy as np
import pytest

from moelab.cli import main
from reference import Config
from reference.cli import Progress, check_golden, tolerance_of

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("npz", sorted(GOLDEN.glob("*.npz")), ids=lambda p: p.stem)
def test_committed_golden_regenerates(npz):
    report = check_golden(str(npz), Progress(False))
    assert report["errors"], "golden file holds nothing to check"
    for quantity, err in report["errors"].items():
        assert err <= tolerance_of(quantity), f"{npz.name}: {quantity} moved by {err:.3g}"
    assert Config.from_dict(json.loads(str(np.load(npz)["config"]))) == Config.load(npz.with_suffix(".toml"))


def test_golden_check_catches_a_changed_output(tmp_path):
    with np.load(GOLDEN / "relu-drop.npz") as f:
        data = {k: f[k] for k in f.files}
    data["y_float32"] = data["y_float32"] * np.float32(1.001)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **data)
    assert main(["golden", "--check", str(bad), "--quiet"]) == 1


def test_cli_golden_out_and_check(tmp_path, capsys):
    out = tmp_path / "g.npz"
    assert main(["golden", "--config", "tiny", "--set", "tokens=50", "--out", str(out), "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tile_walk_vs_dense_float64"] < 1e-13 and summary["tiles"] > 0
    assert main(["golden", "--check", str(out), "--quiet"]) == 0
    assert "OK" in capsys.readouterr().out


def test_cli_configs(capsys):
    assert main(["configs"]) == 0
    text = capsys.readouterr().out
    assert "flashmoe" in text and "tiny" in text and "sweeps:" in text
    assert main(["configs", "--json"]) == 0
    assert {c["name"] for c in json.loads(capsys.readouterr().out)} >= {"tiny", "flashmoe"}


@pytest.mark.parametrize("argv,needle", [
    (["golden", "--config", "tiny", "--set", "top_k=99"], "top_k"),
    (["golden", "--config", "nope"], "preset"),
    (["golden", "--config", "tiny", "--set", "tokens"], "FIELD=VALUE"),
    (["golden", "--config", "tiny", "--gpus", "3"], "experts"),
])
def test_cli_bad_input_is_one_clear_error(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_cli_help_on_every_level(capsys):
    for argv in (["--help"], ["golden", "--help"], ["configs", "--help"]):
        assert main(argv) == 0
    assert "--config" in capsys.readouterr().out


def test_an_edited_preset_is_named_by_its_edits():
    import argparse

    from reference.cli import config_from_args

    def cfg_of(*sets, gpus=None):
        return config_from_args(argparse.Namespace(config="tiny", set=list(sets), gpus=gpus))

    assert cfg_of("tokens=64", "top_k=1").name == "tiny+tokens=64+top_k=1"
    assert cfg_of("tokens=96").name == "tiny"  # tiny's own value: still tiny
    assert cfg_of("tokens=64", "name=mine").name == "mine"
    assert cfg_of(gpus=4).name == "tiny" and cfg_of(gpus=4).ranks == 4
