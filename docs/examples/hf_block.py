"""A Hugging Face MoE block checked against moelab: its golden (NumPy, on the CPU) and, on GPUs under
torchrun, the megakernel (gpu.MoELayer).

    python docs/examples/hf_block.py                                   # every family, HF vs the golden
    python docs/examples/hf_block.py --family gpt_oss --tokens 256
    torchrun --nproc-per-node 2 docs/examples/hf_block.py --gpu        # and the megakernel, per rank

For each family it builds a small randomly initialised block of Transformers' own modeling code
(needs `pip install transformers`; without it the script says so and exits 0), maps the HF config
to a moelab Config (reference.hf.layer_fields, the mapping `moelab configs --from-hf` uses) and the
block's weights to moelab's layouts (moelab_weights: routers' (E, H) weights transposed, fused
gate_up projections split into [gate | up] columns, gpt-oss' interleaved ones de-interleaved, a
shared expert appended as expert E), runs the block and the golden on the same tokens and prints
the max relative error and how many tokens the two routed differently. With --gpu each rank also
runs its share of the tokens through gpu.MoELayer (the layers the kernel does not run yet are
named with the reason).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from reference import Config, golden, hf, routing  # noqa: E402
from reference.weights import Weights  # noqa: E402

# each family's small block: its HF config class and fields (H = 128, I = 64)
FAMILIES = {
    "mixtral": ("MixtralConfig", dict(hidden_size=128, intermediate_size=64, num_local_experts=8,
                                      num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=128, moe_intermediate_size=64, num_experts=16,
                                         num_experts_per_tok=4, norm_topk_prob=True)),
    "deepseek_v3": ("DeepseekV3Config", dict(hidden_size=128, moe_intermediate_size=64, n_routed_experts=16,
                                             num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                                             routed_scaling_factor=2.5, norm_topk_prob=True)),
    "gpt_oss": ("GptOssConfig", dict(hidden_size=128, intermediate_size=64, num_local_experts=8,
                                     num_experts_per_tok=4, swiglu_limit=7.0)),
}
BLOCKS = {"mixtral": "MixtralSparseMoeBlock", "qwen3_moe": "Qwen3MoeSparseMoeBlock", "deepseek_v3": "DeepseekV3MoE",
          "gpt_oss": "GptOssMLP"}
KERNEL_TILE = dict(tile_m=64, tile_n=32, tile_k=8)  # a float32 tile of the megakernel


def hf_block(family: str, seed: int):
    """The HF block of FAMILIES' fields, its weights drawn N(0, 0.1^2), biases included."""
    import importlib

    import torch

    config_class, fields = FAMILIES[family]
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    hc = getattr(module, config_class)(**fields)
    hc._experts_implementation = "eager"  # the block alone, outside a model that would set it
    block = getattr(module, BLOCKS[family])(hc).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(block.parameters()) + list(block.buffers()):
            t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
    return block


def moelab_weights(family: str, block) -> dict:
    """The block's weights in moelab's layouts, float32: wg (H, E), wg_bias (E,) (gpt-oss), gate_bias
    (E,) (DeepSeek-V3's e_score_correction_bias), w1 (N, H, 2I) [gate | up], b1 (N, 2I), w2 (N, I, H),
    b2 (N, H) (gpt-oss); N = E, plus one shared expert (DeepSeek-V3) appended as expert E."""
    import torch

    with torch.no_grad():
        if family == "gpt_oss":
            r, ex = block.router, block.experts
            gate_up, bias = ex.gate_up_proj, ex.gate_up_proj_bias  # (E, H, 2I), columns gate, up, gate, up, ...
            return {"wg": r.weight.T, "wg_bias": r.bias,
                    "w1": torch.cat([gate_up[..., ::2], gate_up[..., 1::2]], -1),
                    "b1": torch.cat([bias[:, ::2], bias[:, 1::2]], -1),
                    "w2": ex.down_proj, "b2": ex.down_proj_bias}
        ex = block.experts  # gate_up_proj (E, 2I, H): rows gate then up; down_proj (E, H, I)
        w = {"wg": block.gate.weight.T, "w1": ex.gate_up_proj.transpose(1, 2), "w2": ex.down_proj.transpose(1, 2)}
        if family == "deepseek_v3":
            s = block.shared_experts
            shared_w1 = torch.cat([s.gate_proj.weight.T, s.up_proj.weight.T], -1)
            w.update(gate_bias=block.gate.e_score_correction_bias, w1=torch.cat([w["w1"], shared_w1[None]]),
                     w2=torch.cat([w["w2"], s.down_proj.weight.T[None]]))
        return {k: v.detach().float().contiguous() for k, v in w.items()}


