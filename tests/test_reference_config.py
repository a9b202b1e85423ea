"""Config validation (one test per rule), presets, and TOML/JSON round trips and failures."""

import argparse
import json

import pytest

from reference import Config, ConfigError, presets
from reference.cli import _parse_value, config_from_args
from reference.files import FileError

BAD_FIELDS = [
    ("name", ""), ("tokens", 0), ("tokens", 1.5), ("tokens", True), ("hidden", -64), ("ffn", 0),
    ("experts", 0), ("top_k", 0), ("ranks", 0), ("gpus_per_node", 0), ("tile_m", 0),
    ("tile_n", 0), ("tile_k", 0), ("gate", "argmax"), ("activation", "tanh"), ("dtype", "fp8"),
    ("placement", "random"), ("capacity_factor", 0.0), ("capacity_factor", -1.0),
    ("capacity_factor", float("inf")), ("capacity_factor", "none"), ("bias", 1),
    ("shared_experts", -1), ("skew", -0.5), ("skew", float("nan")), ("seed", -1), ("tf32", 1),
    ("tf32", "true"), ("n_group", 0), ("topk_group", 0), ("routed_scaling", 0.0),
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


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_tf32_only_with_float32(dtype):
    with pytest.raises(ConfigError) as err:
        Config(dtype=dtype, tf32=True)
    assert (err.value.field, err.value.value) == ("tf32", True)
    assert "float32" in err.value.allowed and dtype in err.value.allowed


@pytest.mark.parametrize("changes", [dict(dtype="bfloat16"), dict(tf32=True), dict(dtype="float64")])
def test_tf32x3_only_with_float32_and_without_tf32(changes):
    with pytest.raises(ConfigError) as err:
        Config(tf32x3=True, **changes)
    assert (err.value.field, err.value.value) == ("tf32x3", True)
    assert "dtype float32 and tf32 false" in err.value.allowed


def test_tf32x3_is_a_bool():
    with pytest.raises(ConfigError) as err:
        Config(tf32x3="yes")
    assert err.value.field == "tf32x3" and err.value.allowed == "true or false"


def test_gemm_precision():
    assert Config().gemm_precision == "float32" and Config(dtype="bfloat16").gemm_precision == "bfloat16"
    assert Config(tf32=True).gemm_precision == "tf32" and Config(tf32x3=True).gemm_precision == "tf32x3"
    assert Config.from_dict(Config(tf32x3=True).to_dict()).tf32x3 is True
    assert all(not c.tf32 for c in presets.PRESETS.values())  # the presets stay float32/bf16 as measured


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
              presets.get("tiny").replace(tf32=True)):
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
    c = presets.get("tiny").replace(tf32=True)
    assert Config.from_dict(c.to_dict()) == c and c.to_dict()["tf32"] is True
    assert Config.from_dict({k: v for k, v in c.to_dict().items() if k != "tf32"}).tf32 is False  # older files
    args = argparse.Namespace(config="tiny", gpus=None, set=["tf32=true"])
    assert config_from_args(args).tf32 is True and config_from_args(args).name == "tiny+tf32=True"


def test_cli_value_parsing():
    assert [_parse_value(v) for v in ("3", "1.5", "true", "None", "gelu")] == [3, 1.5, True, None, "gelu"]
