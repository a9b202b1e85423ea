"""The validation set: layers no fit ever sees, drawn once from a seeded distribution of real-model-like
shapes and committed as a list (`validation_set.json` beside this file).

The simulator is calibrated on microbenchmarks and on the in-layer pieces of FlashMoE-shaped layers
(gpu/microbench.py: H = I = 2048, top-2, relu); a model that is right only there cannot answer the
questions it exists for. These layers are measured on the GPUs (`benchmarks/device_run.sh ... validate`)
and predicted by `moelab compare`; docs/validation.md reports them apart from the fit set.

The distribution (`draw`): per GPU count in GPU_COUNTS, PER_GPU_COUNT layers of
- E routed experts from EXPERTS (a multiple of the GPU count), k from 1 to TOP_K_MAX (at most E);
- H and I log-uniform in WIDTH_RANGE, multiples of 256 (the bench tile's width) or, with
  probability RAGGED, multiples of WIDTH_STEP that leave a ragged last column block;
- a gated FFN (swiglu) with probability GATED, else one of the kernel's plain activations;
- tokens per GPU log-uniform in TOKENS_RANGE, multiples of 256; skew uniform in [0, SKEW_MAX] in
  quarters; capacity factor from CAPACITY; a router from GATES_DRAWN; expert biases with
  probability BIAS;
- redrawn until a GPU's expert weights fit WEIGHT_BYTES_MAX, its expert FLOPs FLOPS_MAX and its slots'
  rows SLOT_BYTES_MAX, so each layer measures in a few seconds and simulates in seconds.
Every layer is bf16 (the build the bench tile and its calibration cover); the tile shape is the
bench's (gpu.cases.in_dtype), not part of the set. The committed list is the draw of SEED: a test
holds them equal, so changing the distribution means committing a new list (and measuring it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .config import Config

SEED = 39
GPU_COUNTS = (1, 2, 4)
PER_GPU_COUNT = 16
EXPERTS = (8, 16, 32, 48, 60, 64, 128, 160, 256)  # routed experts of real MoE layers
TOP_K_MAX = 8
WIDTH_RANGE = (1024, 8192)  # H and I
WIDTH_STEP = 64  # the bf16 kernel's slice depth: every width a multiple of it
FULL_STEP = 256  # the bench tile's width: a multiple of it has no ragged column block
RAGGED = 0.25
GATED = 1 / 3
PLAIN_ACTIVATIONS = ("relu", "gelu_tanh", "silu")
TOKENS_RANGE = (1024, 8192)
TOKENS_STEP = 256
SKEW_MAX = 2.0
CAPACITY = (1.0, 1.25, None)
GATES_DRAWN = ("softmax_topk", "softmax_topk_renorm", "topk_softmax", "sigmoid_bias")
BIAS = 0.25
WEIGHT_BYTES_MAX = 3 << 30  # a GPU's expert weights
FLOPS_MAX = 4e12  # a GPU's expert FLOPs at its routed rows (T k), about 8 ms of bf16 tensor cores
# a GPU's E x C slots of H elements (without dropping C is T): the kernel holds two such buffers in
# NVSHMEM's heap, and two of T k rows (gpu/layout.py Sizes.symmetric_bytes), sized for a GPU count's largest layer
SLOT_BYTES_MAX = 2 << 30
PRECISION = "bfloat16"
PATH = Path(__file__).with_name("validation_set.json")


def weight_bytes(cfg: Config) -> int:
    """A GPU's routed expert weights: W1 (H x I, or H x 2I gated) and W2 (I x H) per local expert."""
    return cfg.local_experts * (3 if cfg.gated else 2) * cfg.hidden * cfg.ffn * cfg.dtype_bytes


def flops(cfg: Config) -> float:
    """A GPU's expert FLOPs if every routed row is kept (T k rows, two GEMMs, GEMM0 twice as wide gated)."""
    return 2.0 * cfg.tokens * cfg.top_k * cfg.hidden * cfg.ffn * (3 if cfg.gated else 2)


def slot_bytes(cfg: Config) -> int:
    """A GPU's slots for the rows of every (source, expert) block: E x C rows of H elements."""
    return cfg.experts * cfg.slots * cfg.hidden * cfg.dtype_bytes


def _log_uniform(rng: np.random.Generator, lo: int, hi: int, step: int) -> int:
    return int(min(hi, max(lo, step * round(math.exp(rng.uniform(math.log(lo), math.log(hi))) / step))))


def _width(rng: np.random.Generator, ragged: bool) -> int:
    w = _log_uniform(rng, *WIDTH_RANGE, FULL_STEP)
    if ragged:  # move off the bench tile's width by 1 to 3 slices
        w += WIDTH_STEP * int(rng.integers(1, FULL_STEP // WIDTH_STEP)) * (-1 if w >= WIDTH_RANGE[1] else 1)
    return w


def _one(rng: np.random.Generator, name: str, ranks: int) -> Config:
    while True:
        experts = int(rng.choice([e for e in EXPERTS if e % ranks == 0]))
        ragged = bool(rng.random() < RAGGED)
        gated = bool(rng.random() < GATED)
        cf = CAPACITY[int(rng.integers(len(CAPACITY)))]
        cfg = Config(name=name, tokens=_log_uniform(rng, *TOKENS_RANGE, TOKENS_STEP),
                     hidden=_width(rng, ragged), ffn=_width(rng, ragged), experts=experts,
                     top_k=int(rng.integers(1, min(TOP_K_MAX, experts) + 1)),
                     gate=str(rng.choice(GATES_DRAWN)), capacity_factor=cf,
                     activation="swiglu" if gated else str(rng.choice(PLAIN_ACTIVATIONS)),
                     bias=bool(rng.random() < BIAS), skew=float(round(4 * rng.uniform(0, SKEW_MAX)) / 4),
                     precision=PRECISION, ranks=ranks)
        if weight_bytes(cfg) <= WEIGHT_BYTES_MAX and flops(cfg) <= FLOPS_MAX and slot_bytes(cfg) <= SLOT_BYTES_MAX:
            return cfg


def draw(seed: int = SEED) -> list[Config]:
    """The set the distribution gives for `seed`: val-00, val-01, ... by GPU count."""
    rng = np.random.default_rng(seed)
    return [_one(rng, f"val-{i * PER_GPU_COUNT + j:02d}", p)
            for i, p in enumerate(GPU_COUNTS) for j in range(PER_GPU_COUNT)]


def layers(ranks: int | None = None) -> list[Config]:
    """The committed validation layers (on `ranks` GPUs, or all)."""
    out = [Config.from_dict(d) for d in json.loads(PATH.read_text())]
    return [c for c in out if ranks is None or c.ranks == ranks]


def names() -> set[str]:
    return {c.name for c in layers()}


def ragged(cfg: Config, tile_n: int = FULL_STEP) -> bool:
    """Whether a GEMM of the layer has a narrower last column block at `tile_n`."""
    return bool(cfg.hidden % tile_n or cfg.ffn % tile_n)


def write(path: Path = PATH, seed: int = SEED) -> None:
    """Commit the draw of `seed` (python -m reference.validation_set)."""
    path.write_text(json.dumps([c.to_dict() for c in draw(seed)], indent=1) + "\n")


if __name__ == "__main__":
    write()
    print(f"wrote {PATH}: {len(layers())} layers")