def golden_output(cfg: Config, w: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The golden's float64 output (P, T, H) and experts (P, T, k) for tokens x (P, T, H)."""
    n = cfg.experts + cfg.shared_experts
    n_in = w["w1"].shape[-1]

    def arr(name, shape):
        return w[name].numpy() if name in w else np.zeros(shape, np.float32)

    weights = Weights(x=x, wg=arr("wg", None), gate_bias=arr("gate_bias", cfg.experts),
                      w1=arr("w1", None), b1=arr("b1", (n, n_in)), w2=arr("w2", None),
                      b2=arr("b2", (n, cfg.hidden)), wg_bias=arr("wg_bias", cfg.experts))
    r = routing.route(cfg, weights.x, weights.wg, weights.gate_bias, weights.wg_bias)
    return golden.dense(cfg, weights, r, "float64"), r.expert


def hf_experts(family: str, block, x):
    """The experts the HF block's router picks for tokens x (T, H), sorted per token."""
    router = block.router if family == "gpt_oss" else block.gate
    return np.sort(router(x)[2].numpy(), -1)


def check(family: str, tokens: int, ranks: int, rank: int, gpu: bool, seed: int) -> None:
    import torch

    block = hf_block(family, seed)
    # the fields as a model's config.json on the Hub spells them (Transformers' to_dict may rename some)
    hub_config = {"model_type": family, **FAMILIES[family][1]}
    cfg = Config(name=f"hf-{family}", **hf.layer_fields(f"<{family} block>", hub_config), tokens=tokens,
                 ranks=ranks, capacity_factor=None, precision="float32", **KERNEL_TILE)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(ranks * tokens, cfg.hidden, generator=gen)
    with torch.no_grad():
        out = block(x[None])
        y_hf = (out[0] if isinstance(out, tuple) else out)[0].numpy()
        w = moelab_weights(family, block)
        y_gold, experts = golden_output(cfg, w, x.numpy().reshape(ranks, tokens, cfg.hidden))
        moved = int((np.sort(experts.reshape(-1, cfg.top_k), -1) != hf_experts(family, block, x)).any(-1).sum())
    err = golden.max_rel_error(y_hf, y_gold.reshape(-1, cfg.hidden))
    if rank == 0:
        print(f"{family:12s} golden vs HF: max rel. error {err:.2e}, tokens routed differently {moved} of "
              f"{ranks * tokens} ({cfg.gate}, {cfg.activation}, E = {cfg.experts}, k = {cfg.top_k})")
    if gpu:
        run_kernel(cfg, w, x, y_hf, rank)


def run_kernel(cfg: Config, w: dict, x, y_hf: np.ndarray, rank: int) -> None:
    """This rank's tokens through gpu.MoELayer, against the HF block's output for them."""
    import torch

    import gpu

    try:
        gpu.check_supported(cfg)
    except gpu.UnsupportedConfig as e:
        if rank == 0:
            print(f"{'':12s} megakernel: not run ({e})")
        return
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    layer = gpu.MoELayer(cfg, {k: v.to(dev) for k, v in w.items()})
    mine = slice(rank * cfg.tokens, (rank + 1) * cfg.tokens)
    y = layer.forward(x[mine].to(dev)).cpu().numpy()
    layer.close()
    print(f"{'':12s} megakernel rank {rank} vs HF: max rel. error {golden.max_rel_error(y, y_hf[mine]):.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=list(FAMILIES), action="append", help="default: every family")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per rank (default 64)")
    ap.add_argument("--gpu", action="store_true", help="also run gpu.MoELayer (under torchrun: one process per GPU)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("hf_block.py: transformers is not installed (pip install transformers): nothing to compare")
        return 0
    ranks, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    for family in args.family or list(FAMILIES):
        check(family, args.tokens, ranks, rank, args.gpu, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
