"""Named configurations: the one place presets and the papers' sweeps are defined.

`flashmoe` is FlashMoE's default layer (csrc/flashmoe_config.json: H = I = 2048, 64 experts,
top-2, 8192 tokens, capacity factor 1, dropping) on 4 GPUs, as FlashMoE measures it.
The sweeps follow the FlashMoE paper's figures: tokens 1K..16K, experts 8..128, GPUs 1..8.
`perseus-comm` is a communication-bound layer (many small experts, k = 8) for the multi-node
fence story of the Perseus paper.
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
]
PRESETS: dict[str, Config] = {c.name: c for c in _PRESETS}
DEFAULT = "flashmoe"


def get(name: str) -> Config:
    """The preset called `name`, or a config file path (.toml / .json)."""
    if name in PRESETS:
        return PRESETS[name]
    if name.endswith((".toml", ".json")):
        return Config.load(name)
    raise ConfigError("config", name, "a preset (" + ", ".join(PRESETS) + ") or a .toml/.json file")
