"""Config validation (one test per rule), presets, and TOML/JSON round trips and failures."""

import argparse
import json

import numpy as np
import pytest

from reference import Config, ConfigError, presets
from reference.cli import _parse_value, config_from_args
from reference.config import to_toml
from reference.files import FileError

BAD_FIELDS = [
    ("name", ""), ("tokens", 0), ("tokens", 1.5), ("tokens", True), ("hidden", -64), ("ffn", 0),
    ("experts", 0), ("top_k", 0), ("ranks", 0), ("gpus_per_node", 0), ("tile_m", 0),
    ("tile_n", 0), ("tile_k", 0), ("gate", "argmax"), ("activation", "tanh"), ("precision", "fp8"),
    ("placement", "random"), ("capacity_factor", 0.0), ("capacity_factor", -1.0),
    ("capacity_factor", float("inf")), ("capacity_factor", "none"), ("bias", 1),
    ("shared_experts", -1), ("skew", -0.5), ("skew", float("nan")), ("seed", -1), ("precision", "float64"),
    ("precision", True), ("n_group", 0), ("topk_group", 0), ("routed_scaling", 0.0),
    ("routed_scaling", float("nan")), ("router_bias", 1), ("scale_before_expert", "yes"),
    ("swiglu_limit", -7.0),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS)
def test_bad_field_names_field_value_and_rule(field, value):
    with pytest.raises(ConfigError) as err:
        Config(**{field: value})
    assert err.value.field == field
    assert repr(value) in str(err.value) and "allowed" in str(err.value)


@pytest.mark.parametrize("changes,field", [
    (dict(top_k=9, experts=8), "top_k"),
    (dict(experts=6, ranks=4), "experts"),
    (dict(ranks=12, gpus_per_node=8, experts=24), "ranks"),
    (dict(hidden=100, tile_k=8), "hidden"),
    (dict(ffn=100, tile_k=8, hidden=128), "ffn"),
    (dict(experts=8, n_group=3), "n_group"),
    (dict(experts=8, n_group=4, topk_group=5), "topk_group"),
    (dict(experts=8, top_k=4, n_group=4, topk_group=1), "topk_group"),
    (dict(top_k=2, scale_before_expert=True), "scale_before_expert"),
    (dict(activation="swiglu_oai", tile_n=24 + 1, hidden=50, ffn=50, tile_k=1), "tile_n"),
])
def test_cross_field_rules(changes, field):
    # a tile_n that does not divide H or I is allowed: the last column block is ragged
    Config(hidden=96, ffn=160, tile_n=64, tile_k=8)
    with pytest.raises(ConfigError) as err:
        Config(**changes)
    assert err.value.field == field


def test_precision_fixes_the_storage_type():
    assert Config().precision == "float32"
    for precision, dtype, nbytes in (("float32", "float32", 4), ("tf32", "float32", 4), ("tf32x3", "float32", 4),
                                     ("bfloat16", "bfloat16", 2)):
        c = Config(precision=precision)
        assert (c.dtype, c.dtype_bytes) == (dtype, nbytes)
        assert Config.from_dict(c.to_dict()) == c and c.to_dict()["precision"] == precision
    assert not {"dtype", "tf32", "tf32x3"} & set(Config().to_dict())  # derived, never a second field
    with pytest.raises(ConfigError) as err:
        Config(precision="float16")
    assert (err.value.field, err.value.value) == ("precision", "float16")
    assert err.value.allowed == "one of float32, tf32, tf32x3, bfloat16"
    assert all(c.precision in ("float32", "bfloat16") for c in presets.PRESETS.values())  # as measured


@pytest.mark.parametrize("old,precision", [
    ({"dtype": "float32", "tf32": False, "tf32x3": False}, "float32"),
    ({"dtype": "bfloat16", "tf32": False, "tf32x3": False}, "bfloat16"),
    ({"dtype": "float32", "tf32": True, "tf32x3": False}, "tf32"),
    ({"dtype": "float32", "tf32": False, "tf32x3": True}, "tf32x3"),
    ({"dtype": "bfloat16"}, "bfloat16"), ({"tf32": True}, "tf32"), ({"tf32x3": True}, "tf32x3"),
    ({"tf32": False}, "float32"),
])
def test_old_files_upgrade_to_precision(tmp_path, old, precision):
    rng = np.random.default_rng()
    base = presets.get("tiny").replace(tokens=int(rng.integers(1, 500)), seed=int(rng.integers(2**31)))
    d = {k: v for k, v in base.to_dict().items() if k != "precision"}
    assert Config.from_dict({**d, **old}) == base.replace(precision=precision)
    old_file = tmp_path / "old.toml"  # a config file a user saved before precision
    old_file.write_text(to_toml({**d, **old}))
    assert Config.load(old_file) == base.replace(precision=precision)
    trace_meta = {**d, **old}  # what traces, goldens and measurement files keep: read through from_dict
    assert Config.from_dict(json.loads(json.dumps(trace_meta))).precision == precision


