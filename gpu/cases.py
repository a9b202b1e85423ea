"""The cases the GPU tests and the benchmark run (dicts for gpu.worker).

check_cases: small configs against the float64 golden, covering fresh seeds, E = P and E = 8P,
every supported gate and activation, skewed routing, all tokens to one expert with and without
capacity dropping, T not a multiple of tile_m, tiny tiles, on the kernel's staged dispatch, then
its flat ("store") and "put" dispatch paths. bf16_check_cases: the bf16 kernel on
the same kinds of configs, against the reference's bf16-emulated golden. tf32_check_cases: the
TF32 kernel on such configs, against the reference's tf32 path (and float64). tf32x3_check_cases:
the split TF32 kernel on such configs, against float64 at float32's tolerance.
feature_check_cases: real models' layers in every build (gated activations, shared experts,
ragged H and I, scaled before the expert; gpt-oss' and DeepSeek-V2-Lite's sizes). sit_out_case: one
rank does not launch, the others must time out and raise. bench_cases: the FlashMoE default and
its token and expert sweeps (random inputs drawn on the GPU, checked against the torch layer),
each with its telemetry trace, in float32 (FP32_TILE_K: tiles 128 x 64 x 16), bf16 (BF16_TILE,
128 x 256 x 64: two warpgroups, each a wgmma.m64n128k16 per 64 rows, K in 64-deep slices four TMA
stages deep), tf32 (TF32_TILE, 128 x 128 x 8: three stages of float slices fit the static shared
memory) or tf32x3 (TF32X3_TILE, 128 x 128 x 32: two warpgroups of 64 columns, 32-float slices;
TF32X3_SHORT_TILE, 64 x 256 x 32, where an expert's rows on a GPU fit 64). validation_cases: the
validation set's layers (reference/validation_set.py) on P GPUs at the bf16 bench tile, traced.
zoo_check_cases: every zoo model's layer at full size, 256 tokens per GPU, bf16 and tf32x3, a sample
of its tokens against the golden streamed one expert at a time; zoo_trace_cases: every zoo model's
preset (4K tokens per GPU) in bf16, traced for the simulator's cross-check.
"""

from __future__ import annotations

from reference import Config, plan, presets, validation_set

from . import layout

# the kernel's max rel. error against the golden of its precision (gpu.worker.golden_path), by
# Config.precision: float32 against float64; bf16 against the bf16-emulated path (the kernel
# rounds the rows it returns once more); tf32 against the tf32 path at TF32's half-ulp, 2**-11: a
# GEMM0 output one float32 rounding away from the golden's may round to the other TF32 neighbour
# as GEMM1's operand (measured 1.5e-4 on H200 for one check case, so 1e-4 was too tight)
# float32's for tf32x3, whose three TF32 products are to give float32's accuracy
GOLDEN_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "tf32": 2.0**-11, "tf32x3": 1e-5}
TF32_VS_FLOAT64 = 5e-3  # the project's bar for the TF32 kernel against the float64 truth


def baseline_precision(cfg: Config) -> str:
    """The torch layer a kernel run is measured beside, in the same dtype: float32 (no TF32) for
    the split TF32 kernel, whose accuracy is float32's, else the kernel's GEMM precision."""
    return "float32" if cfg.precision == "tf32x3" else cfg.precision


def check_cases(p: int, seed: int, prefix: str = "") -> list[dict]:
    base = dict(tokens=200, hidden=128, ffn=256, experts=4 * p, top_k=2, capacity_factor=1.0, activation="relu",
                bias=True, ranks=p, gpus_per_node=8, tile_m=64, tile_n=32, tile_k=8, seed=seed)
    cases = [
        ("fresh", {}),
        ("e_eq_p", dict(experts=p, top_k=1)),
        ("e_8p_gelu_tanh", dict(experts=8 * p, activation="gelu_tanh", gate="softmax_topk_renorm")),
        ("nodrop_silu_topk_softmax", dict(capacity_factor=None, activation="silu", gate="topk_softmax")),
        ("skewed_sigmoid_gelu", dict(skew=2.0, gate="sigmoid_bias", activation="gelu")),
        ("one_expert_dropping", dict(skew=1000.0, capacity_factor=1.0)),
        ("one_expert_nodrop", dict(skew=1000.0, capacity_factor=None)),
        ("t_not_multiple_tile128", dict(tokens=333, tile_m=128, tile_n=64, hidden=256, ffn=512, experts=8 * p)),
        ("tiny_tiles", dict(tokens=96, hidden=64, ffn=128, experts=8, tile_m=32, tile_n=32) if 8 % p == 0 else {}),
    ]
    return [{"name": f"check-{n}-p{p}", "config": {**base, **ch}, "inputs": "reference", "golden": True,
             "trace": f"{prefix}trace-check-{n}-p{p}.npz" if n == "fresh" else None} for n, ch in cases] + \
        [put_return_case(f"check-put_return-p{p}", {**base, "tokens": 333, "tile_m": 128, "tile_n": 64}),
         {"name": f"check-flat_store-p{p}", "config": {**base, "experts": 8 * p, "skew": 2.0}, "inputs": "reference",
          "golden": True, "dispatch": "store"}]


