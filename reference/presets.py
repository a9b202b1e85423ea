"""Named configurations: the one place presets, the papers' sweeps and the model zoo are defined.

`flashmoe` is FlashMoE's default layer (csrc/flashmoe_config.json: H = I = 2048, 64 experts,
top-2, 8192 tokens, capacity factor 1, dropping) on 4 GPUs, as FlashMoE measures it.
The sweeps follow the FlashMoE paper's figures: tokens 1K..16K, experts 8..128, GPUs 1..8
(`PAPER_SWEEPS`). `perseus-comm` is a communication-bound layer (many small experts, k = 8) for
the multi-node fence story of the Perseus paper.

The model zoo: one MoE layer of each of Mixtral-8x7B, Qwen3-30B-A3B, Qwen3-235B-A22B,
DeepSeek-V2-Lite, DeepSeek-V3, Llama-4-Scout, gpt-oss-20b and gpt-oss-120b, with its true H, I, E,
k, router, activation, shared experts and biases (each from its public Hugging Face config.json,
cited beside it; `SOURCES` names every preset's source), in bfloat16 at the bf16 kernel's bench
tile, nothing dropped (as the models run): ZOO_RUN. Each model `<model>` runs 4K tokens per GPU
on 4 GPUs; `<model>-8gpu` on the 8 GPUs of the paper's node; `SWEEPS["zoo-<model>-tokens"]` sweeps
the tokens per GPU over ZOO_TOKENS on 4 GPUs, its points `<model>-tokens-<t>k` (the 4K one the
model's preset itself).
"""

from __future__ import annotations

from .config import Config, ConfigError

_FLASHMOE = Config(name="flashmoe", tokens=8192, hidden=2048, ffn=2048, experts=64, top_k=2,
                   gate="softmax_topk", capacity_factor=1.0, activation="relu", bias=False,
                   ranks=4, gpus_per_node=8, tile_m=128, tile_n=64, tile_k=8)



def _point(name: str, **changes) -> Config:
    """A sweep point; the point equal to the FlashMoE default is that preset itself."""
    c = _FLASHMOE.replace(**changes)
    return _FLASHMOE if c == _FLASHMOE else c.replace(name=name)


SWEEPS: dict[str, list[Config]] = {
    "tokens": [_point(f"flashmoe-tokens-{t // 1024}k", tokens=t) for t in (1024, 2048, 4096, 8192, 16384)],
    "experts": [_point(f"flashmoe-experts-{e}", experts=e) for e in (8, 16, 32, 64, 128)],
    "gpus": [_point(f"flashmoe-gpus-{p}", ranks=p) for p in (1, 2, 4, 8)],
}
PAPER_SWEEPS = ("tokens", "experts", "gpus")  # FlashMoE's figures (sim.sweeps.fused_vs_baseline)

# the zoo's common run: bf16 at the bf16 kernel's bench tile (gpu/cases.py BF16_TILE; a test checks
# they agree), no dropping, 4 GPUs of an 8-GPU node, tokens per GPU swept over ZOO_TOKENS
ZOO_TILE = (128, 256, 64)
ZOO_TOKENS = (1024, 2048, 4096, 8192, 16384)
ZOO_GPUS, ZOO_NODE_GPUS = 4, 8
# the run fields of every zoo preset (and of `moelab configs --from-hf`), the layer's aside
ZOO_RUN = dict(tokens=ZOO_TOKENS[2], precision="bfloat16", capacity_factor=None, ranks=ZOO_GPUS,
               gpus_per_node=ZOO_NODE_GPUS, tile_m=ZOO_TILE[0], tile_n=ZOO_TILE[1], tile_k=ZOO_TILE[2])
ZOO: dict[str, Config] = {}  # each model's preset
SOURCES: dict[str, str] = {}  # where each preset's numbers come from
_ZOO_PRESETS: list[Config] = []  # every model's presets: its tokens sweep's points, then its 8-GPU one


def _zoo(name: str, source: str, **layer) -> None:
    """A zoo model's preset, its 8-GPU variant and its tokens sweep; `source`: the Hugging Face
    repository whose config.json gives `layer`."""
    base = Config(name=name, **ZOO_RUN, **layer)
    ZOO[name] = base
    points = [base if t == base.tokens else base.replace(name=f"{name}-tokens-{t // 1024}k", tokens=t)
              for t in ZOO_TOKENS]
    SWEEPS[f"zoo-{name}-tokens"] = points
    mine = [*points, base.replace(name=f"{name}-8gpu", ranks=ZOO_NODE_GPUS)]
    _ZOO_PRESETS.extend(mine)
    SOURCES.update({c.name: f"{source} config.json" for c in mine})


# mistralai/Mixtral-8x7B-v0.1: hidden_size 4096, intermediate_size 14336, num_local_experts 8,
# num_experts_per_tok 2, hidden_act silu; MixtralSparseMoeBlock: softmax, top-2, renormalized; no biases
_zoo("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", hidden=4096, ffn=14336, experts=8, top_k=2,
     gate="softmax_topk_renorm", activation="swiglu", bias=False)
# Qwen/Qwen3-30B-A3B: hidden_size 2048, moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8,
# norm_topk_prob true, hidden_act silu; no biases, no shared expert
_zoo("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", hidden=2048, ffn=768, experts=128, top_k=8,
     gate="softmax_topk_renorm", activation="swiglu", bias=False)
