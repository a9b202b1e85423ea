"""The model zoo: each real model's preset, its sources, its Hugging Face config.json mapped by
`moelab configs --from-hf` back to the same layer, bad config files as one clear error each, and
every model's layer planned and simulated on 4 and 8 GPUs (at 256 tokens per GPU, to stay fast)."""

import json
from pathlib import Path

import pytest

import reference
import sim
from gpu import cases
from moelab.cli import main
from reference import Config, hf, presets

HF = Path(__file__).parent / "hf_configs"
ZOO = sorted(presets.ZOO)


def test_the_zoo_runs_at_the_bf16_kernels_bench_tile():
    assert presets.ZOO_TILE == cases.BF16_TILE
    for c in presets.ZOO.values():
        assert (c.dtype, c.capacity_factor, c.ranks, c.tokens) == ("bfloat16", None, presets.ZOO_GPUS, 4096)
        assert (c.tile_m, c.tile_n, c.tile_k) == presets.ZOO_TILE


@pytest.mark.parametrize("name", ZOO)
def test_each_model_has_its_sweep_its_node_and_its_source(name):
    base = presets.ZOO[name]
    sweep = presets.SWEEPS[f"zoo-{name}-tokens"]
    assert [c.tokens for c in sweep] == list(presets.ZOO_TOKENS) and base in sweep
    assert [c.name for c in sweep if c is not base] == [f"{name}-tokens-{t // 1024}k" for t in presets.ZOO_TOKENS
                                                       if t != base.tokens]
    node = presets.get(f"{name}-8gpu")
    assert node.ranks == presets.ZOO_NODE_GPUS and node.replace(name=name, ranks=base.ranks) == base
    for c in (*sweep, node):
        assert presets.get(c.name) == c and c.replace(name=name, tokens=base.tokens, ranks=base.ranks) == base
        assert presets.SOURCES[c.name] == json.loads((HF / f"{name}.json").read_text())["_source"].split(",")[0]


def test_every_preset_names_its_source(capsys):
    assert set(presets.SOURCES) == set(presets.PRESETS)
    assert main(["configs", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["deepseek-v3"]["source"] == "deepseek-ai/DeepSeek-V3 config.json" and rows["deepseek-v3"]["shared"] == 1
    assert main(["configs"]) == 0
    assert "openai/gpt-oss-120b config.json" in capsys.readouterr().out


@pytest.mark.parametrize("name", ZOO)
def test_from_hf_round_trips_to_the_zoo_preset(name, tmp_path, capsys):
    path = HF / f"{name}.json"
    assert hf.from_hf(path) == presets.ZOO[name]
    out = tmp_path / "layer.toml"
    assert main(["configs", "--from-hf", str(path), "--out", str(out), "--tokens", "256", "--ranks", "8"]) == 0
    assert Config.load(out) == presets.ZOO[name].replace(tokens=256, ranks=8)
    assert main(["configs", "--from-hf", str(path)]) == 0  # TOML on stdout
    assert f'name = "{name}"' in capsys.readouterr().out


def test_a_saved_hf_config_runs_in_the_other_commands(tmp_path, capsys):
    out = tmp_path / "oss.toml"
    assert main(["configs", "--from-hf", str(HF / "gpt-oss-20b.json"), "--out", str(out), "--tokens", "64"]) == 0
    assert main(["sim", "--config", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


def write(tmp_path, d, name="config.json"):
    p = tmp_path / name
    p.write_text(d if isinstance(d, str) else json.dumps(d))
    return str(p)


def edited(name, **changes):
    d = json.loads((HF / f"{name}.json").read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return d


@pytest.mark.parametrize("d, needles", [
    (dict(model_type="llama"), ["model_type", "'llama'", "mixtral"]),
    (edited("mixtral-8x7b", model_type=None), ["model_type", "missing"]),
    (edited("mixtral-8x7b", num_local_experts=None), ["num_local_experts", "missing", "mixtral"]),
    (edited("qwen3-30b-a3b", num_experts="128"), ["num_experts", "'128'", "integer"]),
    (edited("qwen3-30b-a3b", hidden_size=2048.0), ["hidden_size", "integer"]),
    (edited("qwen3-30b-a3b", norm_topk_prob=1), ["norm_topk_prob", "true or false"]),
    (edited("deepseek-v3", scoring_func="softmax_plus"), ["scoring_func", "'softmax_plus'", "'sigmoid'"]),
    (edited("deepseek-v3", norm_topk_prob=False), ["norm_topk_prob", "False"]),
    (edited("deepseek-v2-lite", topk_method="noaux_tc"), ["topk_method", "group_limited_greedy"]),
    (edited("deepseek-v3", n_group=7), ["n_group", "a divisor of experts"]),
    (edited("mixtral-8x7b", hidden_act="gelu"), ["hidden_act", "'gelu'", "silu"]),
    (edited("gpt-oss-20b", swiglu_limit="7"), ["swiglu_limit", "number"]),
    (edited("gpt-oss-20b", num_experts_per_tok=None, experts_per_token=None), ["num_experts_per_tok", "missing"]),
    (edited("llama-4-scout", text_config=None), ["text_config", "missing"]),
    (edited("llama-4-scout", text_config={"model_type": "llama4_text", "hidden_size": 5120}),
     ["text_config.intermediate_size", "missing"]),
    (edited("mixtral-8x7b", hidden_size=4000), ["hidden", "4000", "tile_k"]),
    ([1, 2], ["a JSON object"]),
    ("{not json", ["well-formed JSON"]),
])
def test_bad_hf_files_are_one_clear_error(d, needles, tmp_path, capsys):
    path = write(tmp_path, d)
    assert main(["configs", "--from-hf", path]) == 2
    err = capsys.readouterr().err
    assert path in err and "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_missing_hf_file_and_flags_without_from_hf(tmp_path, capsys):
    assert main(["configs", "--from-hf", str(tmp_path / "none.json")]) == 2
    assert "does not exist; expected a Hugging Face config.json" in capsys.readouterr().err
    assert main(["configs", "--tokens", "64"]) == 2
    assert "only with --from-hf" in capsys.readouterr().err


@pytest.mark.parametrize("ranks", [presets.ZOO_GPUS, presets.ZOO_NODE_GPUS])
@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_layer_plans_and_simulates(name, ranks):
    cfg = presets.get(name if ranks == presets.ZOO_GPUS else f"{name}-8gpu").replace(tokens=256)
    plan = reference.plan_of(cfg)
    assert plan.row_token.size == ranks * cfg.tokens * (cfg.top_k + cfg.shared_experts)  # nothing dropped
    result = sim.simulate(cfg, plan=plan)
    assert result.metrics["latency_ms"] > 0


def test_golden_refuses_a_layer_larger_than_the_machine(monkeypatch, capsys):
    from reference import budget

    monkeypatch.setattr(budget, "available_bytes", lambda: 2**30)
    assert main(["golden", "--config", "deepseek-v3", "--quiet"]) == 2  # 53 GiB of weights and rows
    err = capsys.readouterr().err
    assert "too large" in err and "1.1 GB is free" in err and err.count("\n") == 1
    assert main(["golden", "--config", "tiny", "--quiet", "--json"]) == 0


def test_a_text_only_llama4_config_maps_alike(tmp_path):
    text = json.loads((HF / "llama-4-scout.json").read_text())["text_config"]
    path = write(tmp_path, text)  # model_type llama4_text at the top, as a text-only checkpoint ships it
    assert hf.from_hf(path) == presets.ZOO["llama-4-scout"].replace(name=tmp_path.name)