def tensor_core_checks(tag: str, p: int, base: dict, cases: list[tuple[str, dict]]) -> list[dict]:
    """A tensor-core kernel's check cases (named check-TAG-NAME-pP): each change of `cases` to
    `base`, against the golden of its precision and the torch layer."""
    return [{"name": f"check-{tag}-{n}-p{p}", "config": {**base, **ch}, "inputs": "reference", "golden": True,
             "baseline_check": True} for n, ch in cases]


def put_return_case(name: str, config: dict) -> dict:
    """The kernel's put path: one block packs each dispatched tile and puts it, GEMM1's last task puts
    the whole tile home (its path where a peer is not load/store reachable)."""
    return {"name": name, "config": config, "inputs": "reference", "golden": True, "baseline_check": True,
            "dispatch": "put"}


# the bench's bf16 tile, 64 deep (wgmma's 128-byte swizzled rows): the fastest measured, two
# warpgroups sharing each A slice, one block per SM (docs/notes/bench-tiles.md)
BF16_TILE = (128, 256, 64)
# `tiles` points: the default at these shapes (the first also a `sweep` point): the previous bench
# tile, narrower and shorter tiles, more of them (slices are 64 deep: wgmma's 128-byte swizzled rows),
# and a taller one: three warpgroups of 64 x 256
BF16_TILE_VARIANTS = ((128, 128, 64), (128, 64, 64), (64, 128, 64), (192, 256, 64))


def bf16_check_cases(p: int, seed: int) -> list[dict]:
    base = dict(tokens=200, hidden=128, ffn=256, experts=4 * p, top_k=2, capacity_factor=1.0, activation="relu",
                bias=True, ranks=p, gpus_per_node=8, tile_m=64, tile_n=32, tile_k=64, seed=seed, precision="bfloat16")
    cases = [
        ("fresh", {}),
        ("e_8p_gelu_tanh", dict(experts=8 * p, activation="gelu_tanh", gate="softmax_topk_renorm")),
        # GEMM0's K = 128 is two slices, fewer than the stages the copies run ahead
        ("nodrop_silu_topk_softmax", dict(capacity_factor=None, activation="silu", gate="topk_softmax")),
        ("skewed_sigmoid_gelu", dict(skew=2.0, gate="sigmoid_bias", activation="gelu")),
        ("one_expert_dropping", dict(skew=1000.0, capacity_factor=1.0)),
        # the bench's tile (3 stages of 64) on short tiles: one band of warps idle, 16-row groups skipped
        ("t_not_multiple_tile128", dict(tokens=333, tile_m=128, tile_n=128, tile_k=64, hidden=256, ffn=512,
                                        experts=8 * p)),
        # 4 stages over K = 256 and 512, full 128-row tiles and a short last one, 64-wide wgmmas
        ("full_tiles_128x64", dict(tokens=600, tile_m=128, tile_n=64, hidden=256, ffn=512, experts=4 * p,
                                   activation="gelu_tanh")),
        # two warpgroups of 128 columns each (one block per SM), short tiles and full ones
        ("wide_tile_128x256", dict(tokens=333, tile_m=128, tile_n=256, hidden=256, ffn=512, experts=8 * p)),
        ("wide_tile_64x256", dict(tokens=600, tile_m=64, tile_n=256, hidden=512, ffn=256, experts=4 * p,
                                  activation="gelu_tanh")),
        # three warpgroups of 64 rows each (one block per SM): tiles of 1, 2 and 3 bands that hold rows
        ("tall_wide_tile_192x256", dict(tokens=500, tile_m=192, tile_n=256, hidden=256, ffn=512, experts=4 * p,
                                        capacity_factor=None, skew=1.0)),
    ]
    return tensor_core_checks("bf16", p, base, cases) + \
        [put_return_case(f"check-bf16-put_return-p{p}", {**base, **dict(cases)["t_not_multiple_tile128"]})]