# Qwen/Qwen3-235B-A22B: hidden_size 4096, moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8,
# norm_topk_prob true, hidden_act silu
_zoo("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", hidden=4096, ffn=1536, experts=128, top_k=8,
     gate="softmax_topk_renorm", activation="swiglu", bias=False)
# deepseek-ai/DeepSeek-V2-Lite: hidden_size 2048, moe_intermediate_size 1408, n_routed_experts 64,
# num_experts_per_tok 6, n_shared_experts 2, scoring_func softmax, topk_method greedy, n_group 1,
# topk_group 1, norm_topk_prob false, routed_scaling_factor 1.0, hidden_act silu
_zoo("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", hidden=2048, ffn=1408, experts=64, top_k=6,
     gate="softmax_topk", routed_scaling=1.0, shared_experts=2, activation="swiglu", bias=False)
# deepseek-ai/DeepSeek-V3: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts 256,
# num_experts_per_tok 8, n_shared_experts 1, scoring_func sigmoid, topk_method noaux_tc, n_group 8,
# topk_group 4, norm_topk_prob true, routed_scaling_factor 2.5, hidden_act silu
_zoo("deepseek-v3", "deepseek-ai/DeepSeek-V3", hidden=7168, ffn=2048, experts=256, top_k=8,
     gate="sigmoid_bias", n_group=8, topk_group=4, routed_scaling=2.5, shared_experts=1, activation="swiglu",
     bias=False)
# meta-llama/Llama-4-Scout-17B-16E (text_config): hidden_size 5120, intermediate_size 8192,
# num_local_experts 16, num_experts_per_tok 1, hidden_act silu; Llama4TextMoe: sigmoid of the top-1
# logit scales the token before its expert, beside one shared expert of intermediate_size
_zoo("llama-4-scout", "meta-llama/Llama-4-Scout-17B-16E", hidden=5120, ffn=8192, experts=16, top_k=1,
     gate="sigmoid_topk", scale_before_expert=True, shared_experts=1, activation="swiglu", bias=False)
# openai/gpt-oss-20b: hidden_size 2880, intermediate_size 2880, num_local_experts 32,
# num_experts_per_tok 4, swiglu_limit 7.0; GptOssTopKRouter: a biased gate, softmax over the top 4;
# GptOssExperts: biases on both projections
_zoo("gpt-oss-20b", "openai/gpt-oss-20b", hidden=2880, ffn=2880, experts=32, top_k=4, gate="topk_softmax",
     router_bias=True, activation="swiglu_oai", swiglu_limit=7.0, bias=True)
# openai/gpt-oss-120b: hidden_size 2880, intermediate_size 2880, num_local_experts 128,
# num_experts_per_tok 4, swiglu_limit 7.0
_zoo("gpt-oss-120b", "openai/gpt-oss-120b", hidden=2880, ffn=2880, experts=128, top_k=4, gate="topk_softmax",
     router_bias=True, activation="swiglu_oai", swiglu_limit=7.0, bias=True)

_PRESETS: list[Config] = [
    Config(name="tiny", tokens=96, hidden=64, ffn=128, experts=8, top_k=2, capacity_factor=1.0,
           activation="relu", bias=True, ranks=2, gpus_per_node=8, tile_m=32, tile_n=32, tile_k=8),
    Config(name="tiny-nodrop", tokens=96, hidden=64, ffn=128, experts=8, top_k=2,
           capacity_factor=None, activation="gelu_tanh", ranks=4, gpus_per_node=2,
           tile_m=32, tile_n=32, tile_k=8),
    Config(name="tiny-deepseek", tokens=64, hidden=64, ffn=64, experts=16, top_k=4,
           gate="sigmoid_bias", capacity_factor=1.25, activation="swiglu", shared_experts=1,
           bias=False, ranks=4, gpus_per_node=8, tile_m=16, tile_n=32, tile_k=8),
    Config(name="small", tokens=1024, hidden=512, ffn=1024, experts=16, top_k=2,
           capacity_factor=1.0, ranks=4, gpus_per_node=8, tile_m=128, tile_n=64, tile_k=8),
    _FLASHMOE,
    *[c for sweep in SWEEPS.values() for c in sweep if c is not _FLASHMOE],
    Config(name="perseus-comm", tokens=4096, hidden=2048, ffn=512, experts=256, top_k=8,
           capacity_factor=1.0, activation="relu", bias=False, ranks=64, gpus_per_node=8,
           tile_m=128, tile_n=64, tile_k=8),
    *_ZOO_PRESETS,
]
PRESETS: dict[str, Config] = {c.name: c for c in _PRESETS}
SOURCES.update({"flashmoe": "FlashMoE's csrc/flashmoe_config.json",
                "perseus-comm": "the Perseus paper's communication-bound layer"})
SOURCES.update({c.name: "the FlashMoE paper's sweeps" for k in PAPER_SWEEPS for c in SWEEPS[k]
                if c.name not in SOURCES})
SOURCES.update({c.name: "moelab (tests and classes)" for c in _PRESETS if c.name not in SOURCES})
DEFAULT = "flashmoe"


def get(name: str) -> Config:
    """The preset called `name`, or a config file path (.toml / .json)."""
    if name in PRESETS:
        return PRESETS[name]
    if name.endswith((".toml", ".json")):
        return Config.load(name)
    raise ConfigError("config", name, "a preset (" + ", ".join(PRESETS) + ") or a .toml/.json file")