@pytest.mark.parametrize("bad,field", [
    ({"precision": "tf32", "tf32": True}, "tf32"),  # both kinds at once
    ({"precision": "float32", "dtype": "float32"}, "dtype"),
    ({"dtype": "bfloat16", "tf32": True}, "tf32"),  # contradictory old keys
    ({"dtype": "bfloat16", "tf32x3": True}, "tf32x3"),
    ({"tf32": True, "tf32x3": True}, "tf32x3"),
    ({"dtype": "float64"}, "dtype"), ({"dtype": "fp8"}, "dtype"),
    ({"tf32": "yes"}, "tf32"), ({"tf32x3": 1}, "tf32x3"),
])
def test_old_keys_that_name_no_one_precision_are_one_error(tmp_path, bad, field):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"name": "old", **bad})
    assert err.value.field == field and repr(bad[field]) in str(err.value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "old", **bad}))
    with pytest.raises(ConfigError) as err:
        Config.load(path)
    assert err.value.field == field and str(path) in str(err.value)


@pytest.mark.parametrize("field,value", [("dtype", "bfloat16"), ("tf32", True), ("tf32x3", True)])
def test_old_fields_are_not_fields(field, value):
    with pytest.raises(ConfigError) as err:
        Config().replace(**{field: value})
    assert err.value.field == field and "precision" in err.value.allowed
    args = argparse.Namespace(config="tiny", gpus=None, set=[f"{field}={value}"])
    with pytest.raises(ConfigError) as err:
        config_from_args(args)
    assert err.value.field == field and "precision" in err.value.allowed


def test_capacity_rule():
    c = Config(tokens=100, experts=8, top_k=2, capacity_factor=1.0)
    assert c.capacity == 25  # ceil(1.0 * 100 * 2 / 8)
    assert c.replace(capacity_factor=1.1).capacity == 28  # ceil(27.5)
    assert c.replace(capacity_factor=None).capacity is None
    assert Config(tokens=10, experts=10, top_k=1, capacity_factor=1.1).capacity == 2  # 1.1 not 1.1000..01


def test_layout():
    c = Config(experts=64, ranks=16, gpus_per_node=8)
    assert (c.nodes, c.local_experts, c.owner(0), c.owner(63), c.node_of(9)) == (2, 4, 0, 15, 1)
    assert Config(ranks=2, gpus_per_node=8).nodes == 1


def test_replace_unknown_field():
    with pytest.raises(ConfigError, match="known field"):
        Config().replace(tokns=3)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_save_load_round_trip(tmp_path, suffix):
    for c in (presets.get("tiny"), presets.get("tiny-nodrop"), presets.get("tiny-deepseek"),
              presets.get("tiny").replace(precision="tf32")):
        path = tmp_path / f"c{suffix}"
        c.save(path)
        assert Config.load(path) == c
        assert presets.get(str(path)) == c


@pytest.mark.parametrize("name,text,field", [
    ("bad.toml", "tokens = [1, 2\n", "path"),
    ("bad.json", "{\"tokens\": 3,", "path"),
    ("unknown.toml", "tokenz = 3\n", "tokenz"),
    ("wrong.json", json.dumps({"tokens": "many"}), "tokens"),
    ("list.json", "[1, 2]", "path"),
    ("config.yaml", "tokens: 3\n", "path"),
])
def test_malformed_files(tmp_path, name, text, field):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises((ConfigError, FileError)) as err:
        Config.load(path)
    # a file that is not a config file names the file; a bad field names the field and the file
    if field == "path":
        assert err.value.path == str(path)
    else:
        assert err.value.field == field and str(path) in str(err.value)


def test_missing_file_and_unknown_preset(tmp_path):
    with pytest.raises(FileError, match="does not exist"):
        Config.load(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="preset"):
        presets.get("no-such-preset")


def test_presets_hold_the_papers_configs():
    d = presets.get("flashmoe")
    assert (d.hidden, d.ffn, d.experts, d.top_k, d.tokens, d.capacity_factor) == (2048, 2048, 64, 2, 8192, 1.0)
    assert [c.tokens for c in presets.SWEEPS["tokens"]] == [1024, 2048, 4096, 8192, 16384]
    assert [c.experts for c in presets.SWEEPS["experts"]] == [8, 16, 32, 64, 128]
    assert [c.ranks for c in presets.SWEEPS["gpus"]] == [1, 2, 4, 8]
    assert all(c.name in presets.PRESETS for s in presets.SWEEPS.values() for c in s)


def test_dict_round_trip_and_set_option():
    c = presets.get("tiny").replace(precision="tf32")
    assert Config.from_dict(c.to_dict()) == c and c.to_dict()["precision"] == "tf32"
    assert Config.from_dict({k: v for k, v in c.to_dict().items() if k != "precision"}).precision == "float32"
    args = argparse.Namespace(config="tiny", gpus=None, set=["precision=tf32"])
    assert config_from_args(args).precision == "tf32" and config_from_args(args).name == "tiny+precision=tf32"


def test_cli_value_parsing():
    assert [_parse_value(v) for v in ("3", "1.5", "true", "None", "gelu")] == [3, 1.5, True, None, "gelu"]