# the bench's float32 tile depth: FlashMoE's 128 x 64 tile, 16 deep rather than the preset's 8:
# half the slices, so half the barriers and waits a task takes (docs/notes/bench-tiles.md)
FP32_TILE_K = 16
# the bench's tf32 tile: twice as wide as float32's, one mma k-step per cp.async stage; wider tiles
# read fewer fragment bytes per mma (docs/notes/bench-tiles.md). 128 x 64 x 16 is its `tiles` variant
TF32_TILE = (128, 128, 8)
TF32_TILE_VARIANTS = ((128, 64, 16),)


def tf32_check_cases(p: int, seed: int) -> list[dict]:
    base = dict(tokens=200, hidden=128, ffn=256, experts=4 * p, top_k=2, capacity_factor=1.0, activation="relu",
                bias=True, ranks=p, gpus_per_node=8, tile_m=64, tile_n=32, tile_k=16, seed=seed, precision="tf32")
    cases = [
        ("fresh", {}),
        ("e_8p_gelu_tanh", dict(experts=8 * p, activation="gelu_tanh", gate="softmax_topk_renorm")),
        ("nodrop_silu_topk_softmax_k8", dict(capacity_factor=None, activation="silu", gate="topk_softmax",
                                             tile_k=8)),
        ("skewed_sigmoid_gelu", dict(skew=2.0, gate="sigmoid_bias", activation="gelu")),
        ("one_expert_dropping", dict(skew=1000.0, capacity_factor=1.0)),
        ("t_not_multiple_tile128", dict(tokens=333, tile_m=128, tile_n=64, hidden=256, ffn=512, experts=8 * p)),
        ("wide_tile_128x128x8", dict(tokens=333, tile_m=128, tile_n=128, tile_k=8, hidden=256, ffn=512)),
    ]
    return tensor_core_checks("tf32", p, base, cases)


# the bench's split TF32 tile: 128 x 128 in two warpgroups of 64 columns (one block per SM), 32
# floats deep (wgmma's 128-byte swizzled rows); 128 x 256 leaves room for two stages only beside the
# lo parts, 64 x 256 takes the variant's place
TF32X3_TILE = (128, 128, 32)
TF32X3_TILE_VARIANTS = ((64, 256, 32),)
# the bench's tf32x3 tile where an expert's whole window on a GPU (C slots from each of P sources)
# fits 64 rows (1K and 2K tokens on one GPU, 1K on two): at 128 x 128 its tasks multiplied one
# 64-row block and still split and streamed the weights 128 columns at a time; 64 x 256 does each
# slice's fixed work for twice the columns. Side by side on two H200s those layers took 21-23%
# less time (1K on one GPU 1.517 -> 1.169 ms), and every larger one 1.3-3.8% more
# (measurements/gpu/experiments-2026-11-26-hints-tiles-stores.json).
TF32X3_SHORT_TILE = (64, 256, 32)


def tf32x3_check_cases(p: int, seed: int) -> list[dict]:
    base = dict(tokens=200, hidden=256, ffn=512, experts=4 * p, top_k=2, capacity_factor=1.0, activation="relu",
                bias=True, ranks=p, gpus_per_node=8, tile_m=64, tile_n=128, tile_k=32, seed=seed, precision="tf32x3")
    cases = [
        ("fresh", {}),
        ("e_8p_gelu_tanh", dict(experts=8 * p, activation="gelu_tanh", gate="softmax_topk_renorm")),
        # GEMM0's K = 128 is four slices, fewer than the seven the copies run ahead (GEMM1's: eight)
        ("nodrop_silu_topk_softmax", dict(capacity_factor=None, activation="silu", gate="topk_softmax",
                                          hidden=128, ffn=256)),
        ("skewed_sigmoid_gelu", dict(skew=2.0, gate="sigmoid_bias", activation="gelu")),
        ("one_expert_dropping", dict(skew=1000.0, capacity_factor=1.0)),
        # the bench's tile on short tiles: a 64-row block without rows skipped
        ("t_not_multiple_tile128", dict(tokens=333, tile_m=128, experts=8 * p)),
        # two warpgroups of 128 columns each
        ("wide_tile_64x256", dict(tokens=600, tile_n=256, experts=4 * p, activation="gelu_tanh")),
    ]
    return tensor_core_checks("tf32x3", p, base, cases) + \
        [put_return_case(f"check-tf32x3-put_return-p{p}", {**base, **dict(cases)["t_not_multiple_tile128"]})]


