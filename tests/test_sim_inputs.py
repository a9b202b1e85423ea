"""Bad input gets one clear error naming the field, the value and what is allowed; the CLI
reports it with exit status 2; hardware presets carry a source for every figure."""

import json

import pytest

import sim
from moelab.cli import main
from reference import ConfigError, presets
from sim import hardware
from sim.hardware import HardwareError


def test_unknown_transport():
    with pytest.raises(sim.SimError, match=r"'transport' = 'rdma'.*ibgda, ibrc, decoupled, nic_order, perseus"):
        sim.simulate(presets.get("tiny"), transport="rdma")


def test_nodes_must_divide_gpus():
    with pytest.raises(ConfigError, match=r"'nodes' = 3 .*divisor of the number of GPUs \(4\)"):
        sim.with_nodes(presets.get("tiny-nodrop"), 3)
    assert sim.with_nodes(presets.get("tiny-nodrop"), 4).gpus_per_node == 1


def test_cli_reports_bad_nodes_and_transport(capsys):
    assert main(["sim", "--config", "tiny", "--nodes", "3", "--quiet"]) == 2
    assert "'nodes' = 3" in capsys.readouterr().err
    assert main(["sim", "--transport", "rdma"]) == 2
    assert "invalid choice: 'rdma'" in capsys.readouterr().err


def _write(tmp_path, d):
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(d))
    return path


def test_preset_file_missing_a_field(tmp_path):
    full = hardware.PRESETS["h100-sxm"].to_dict()
    del full["nic_gbps"]
    with pytest.raises(HardwareError, match=r"'nic_gbps' = None .*present in"):
        hardware.get(str(_write(tmp_path, full)))


def test_preset_file_with_a_negative_field(tmp_path):
    with pytest.raises(HardwareError, match=r"'fence_ns' = -5 .*>= 0"):
        hardware.get(str(_write(tmp_path, {"base": "h100-sxm", "fence_ns": -5})))


def test_preset_file_with_an_unknown_field_or_base(tmp_path):
    with pytest.raises(HardwareError, match=r"'nic_speed' .*a known field"):
        hardware.load_calibration(_write(tmp_path, {"base": "h100-sxm", "nic_speed": 1}))
    with pytest.raises(HardwareError, match=r"'base' = 'a100' .*h100-sxm, h200-sxm"):
        hardware.load_calibration(_write(tmp_path, {"base": "a100"}))


def test_cli_reports_a_bad_hardware_file(tmp_path, capsys):
    path = _write(tmp_path, {"base": "h100-sxm", "sms": 0})
    assert main(["sim", "--config", "tiny", "--hardware", str(path), "--quiet"]) == 2
    assert "'sms' = 0" in capsys.readouterr().err


def test_calibration_overrides_a_figure_and_records_its_source(tmp_path):
    path = _write(tmp_path, {"base": "h100-sxm", "nic_latency_ns": 2500,
                             "sources": {"nic_latency_ns": "measurements/nic.json"}})
    hw = hardware.get(str(path))
    assert hw.nic_latency_ns == 2500 and hw.source("nic_latency_ns") == "measurements/nic.json"
    assert hw.sms == 132 and hw.source("sms") == hardware.PRESETS["h100-sxm"].source("sms")
    slow = sim.simulate(presets.get("tiny-nodrop"), hardware=hw).metrics["latency_ns"]
    assert slow > sim.simulate(presets.get("tiny-nodrop")).metrics["latency_ns"]


def test_every_preset_figure_has_a_source():
    for hw in hardware.PRESETS.values():
        assert hw.sms == 132
        assert all(hw.source(f) for f in hardware.number_fields()), hw.name
    assert hardware.PRESETS["h200-sxm"].hbm_gbps > hardware.PRESETS["h100-sxm"].hbm_gbps