# the feature checks' tile per precision: 128 columns, so that H and I of 64s but not 128s are ragged
FEATURE_TILES = {"float32": dict(tile_m=64, tile_n=128, tile_k=8), "tf32": dict(precision="tf32", tile_m=64, tile_n=128,
                                                                                 tile_k=16),
                 "bfloat16": dict(precision="bfloat16", tile_m=64, tile_n=128, tile_k=64),
                 "tf32x3": dict(precision="tf32x3", tile_m=64, tile_n=128, tile_k=32)}
# each feature of real models' layers alone, then together: gated (a tight swiglu_oai limit, so its
# clamps bite), shared experts, ragged H and I (the last column block narrower), Llama 4's top-1
# scaled before its expert beside a shared one, and the final combine's warps over many tokens
FEATURES = (
    ("swiglu", dict(activation="swiglu")),
    ("shared2", dict(shared_experts=2, activation="gelu_tanh")),
    ("ragged", dict(hidden=192, ffn=320)),
    ("oai_shared_ragged", dict(activation="swiglu_oai", swiglu_limit=1.0, shared_experts=1, hidden=192, ffn=320)),
    ("scaled_before_shared", dict(top_k=1, activation="swiglu", shared_experts=1, scale_before_expert=True)),
    # more tokens than the grid has warps, so a warp combines several, and H's last round of row
    # loads only part full (H / 8 and H / 4 leave 8 and 16 vectors for 32 lanes)
    ("combine_part_round", dict(tokens=2048, hidden=1088, ffn=256)),
)
# real models' sizes at the bench's tiles: gpt-oss' H = I = 2880 (gated, ragged at 256 and 128 columns)
# and DeepSeek-V2-Lite's I = 1408 with its 2 shared experts and top-6, few experts and tokens
REAL_SHAPES = (
    ("gptoss_2880", dict(hidden=2880, ffn=2880, activation="swiglu_oai", top_k=2)),
    ("dsv2lite_1408", dict(hidden=2048, ffn=1408, activation="swiglu", shared_experts=2, top_k=6, experts=8)),
)


def feature_check_cases(p: int, seed: int, precisions=tuple(FEATURE_TILES)) -> list[dict]:
    """Every FEATURES change in each build against the golden of its precision (named
    check-feat-PRECISION-NAME-pP), and REAL_SHAPES at the bf16 and tf32x3 bench tiles."""
    base = dict(tokens=200, hidden=256, ffn=512, experts=4 * p, top_k=2, capacity_factor=1.0, activation="relu",
                bias=True, ranks=p, gpus_per_node=8, seed=seed)
    out = []
    for precision in precisions:
        for n, ch in FEATURES:
            cfg = {**base, **FEATURE_TILES[precision], **ch}
            out.append({"name": f"check-feat-{precision}-{n}-p{p}", "config": cfg, "inputs": "reference",
                        "golden": True})
    bench = {"bfloat16": PRECISIONS["bfloat16"][0], "tf32x3": PRECISIONS["tf32x3"][0]}
    for precision, tile in bench.items():
        if precision not in precisions:
            continue
        for n, ch in REAL_SHAPES:
            cfg = {**base, "tokens": 256, "experts": max(2 * p, ch.get("experts", 0)), **tile, **ch}
            cfg["experts"] = -(-cfg["experts"] // p) * p
            out.append({"name": f"check-feat-{precision}-{n}-p{p}", "config": cfg, "inputs": "reference",
                        "golden": True})
    return out


def tie_experts(cfg: Config, wg, gate_bias, wg_bias) -> None:
    """Tie experts in pairs, in place (NumPy arrays or torch tensors alike): expert E-1-e gets expert
    e's gate column and biases, for e < E / 4, so every token scores each pair equally (with skew 0),
    and mirrored whole groups score equally where a quarter of E is whole groups."""
    e = cfg.experts
    for src in range(e // 4):
        wg[:, e - 1 - src] = wg[:, src]
        gate_bias[e - 1 - src] = gate_bias[src]
        wg_bias[e - 1 - src] = wg_bias[src]


# every router of the real models' layers (reference/routing.py), each on random inputs and on
# inputs with tied experts and groups (tie_experts): E up to 256, k up to 8
ROUTERS = {
    "mixtral": dict(experts=8, top_k=2, gate="softmax_topk_renorm"),
    "qwen3": dict(experts=128, top_k=8, gate="softmax_topk"),
    "deepseek_v2": dict(experts=64, top_k=6, gate="softmax_topk", n_group=8, topk_group=3, routed_scaling=16.0),
    "deepseek_v3": dict(experts=256, top_k=8, gate="sigmoid_bias", n_group=8, topk_group=4, routed_scaling=2.5),
    "deepseek_v3_small_groups": dict(experts=16, top_k=4, gate="sigmoid_bias", n_group=4, topk_group=2),
    "llama4": dict(experts=16, top_k=1, gate="sigmoid_topk"),
    "sigmoid_topk_k4": dict(experts=32, top_k=4, gate="sigmoid_topk", routed_scaling=1.5),
    "gpt_oss": dict(experts=32, top_k=4, gate="topk_softmax", router_bias=True),
    "top_k_12": dict(experts=64, top_k=12, gate="softmax_topk_renorm"),  # the selection's two rounds of 8
}


def router_check_cases(p: int, seed: int) -> list[dict]:
    """The gate phase against the golden's routing for every router of ROUTERS, random and tied
    (check-router-NAME[-ties]-pP), in float32 and, for two of them, bf16 (check-router-bf16-...)."""
    base = dict(tokens=200, hidden=128, ffn=64, capacity_factor=1.0, activation="relu", bias=True, ranks=p,
                gpus_per_node=8, tile_m=64, tile_n=32, tile_k=8, seed=seed)
    bf16 = dict(precision="bfloat16", tile_k=64)
    todo = [(f"{n}{'-ties' if ties else ''}", {**base, **router}, ties)
            for n, router in ROUTERS.items() for ties in (False, True)]
    todo += [(f"bf16-{n}-ties", {**base, **ROUTERS[n], **bf16}, True) for n in ("deepseek_v3", "gpt_oss")]
    return [{"name": f"check-router-{n}-p{p}", "config": config, "inputs": "reference", "golden": True,
             "ties": ties} for n, config, ties in todo if config["experts"] % p == 0]


def moe_layer_cases(p: int, seed: int) -> list[dict]:
    """gpu.MoELayer called three times with new tokens, each call against the golden: a Mixtral-style
    router in float32 and in bf16, gpt-oss' router with its bias (moe-layer-NAME-pP)."""
    base = dict(tokens=160, hidden=128, ffn=64, experts=4 * p, top_k=2, capacity_factor=1.0, activation="relu",
                bias=True, ranks=p, gpus_per_node=8, tile_m=64, tile_n=32, tile_k=8, seed=seed,
                gate="softmax_topk_renorm")
    todo = {"float32": {}, "bf16": dict(precision="bfloat16", tile_k=64),
            "gpt_oss_router": dict(ROUTERS["gpt_oss"], experts=8 * p, bias=False)}
    return [{"name": f"moe-layer-{n}-p{p}", "config": {**base, **ch}, "calls": 3, "seed": seed}
            for n, ch in todo.items()]


def sit_out_case(p: int) -> dict:
    cfg = dict(tokens=256, hidden=128, ffn=256, experts=4 * p, top_k=2, ranks=p, tile_m=64, tile_n=32, tile_k=8)
    return {"name": f"sit-out-p{p}", "config": cfg, "sit_out": p - 1, "timeout_ms": 300.0}


# per bench precision: the changes to a float32 preset, the tag of its names, the torch layers it is
# timed beside (its own precision first) and its tile variants
PRECISIONS = {
    "float32": (dict(tile_k=FP32_TILE_K), "", ["float32", "bfloat16"], ()),
    "bfloat16": (dict(precision="bfloat16", tile_m=BF16_TILE[0], tile_n=BF16_TILE[1], tile_k=BF16_TILE[2]), "-bf16",
                 ["bfloat16"], BF16_TILE_VARIANTS),
    "tf32": (dict(precision="tf32", tile_m=TF32_TILE[0], tile_n=TF32_TILE[1], tile_k=TF32_TILE[2]), "-tf32",
             ["tf32", "float32"], TF32_TILE_VARIANTS),
    "tf32x3": (dict(precision="tf32x3", tile_m=TF32X3_TILE[0], tile_n=TF32X3_TILE[1], tile_k=TF32X3_TILE[2]), "-tf32x3",
               ["float32", "tf32"], TF32X3_TILE_VARIANTS),
}


def in_dtype(cfg: Config, dtype: str) -> Config:
    """`cfg` as the bench runs it in precision `dtype` (PRECISIONS; tf32x3 layers whose experts'
    windows fit 64 rows at TF32X3_SHORT_TILE; the calibration microbenchmarks take their tile
    shapes from here too)."""
    cfg = cfg.replace(**PRECISIONS[dtype][0])
    if dtype == "tf32x3" and cfg.slots * cfg.ranks <= TF32X3_SHORT_TILE[0]:
        m, n, k = TF32X3_SHORT_TILE
        cfg = cfg.replace(tile_m=m, tile_n=n, tile_k=k)
    return cfg


def bench_cases(p: int, points: str, prefix: str = "", dtype: str = "float32", trace: bool = True,
                dispatch: str = "staged", tile: tuple[int, int, int] | None = None,
                staged_blocks: int | None = None,
                apart: bool = False) -> list[dict]:
    """Every point is timed beside the torch layer of the same precision `dtype` (float32, bfloat16
    or tf32; float32 points also beside torch bf16, tf32 points beside torch float32) and, with
    `trace`, keeps its telemetry trace (`prefix` + trace-NAME[-bf16|-tf32]-pP.npz); the default
    point also profiles the torch layer. `points`: default, sweep (tokens and experts; bf16 and tf32
    also the default at their first tile variant), tiles (the default at each tile variant).
    `dispatch` (sim.trace.DISPATCH_PATHS) is how the kernel moves dispatched rows: "staged", its
    default; "store", every chunk shared by the processors at once (names end in -store, traced: the
    flat dispatch measured against the staged one); or "put", each dispatched chunk and each
    finished tile put by one block (its path where a peer is not load/store reachable; names end
    in -put and keep no trace: the simulator models the direct stores' return path). With
    `staged_blocks` the staged dispatch sends the peers' chunks from that many processors instead of
    layout.STAGED_BLOCKS (names end in -sendersN, untraced): the kernel's count measured against
    others. With `tile` (m, n, k)
    every point runs at that tile shape instead of the precision's own (names gain -tileMxNxK, no
    tile variants): a sweep of another tile, side by side with the bench tile's. With `apart` only
    the points whose tiles merging sources changes run, each source's rows in tiles of their own
    (merge_sources false; names end in -apart, no tile variants): the merged tiles measured
    against them."""
    _, tag, baselines, variants = PRECISIONS[dtype]
    if apart:
        tag, variants = f"-apart{tag}", ()
    if dispatch != "staged":
        tag, trace = f"{tag}-{dispatch}", trace and dispatch != "put"
    elif staged_blocks is not None:
        # another sender count than the kernel's (the simulator models STAGED_BLOCKS): untraced
        tag, trace = f"{tag}-senders{staged_blocks}", False
    if tile:
        tag, variants = f"-tile{'x'.join(map(str, tile))}{tag}", ()
    chosen = []
    for c in presets.SWEEPS["tokens"] + presets.SWEEPS["experts"]:
        if points in ("default", "tiles") and c.name != "flashmoe":
            continue
        if c.experts % p:
            continue
        c = in_dtype(c.replace(ranks=p), dtype)
        c = c.replace(tile_m=tile[0], tile_n=tile[1], tile_k=tile[2]) if tile else c
        if apart and (p == 1 or plan.source_stride(c) == plan.source_stride(c.replace(merge_sources=False))):
            continue  # merged or apart, the same tiles
        chosen.append(c.replace(merge_sources=False) if apart else c)
    if variants and points in ("sweep", "tiles"):
        # the default at other tile shapes: operand bytes from L2 per FLOP go as (BM + BN) / (BM BN),
        # barriers per task as K / BK
        flash = next(c for c in chosen if c.name == "flashmoe")
        chosen += [flash.replace(name=f"flashmoe-tile{m}x{n}x{k}", tile_m=m, tile_n=n, tile_k=k)
                   for m, n, k in (variants if points == "tiles" else variants[:1])]
    seen, cases = set(), []
    for c in chosen:
        if c.name in seen:
            continue
        seen.add(c.name)
        cases.append({"name": f"bench-{c.name}{tag}-p{p}", "config": c.to_dict(), "inputs": "random", "seed": 1,
                      "bench": True, "baselines": list(baselines), "warmup": 3,
                      "iters": 10, "trace": f"{prefix}trace-{c.name}{tag}-p{p}.npz" if trace else None,
                      "profile": c.name == "flashmoe" and dispatch == "staged" and staged_blocks is None,
                      "dispatch": dispatch, **({"staged_blocks": staged_blocks} if staged_blocks else {})})
    return cases


MATRIX_TOKENS = (1024, 4096, 16384)  # tokens per GPU of the zoo's layers
MATRIX_DTYPES = ("bfloat16", "tf32x3")


# what a kernel twin changes for each field the kernel refuses (gpu.layout.check_supported)
TWIN_CHANGES = {"activation": dict(activation="silu"), "shared_experts": dict(shared_experts=0),
                "scale_before_expert": dict(scale_before_expert=False), "n_group": dict(n_group=1, topk_group=1)}


def kernel_twin(cfg: Config) -> Config:
    """The layer with what the kernel does not compute yet taken out, field by field as
    gpu.layout.check_supported names them (TWIN_CHANGES: a non-gated SiLU for a gated activation,
    no shared experts, ...), named NAME-twin; a refusal it has no change for is left for the
    caller to report."""
    twin = cfg
    for _ in range(len(TWIN_CHANGES)):
        try:
            layout.check_supported(twin)
            break
        except layout.UnsupportedConfig as e:
            if e.field not in TWIN_CHANGES:
                break
            twin = twin.replace(**TWIN_CHANGES[e.field])
    return twin.replace(name=f"{cfg.name}-twin")


def zoo_layer(model: str, tokens: int, p: int, dtype: str) -> Config:
    """A zoo model's layer (reference.presets.ZOO) at `tokens` per GPU on `p` GPUs, as the bench runs
    precision `dtype`."""
    if model not in presets.ZOO:
        raise ValueError(f"matrix layer {model!r} is not known: one of {', '.join(presets.ZOO)}")
    name = f"{model}-{tokens // 1024}k" if tokens % 1024 == 0 else f"{model}-{tokens}"
    cfg = presets.ZOO[model].replace(name=name, tokens=tokens, ranks=p, precision="float32")
    return in_dtype(cfg, dtype)


def kernel_refuses(cfg: Config) -> str | None:
    """Why the kernel does not run `cfg` (gpu.layout.check_supported), None where it does."""
    try:
        layout.check_supported(cfg)
    except layout.UnsupportedConfig as e:
        return str(e)
    return None


def matrix_layer(model: str, tokens: int, p: int, dtype: str) -> Config:
    """zoo_layer, or its kernel_twin where the kernel does not support the layer itself (its ragged
    column blocks, gpt-oss' 2880 columns, run at the bench tiles)."""
    cfg = zoo_layer(model, tokens, p, dtype)
    return kernel_twin(cfg) if kernel_refuses(cfg) else cfg


def matrix_cases(p: int, dtype: str, layers, tokens, flashmoe: bool = True, torch_models: bool = True) -> list[dict]:
    """The benchmark matrix's cases on `p` GPUs in precision `dtype`: each zoo model of `layers` at
    each of `tokens` per GPU (matrix_layer), then (with `flashmoe`) FlashMoE's token and expert
    sweeps; each timed beside the torch layers of its precision (padded, dropless, dropless
    per-expert loop), untraced. With `torch_models`, each zoo model the kernel runs as its twin
    also as it is, in the torch layers alone (case "torch_only"). Names:
    matrix-MODEL-Tk[-twin][-bf16|-tf32x3]-pP."""
    tag = PRECISIONS[dtype][1]
    configs = [matrix_layer(model, t, p, dtype) for model in layers for t in tokens]
    if flashmoe:
        configs += [in_dtype(c.replace(ranks=p), dtype) for c in presets.SWEEPS["tokens"] + presets.SWEEPS["experts"]
                    if c.experts % p == 0]
    # one point keeps torch profiler tables of its torch layers (in the run's summary.json): where
    # their time goes on the fine-grained top-8 layer
    profiled = "qwen3-30b-a3b-4k"
    cases = [{"name": f"matrix-{c.name}{tag}-p{p}", "config": c.to_dict(), "inputs": "random", "seed": 1,
              "bench": True, "baselines": [baseline_precision(c)], "warmup": 3, "iters": 10, "trace": None,
              "profile": c.name.removesuffix("-twin") == profiled} for c in dict.fromkeys(configs)]
    if torch_models:  # the models the kernel runs as twins, in torch as they are
        for model in layers:
            for t in tokens:
                c = zoo_layer(model, t, p, dtype)
                why = kernel_refuses(c)
                if why:
                    cases.append({"name": f"matrix-{c.name}{tag}-p{p}", "config": c.to_dict(), "seed": 1,
                                  "torch_only": f"not in the kernel: {why}", "baselines": [baseline_precision(c)],
                                  "warmup": 3, "iters": 10})
    return cases


# the zoo's full-size checks: every model's layer at its true shape, ZOO_CHECK_TOKENS per GPU, in each
# of ZOO_CHECK_DTYPES; ZOO_CHECK_SAMPLES tokens of each rank against the golden (gpu.worker.run_zoo_check)
ZOO_CHECK_TOKENS, ZOO_CHECK_SAMPLES = 256, 32
ZOO_CHECK_DTYPES = ("bfloat16", "tf32x3")


def _zoo_cases(p: int, dtypes, tokens: int | None, name, fields, models=None) -> list[dict]:
    """One case per zoo model (of `models`, default all) and precision of `dtypes` at `tokens` per GPU
    on `p` GPUs (None: the preset's own): name(model, dtype, cfg) names it, fields(cfg) gives its dict
    beyond name and config; a case the kernel cannot run (E not a multiple of p, a field it refuses)
    carries the reason as `skip`."""
    out = []
    for model, layer in presets.ZOO.items():
        if models is not None and model not in models:
            continue
        for dtype in dtypes:
            if layer.experts % p:
                out.append({"name": name(model, dtype, layer), "config": layer.to_dict(), "skip": f"its "
                            f"{layer.experts} experts do not divide over {p} GPUs (the kernel places E / P on each)"})
                continue
            cfg = zoo_layer(model, tokens or layer.tokens, p, dtype)
            case = {"name": name(model, dtype, cfg), "config": cfg.to_dict(), **fields(cfg)}
            why = kernel_refuses(cfg)
            out.append({**case, "skip": f"not in the kernel: {why}"} if why else case)
    return out


def zoo_check_cases(p: int, seed: int, samples: int = ZOO_CHECK_SAMPLES, models=None) -> list[dict]:
    """Every zoo model's layer (reference.presets.ZOO) at its true H, I, E, k, router, activation,
    shared experts and biases, ZOO_CHECK_TOKENS tokens per GPU on `p` GPUs, at the bench tile of each
    ZOO_CHECK_DTYPES precision (in_dtype), inputs drawn on the GPU from `seed`: the kernel's routing
    of every token and its output of `samples` random tokens per rank against the golden
    (gpu.worker.run_zoo_check). Named zoo-MODEL-bf16|-tf32x3-pP; `models` picks some."""
    return _zoo_cases(p, ZOO_CHECK_DTYPES, ZOO_CHECK_TOKENS,
                      lambda model, dtype, cfg: f"zoo-{model}{PRECISIONS[dtype][1]}-p{p}",
                      lambda cfg: {"inputs": "random", "seed": seed, "zoo_samples": samples}, models)


def zoo_trace_cases(p: int, prefix: str = "", models=None) -> list[dict]:
    """Every zoo model's preset at its tokens per GPU (4K) on `p` GPUs in bf16 at the bench tile, run
    as validation_cases runs a layer: traced (`prefix` + trace-zoo-MODEL-4k-pP.npz, a measured run
    for `moelab compare`), checked against the torch layer, timed beside no torch layer. Named
    zootrace-MODEL-4k-pP; `models` picks some."""
    return _zoo_cases(p, ("bfloat16",), None, lambda model, dtype, cfg: f"zootrace-{model}-4k-p{p}",
                      lambda cfg: {"inputs": "random", "seed": 1, "bench": True, "baselines": [], "warmup": 3,
                                   "iters": 10, "trace": f"{prefix}trace-zoo-{cfg.name}-p{p}.npz",
                                   "profile": False, "dispatch": "staged"}, models)


def validation_cases(p: int, prefix: str = "") -> tuple[list[dict], list[tuple[str, str]]]:
    """The validation set's layers on `p` GPUs as bench cases at the bf16 bench tile, each traced
    (`prefix` + trace-val-NN-pP.npz) and checked against the torch layer, timed beside no torch
    layer; and the (name, reason) of those the kernel refuses. Layers without a ragged column block
    run first: a kernel that cannot run one stops its GPU count's job there."""
    run, refused = [], []
    for c in validation_set.layers(ranks=p):
        c = in_dtype(c, "bfloat16")
        try:
            layout.check_supported(c)
        except layout.UnsupportedConfig as e:
            refused.append((c.name, str(e)))
            continue
        run.append(c)
    run.sort(key=lambda c: validation_set.ragged(c, c.tile_n))
    return [{"name": f"validate-{c.name}-p{p}", "config": c.to_dict(), "inputs": "random", "seed": 1, "bench": True,
             "baselines": [], "warmup": 3, "iters": 10, "trace": f"{prefix}trace-{c.name}-p{p}.npz", "profile": False,
             "dispatch": "staged"} for c in run], refused
