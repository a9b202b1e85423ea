"""The launcher's pure-Python parts: argument checks, sizes, cache keys, error and log decoding."""

import pickle
import re

import numpy as np
import pytest

from gpu import build, errors, layout, telemetry
from reference import Config, plan, presets
from reference import config as reference_config
from reference.config import GATES
from sim import costs
from sim.trace import KIND, KINDS


def test_unsupported_fields_are_named():
    base = presets.get("tiny")
    for change, field in [(dict(shared_experts=31), "shared_experts"),
                          (dict(tile_m=24, tokens=96), "tile_m"), (dict(tile_n=12, hidden=96, ffn=96), "tile_n"),
                          (dict(tile_n=64, hidden=96), "hidden"), (dict(tile_n=128, ffn=200), "ffn"),
                          (dict(activation="swiglu", tile_n=8), "tile_n")]:  # a float32 thread's gate beside its up
        with pytest.raises(layout.UnsupportedConfig) as e:
            layout.check_supported(base.replace(**change))
        assert e.value.field == field and field in str(e.value)
    layout.check_supported(base)
    # gated, shared experts, scaled before the expert, ragged H and I: each a build flag, only where present
    real = base.replace(activation="swiglu", shared_experts=2, top_k=1, scale_before_expert=True, hidden=192,
                        ffn=320, tile_n=128)
    layout.check_supported(real)
    swiglu, oai = (reference_config.ACTIVATIONS.index(a) for a in ("swiglu", "swiglu_oai"))  # the build's codes
    assert layout.compile_options(real) == {"TILE_M": 32, "TILE_N": 128, "TILE_K": 8, "MOE_GATED": swiglu,
                                            "MOE_SHARED": 1, "MOE_SCALE_BEFORE": 1, "MOE_RAGGED": 1}
    assert layout.compile_options(base.replace(activation="swiglu_oai"))["MOE_GATED"] == oai
    assert layout.compile_options(base) == {"TILE_M": 32, "TILE_N": 32, "TILE_K": 8}
    s = layout.Sizes.of(real)  # gated GEMM0: 2 x 320 interleaved columns in blocks of 128; GEMM1: 192 in 2
    assert (s.n0, s.n1, s.S, s.WS) == (5, 2, 2, 3)
    assert s.queue_cap == (s.L * s.W + 2 * 3) * (5 + 2) + s.E * s.CH


def test_every_router_runs_and_the_gate_limits_are_named():
    """The gate phase takes every router (routed scaling, router bias, group-limited top-k); the
    router check cases are supported on 1, 2 and 4 GPUs; its limits are refused by field."""
    from gpu import cases

    for p in (1, 2, 4):
        for c in cases.router_check_cases(p, 3):
            layout.check_supported(Config.from_dict(c["config"]))
    base = presets.get("tiny").replace(experts=64, top_k=2)
    for change, field in [(dict(n_group=64, topk_group=2), "n_group")]:
        with pytest.raises(layout.UnsupportedConfig) as e:
            layout.check_supported(base.replace(**change))
        assert e.value.field == field and field in str(e.value)
    layout.check_supported(base.replace(gate="softmax_topk", n_group=32, topk_group=2))  # groups of two
    layout.check_supported(base.replace(top_k=1, scale_before_expert=True))  # Llama 4: the dispatch scales


def test_gate_kinds_are_the_configs_routers_in_order():
    """params.cuh's GATE_* take the -D flags' values, which number reference.config.GATES in order
    (runtime passes the index)."""
    from reference.config import GATES

    text = (layout.KERNEL_DIR / "params.cuh").read_text()
    named = re.findall(r"GATE_([A-Z_]+) = MOELAB_GATE_\1\b", text)
    assert [n.lower() for n in named] == list(GATES)
    consts = layout.kernel_constants()
    assert [consts[f"MOELAB_GATE_{g.upper()}"] for g in GATES] == list(range(len(GATES)))


def test_tied_experts_score_alike():
    """cases.tie_experts gives expert E-1-e expert e's gate column and biases (e < E / 4), in place,
    so their logits tie for every token and the mirrored groups' scores do too."""
    from gpu import cases

    cfg = Config(experts=16, top_k=4, n_group=4, topk_group=2, gate="sigmoid_bias")
    rng = np.random.default_rng()
    wg, gate_bias, wg_bias = rng.standard_normal((8, 16)), rng.standard_normal(16), rng.standard_normal(16)
    untouched = wg[:, 4:12].copy()
    cases.tie_experts(cfg, wg, gate_bias, wg_bias)
    z = rng.standard_normal((5, 8)) @ wg + wg_bias
    assert np.array_equal(z[:, 12:][:, ::-1], z[:, :4]) and np.array_equal(gate_bias[12:][::-1], gate_bias[:4])
    assert np.array_equal(wg[:, 4:12], untouched)
    s = z + gate_bias
    assert np.array_equal(np.sort(s[:, :4], -1), np.sort(s[:, 12:], -1))  # groups 0 and 3 score alike


def test_bf16_tile_shape_is_checked_field_by_field():
    flash = presets.get("flashmoe")
    bf = flash.replace(precision="bfloat16", tile_m=128, tile_n=128, tile_k=64)
    layout.check_supported(bf)
    for change, field in [(dict(tile_k=16), "tile_k"), (dict(tile_m=32), "tile_m"), (dict(tile_m=96), "tile_m"),
                          (dict(tile_m=512, tile_n=32), "tile_m"), (dict(tile_n=16), "tile_n"),
                          (dict(tile_m=256, tile_n=256), "tile_n"),  # 256 accumulators per thread of 2 warpgroups
                          (dict(tile_m=256, tile_n=128), "tile_n"),  # 256 accumulators per thread
                          (dict(tile_k=32), "tile_k"), (dict(tile_k=128), "tile_k"),  # 64: one swizzled line
                          (dict(tile_m=256, tile_n=64), "tile_k")]:  # 3 stages of 40 KiB exceed 112 KiB
        with pytest.raises(layout.UnsupportedConfig) as e:
            layout.check_supported(bf.replace(**change))
        assert e.value.field == field and "bfloat16" in str(e.value)
    with pytest.raises(layout.UnsupportedConfig, match=r"tile_k.*64 for bfloat16"):
        layout.check_supported(flash.replace(precision="bfloat16"))  # the fp32 default's tile_k = 8
    with pytest.raises(layout.UnsupportedConfig, match=r"tile_n.*one of \[32, 64\]"):
        layout.check_supported(bf.replace(tile_m=256))
    assert layout.compile_options(bf) == {"TILE_M": 128, "TILE_N": 128, "TILE_K": 64, "MOE_BF16": 1, "GEMM_STAGES": 3}
    wide = bf.replace(tile_n=256)
    layout.check_supported(wide)
    assert layout.compile_options(wide) == {"TILE_M": 128, "TILE_N": 256, "TILE_K": 64, "MOE_BF16": 1, "GEMM_STAGES": 4,
                                            "BLOCK_WARPGROUPS": 2, "MIN_BLOCKS_PER_SM": 1}
    assert layout.block_threads(layout.compile_options(wide)) == 256 and layout.block_threads({}) == 128
    tall = bf.replace(tile_m=192, tile_n=256)  # three warpgroups of 64 rows: 128 accumulators each, 384 threads
    layout.check_supported(tall)
    assert layout.compile_options(tall) == {"TILE_M": 192, "TILE_N": 256, "TILE_K": 64, "MOE_BF16": 1, "GEMM_STAGES": 4,
                                            "BLOCK_WARPGROUPS": 3, "MIN_BLOCKS_PER_SM": 1}
    # the launch bounds cap the kernel at 168 registers a thread; the functions it calls get the cap too
    assert build.register_cap(layout.compile_options(tall)) == ["-maxrregcount=168"]
    assert build.register_cap(layout.compile_options(wide)) == build.register_cap(layout.compile_options(bf)) == []
    assert layout.kernel_name(bf) == "moelab_moe_bf16" and layout.kernel_name(flash) == "moelab_moe_fp32"


def test_bf16_stages_fill_a_block_of_two_per_sm_or_one_of_several_warpgroups():
    flash = presets.get("flashmoe").replace(precision="bfloat16")
    for (m, n), stages in [((128, 128), 3), ((128, 64), 4), ((64, 128), 4), ((64, 32), 8), ((192, 64), 3),
                           ((128, 256), 4), ((64, 256), 5), ((192, 256), 4)]:
        cfg = flash.replace(tile_m=m, tile_n=n, tile_k=64)
        layout.check_supported(cfg)
        # 228 KiB per SM: 2 blocks of one warpgroup, or 1 of several, less 1 KiB reserved and 1 KiB static each
        wide = n == 256
        assert layout.smem_per_block(cfg) == (226 if wide else 112) * 1024
        stage = 2 * (m + n) * 64
        assert layout.wgmma_stage_bytes(cfg) == stage and layout.wgmma_stages(cfg) == stages
        assert layout.wgmma_smem_bytes(cfg) == stages * stage + 1024 <= layout.smem_per_block(cfg)
        assert m * n // layout.block_threads(layout.compile_options(cfg)) <= layout.BF16_MAX_ACC


def test_bf16_tile_rows_stay_half_the_bytes():
    flash = presets.get("flashmoe")
    bf = flash.replace(precision="bfloat16", tile_k=32)
    # bf16 rows are half the bytes: the symmetric heap halves but for the signals
    s32, s16 = layout.Sizes.of(flash), layout.Sizes.of(bf)
    assert s16.elem_bytes == 2 and s16.symmetric_bytes - 8 * s16.signal_words == (
        s32.symmetric_bytes - 8 * s32.signal_words) // 2


def test_bf16_cases_are_supported():
    from gpu import cases

    for c in (cases.bf16_check_cases(2, 7) + cases.bench_cases(2, "sweep", "x-", "bfloat16")
              + cases.bench_cases(2, "tiles", "x-", "bfloat16")):
        cfg = Config.from_dict(c["config"])
        assert cfg.dtype == "bfloat16"
        layout.check_supported(cfg)
    bench = cases.bench_cases(1, "default", "x-", "bfloat16")
    assert bench[0]["trace"] == "x-trace-flashmoe-bf16-p1.npz" and bench[0]["baselines"] == ["bfloat16"]
    assert cases.bench_cases(1, "default", "x-", trace=False)[0]["trace"] is None


def test_bench_sweep_at_another_tile():
    from gpu import cases

    own = cases.bench_cases(1, "sweep", "x-", "bfloat16")
    wide = cases.bench_cases(1, "sweep", "x-", "bfloat16", tile=(128, 256, 64))
    assert len(wide) == len(own) - 1  # the tile variant point is the tile sweep's own default
    for c in wide:
        cfg = Config.from_dict(c["config"])
        assert (cfg.tile_m, cfg.tile_n, cfg.tile_k) == (128, 256, 64) and "-tile128x256x64-bf16-p1" in c["name"]
        layout.check_supported(cfg)
    assert {c["config"]["experts"] for c in wide} == {c["config"]["experts"] for c in own}


def test_tf32_tile_shape_is_checked_field_by_field():
    flash = presets.get("flashmoe")
    tf = flash.replace(precision="tf32", tile_k=16)
    layout.check_supported(tf)
    layout.check_supported(flash.replace(precision="tf32"))  # the fp32 default's 128 x 64 x 8 tiles fit too
    for change, field in [(dict(tile_m=32), "tile_m"), (dict(tile_m=256), "tile_m"),  # 256 rows spill
                          (dict(tile_k=4), "tile_k"), (dict(tile_k=32), "tile_k"),  # 3 stages of 32 exceed 47 KiB
                          (dict(tile_n=256), "tile_n"),  # 256 accumulators per thread
                          (dict(tile_n=48, hidden=1920, ffn=1920, tile_k=8), "tile_n")]:  # no power of two
        with pytest.raises(layout.UnsupportedConfig) as e:
            layout.check_supported(tf.replace(**change))
        assert e.value.field == field and "tf32" in str(e.value)
    layout.check_supported(tf.replace(tile_m=64, tile_n=256, tile_k=8))  # 128 accumulators: no spill
    with pytest.raises(layout.UnsupportedConfig, match="32-bit offsets"):
        layout.check_supported(Config(tokens=8, hidden=2**24, ffn=128, tile_m=128, tile_n=64, tile_k=8,
                                      precision="tf32"))
    assert layout.compile_options(tf) == {"TILE_M": 128, "TILE_N": 64, "TILE_K": 16, "MOE_TF32": 1}
    assert layout.kernel_name(tf) == "moelab_moe_tf32"
    # float32 storage: the buffers are those of the float32 kernel
    assert layout.Sizes.of(tf) == layout.Sizes.of(flash.replace(tile_k=16))


def test_tf32_cases_are_supported():
    from gpu import cases

    checks = cases.tf32_check_cases(2, 7)
    benches = cases.bench_cases(2, "sweep", "x-", "tf32") + cases.bench_cases(2, "tiles", "x-", "tf32")
    for c in checks + benches:
        cfg = Config.from_dict(c["config"])
        assert cfg.precision == "tf32" and cfg.dtype == "float32" and cfg.precision == "tf32"
        layout.check_supported(cfg)
    assert {Config.from_dict(c["config"]).tokens % Config.from_dict(c["config"]).tile_m for c in checks} != {0}
    assert any(Config.from_dict(c["config"]).capacity_factor is None for c in checks)
    bench = cases.bench_cases(1, "default", "x-", "tf32")
    assert bench[0]["trace"] == "x-trace-flashmoe-tf32-p1.npz" and bench[0]["baselines"] == ["tf32", "float32"]
    tile = Config.from_dict(bench[0]["config"])
    assert (tile.tile_m, tile.tile_n, tile.tile_k) == cases.TF32_TILE
    names = [c["name"] for c in cases.bench_cases(2, "sweep", "x-", "tf32")]
    assert "bench-flashmoe-tokens-1k-tf32-p2" in names and "bench-flashmoe-experts-128-tf32-p2" in names
    assert "bench-flashmoe-tile128x64x16-tf32-p2" in names
    # the float32 and bf16 bench points are those of before
    assert cases.bench_cases(1, "default")[0]["baselines"] == ["float32", "bfloat16"]
    assert Config.from_dict(cases.bench_cases(1, "default")[0]["config"]) == \
        presets.get("flashmoe").replace(ranks=1, tile_k=cases.FP32_TILE_K)


def test_tf32x3_cases_are_supported_in_two_warpgroups_with_room_for_the_lo_parts():
    from gpu import cases

    checks = cases.tf32x3_check_cases(2, 7)
    benches = cases.bench_cases(2, "sweep", "x-", "tf32x3") + cases.bench_cases(2, "tiles", "x-", "tf32x3")
    for c in checks + benches:
        cfg = Config.from_dict(c["config"])
        assert cfg.precision == "tf32x3" and cfg.precision == "tf32x3" and cases.baseline_precision(cfg) == "float32"
        layout.check_supported(cfg)
        opts = layout.compile_options(cfg)
        assert opts["MOE_TF32X3"] == 1 and opts["BLOCK_WARPGROUPS"] == 2 and opts["MIN_BLOCKS_PER_SM"] == 1
        stage = 4 * (cfg.tile_m + cfg.tile_n) * 32
        assert layout.wgmma_stage_bytes(cfg) == stage and layout.wgmma_stages(cfg) == opts["GEMM_STAGES"] >= 3
        # the stages, two stage-sized copies for the lo parts, the alignment room: within one block per SM
        assert layout.wgmma_smem_bytes(cfg) == (opts["GEMM_STAGES"] + 2) * stage + 1024 <= 226 * 1024
        assert cfg.tile_m * cfg.tile_n // layout.block_threads(opts) <= layout.BF16_MAX_ACC
    default = next(Config.from_dict(c["config"]) for c in benches if c["name"] == "bench-flashmoe-tf32x3-p2")
    assert layout.compile_options(default)["GEMM_STAGES"] == 5  # 128 x 128
    assert layout.kernel_name(Config.from_dict(checks[0]["config"])) == "moelab_moe_tf32x3"
    bench = cases.bench_cases(1, "default", "x-", "tf32x3")[0]
    assert bench["trace"] == "x-trace-flashmoe-tf32x3-p1.npz" and bench["baselines"] == ["float32", "tf32"]
    assert cases.GOLDEN_TOLERANCE["tf32x3"] == cases.GOLDEN_TOLERANCE["float32"]


@pytest.mark.parametrize("tile, field, needle", [
    ((256, 128, 32), "tile_m", "64 or 128 for tf32x3"),
    ((128, 64, 32), "tile_n", "128 or 256 for tf32x3"),
    ((128, 256, 32), "tile_n", "small enough that 3 TMA stages and 2 copies for the lo parts"),
    ((128, 128, 16), "tile_k", "32 for tf32x3"),
])
def test_tf32x3_tiles_the_kernel_lacks_are_named(tile, field, needle):
    cfg = presets.get("flashmoe").replace(precision="tf32x3", tile_m=tile[0], tile_n=tile[1], tile_k=tile[2])
    with pytest.raises(layout.UnsupportedConfig) as err:
        layout.check_supported(cfg)
    assert err.value.field == field and needle in err.value.allowed


def test_tf32x3_bench_takes_the_short_tile_where_an_experts_window_fits_64_rows():
    from gpu import cases

    def tiles(p):
        return {c["name"]: (lambda k: (k.tile_m, k.tile_n, k.tile_k))(Config.from_dict(c["config"]))
                for c in cases.bench_cases(p, "sweep", "x-", "tf32x3")}

    short, tall = cases.TF32X3_SHORT_TILE, cases.TF32X3_TILE
    # C = T k / E slots from each of P sources: 32 and 64 on one GPU, 32 x 2 on two
    assert tiles(1)["bench-flashmoe-tokens-1k-tf32x3-p1"] == short
    assert tiles(1)["bench-flashmoe-tokens-2k-tf32x3-p1"] == short
    assert tiles(2)["bench-flashmoe-tokens-1k-tf32x3-p2"] == short
    # 128 rows: 4K on one GPU, 2K on two, 1K on four, and the default everywhere
    assert tiles(1)["bench-flashmoe-tokens-4k-tf32x3-p1"] == tall
    assert tiles(2)["bench-flashmoe-tokens-2k-tf32x3-p2"] == tall
    assert tiles(4)["bench-flashmoe-tokens-1k-tf32x3-p4"] == tall
    assert {tiles(p)[f"bench-flashmoe-tf32x3-p{p}"] for p in (1, 2, 4)} == {tall}
    # the rule is the windows' rows, with or without dropping, and tf32x3's alone
    flash = presets.get("flashmoe").replace(ranks=1)
    assert cases.in_dtype(flash.replace(tokens=2080), "tf32x3").tile_m == tall[0]  # C = 65
    assert cases.in_dtype(flash.replace(tokens=1024, capacity_factor=None), "tf32x3").tile_m == tall[0]  # C = T
    assert cases.in_dtype(flash.replace(tokens=1024), "bfloat16").tile_m == cases.BF16_TILE[0]


def test_tf32_stages_are_the_kernels():
    text = (layout.KERNEL_DIR / "tile_gemm_tf32.cuh").read_text()
    assert re.search(r"STAGES = (\d+);", text)[1] == str(layout.TF32_STAGES)


def test_sizes_derive_from_config():
    s = layout.Sizes.of(presets.get("flashmoe"))
    # 4 sources' 256 slots in windows of 128: 8 tiles a local expert, 2 chunks a block
    assert (s.C, s.W, s.CH, s.stride, s.L, s.n0, s.n1) == (256, 8, 2, 256, 16, 32, 32)
    assert s.queue_cap == 16 * 8 * 64 + 64 * 2
    nodrop = layout.Sizes.of(Config(tokens=100, capacity_factor=None, tile_m=32))
    assert (nodrop.C, nodrop.W, nodrop.CH) == (100, 4, 4)  # 100 slots from position 0: 4 windows
    two = layout.Sizes.of(Config(tokens=100, capacity_factor=None, tile_m=32, ranks=2, experts=8))
    assert (two.W, two.CH) == (7, 4)  # source 1's slots 100..199 start mid-window: windows 3..6
    apart = layout.Sizes.of(Config(tokens=100, capacity_factor=None, tile_m=32, merge_sources=False))
    assert (apart.W, apart.CH, apart.stride) == (4, 4, 128)
    merged = layout.Sizes.of(presets.get("flashmoe").replace(tokens=1024, ranks=2))
    assert (merged.C, merged.W, merged.CH, merged.stride) == (32, 1, 1, 32)  # both sources' rows in one tile
    big_cf = layout.Sizes.of(Config(tokens=10, experts=2, top_k=1, capacity_factor=8.0))
    assert big_cf.C == 10  # a block never exceeds T rows


def test_param_fields_match_the_struct():
    fields = layout.param_fields()
    assert fields[:3] == ["x", "wg", "logit_offset"] and fields[-2:] == ["swiglu_alpha", "swiglu_limit"]
    assert len(fields) == len(set(fields))
    sizes = {"T", "H", "I", "E", "K", "P", "L", "C", "W", "CH", "stride", "rank", "gate_kind", "act_kind", "n_proc",
             "queue_cap", "tlog_cap", "timeout_ns", "direct_stores", "staged_blocks", "gate_splits", "n_group",
             "topk_group", "routed_scaling", "S", "WS", "shared_out"}
    assert sizes <= set(fields)


def test_source_buffers_hold_the_rows_a_rank_sends_and_the_heap_adds_up():
    rng = np.random.default_rng()
    base = presets.ZOO[str(rng.choice(list(presets.ZOO)))]
    t = int(rng.integers(1, 65)) * 64
    for cf in (None, float(rng.uniform(0.5, 2.0))):
        cfg = base.replace(tokens=t, capacity_factor=cf)
        s = layout.Sizes.of(cfg)
        # staging and combox: one row per kept (token, choice); inbox and outbuf: every (expert, slot)
        assert s.source_rows == min(t * cfg.top_k, cfg.experts * cfg.slots) and s.owner_rows == cfg.experts * cfg.slots
        assert s.symmetric_bytes == 2 * s.elem_bytes * s.H * (s.owner_rows + s.source_rows) + 8 * s.signal_words
        assert s.source_rows == t * cfg.top_k or cf is not None
    # the signal arrays in the order of their Params fields, one after another
    slices = layout.Sizes.of(base).signal_slices
    fields = [f for f in layout.param_fields() if f.startswith("sig_")]
    end = slices["sig_start"][1]
    assert list(slices) == fields and slices["sig_base"] == (end, end + base.experts)


def test_deepseek_v3_fits_an_h100_on_four_gpus_to_4k_tokens():
    v3 = presets.ZOO["deepseek-v3"]
    assert v3.ranks == 4

    def gb(t):
        cfg = v3.replace(tokens=t)
        return (layout.layer_bytes(cfg) + layout.input_bytes(cfg)) / 1e9

    assert gb(1024) < gb(4096) < 80 < gb(16384)
    # the heap before the source-side buffers were T k rows: 4 x E x T x H bf16, 60 GB at 4K
    assert layout.Sizes.of(v3).symmetric_bytes < 0.55 * 4 * 256 * 4096 * 7168 * 2


def test_scheduler_capacity_is_the_kernels():
    """The host refuses grids past what the scheduler warp keeps in registers, and sizes the
    mailboxes by the tasks a processor may hold (os.cuh)."""
    text = (layout.KERNEL_DIR / "os.cuh").read_text()
    groups = int(re.search(r"constexpr int SCHED_GROUPS = (\d+);", text)[1])
    assert 32 * groups == layout.MAX_PROCESSORS
    assert int(re.search(r"constexpr int MAILBOX_SLOTS = (\d+);", text)[1]) == layout.MAILBOX_SLOTS == 2


def test_simulated_queue_policy_is_the_kernel_builds():
    """The bf16 build queues an expert's tiles' tasks together (os.cuh QUEUE_BY_EXPERT,
    enqueue_expert): its subscriber their GEMM0 tasks, the processor ending the last tile's GEMM0
    their GEMM1 tasks; the float32 and tf32 builds each tile's; the simulator's queue_policy,
    which the worker writes into every trace, says the same of each build ("expert", GEMM0's
    alone, is the bf16 build's of earlier traces)."""
    text = (layout.KERNEL_DIR / "os.cuh").read_text()
    by_build = re.search(r"#if MOE_BF16\nconstexpr bool QUEUE_BY_EXPERT = (\w+);\n#else\n"
                         r"constexpr bool QUEUE_BY_EXPERT = (\w+);", text)
    assert by_build and by_build.groups() == ("true", "false")
    assert "if (QUEUE_BY_EXPERT) {" in text and "enqueue_expert<BM>(p, TASK_GEMM0, le, n0, BN)" in text
    processor = (layout.KERNEL_DIR / "processor.cuh").read_text()
    assert "if (last && QUEUE_BY_EXPERT) {" in processor
    assert "enqueue_expert<BM>(p, TASK_GEMM1, le, n1, BN)" in processor
    cfg = presets.get("flashmoe")
    policy = {name: costs.queue_policy(c) for name, c in (
        ("float32", cfg), ("tf32", cfg.replace(precision="tf32")), ("bfloat16", cfg.replace(precision="bfloat16")))}
    assert policy == {"float32": "tile", "tf32": "tile", "bfloat16": "expert-both"}
    assert set(policy.values()) | {"expert"} == set(costs.QUEUE_POLICIES)
    assert '"queue": queue_policy(cfg)' in (layout.KERNEL_DIR.parent / "worker.py").read_text()


def test_the_kernels_take_the_constants_python_owns_from_the_build():
    """Every MOELAB_ macro a kernel source reads is a -D flag of every build (layout.kernel_constants),
    and the kernel spells out none of the numbers the simulator models it by."""
    used = {m for p in build.source_files() for m in re.findall(r"\bMOELAB_[A-Z0-9_]+\b", p.read_text())}
    assert used <= set(layout.kernel_constants()), sorted(used - set(layout.kernel_constants()))
    flags = build.defines({"TILE_M": 64})
    assert f"-DMOELAB_GATE_TOKENS={costs.GATE_TOKENS}" in flags and "-DTILE_M=64" in flags
    assert f"-DMOELAB_EV_SIGNAL={KINDS.index('signal')}" in flags
    assert f"-DMOELAB_GATE_SIGMOID_BIAS={GATES.index('sigmoid_bias')}" in flags
    gate, processor = ((layout.KERNEL_DIR / f).read_text() for f in ("gate.cuh", "processor.cuh"))
    for name in ("GATE_TOKENS", "GATE_EXPERTS", "GATE_DEPTH", "GATE_MAX_SPLITS", "GATE_SMEM_LOGITS", "SELECT_LANES"):
        assert f"constexpr int {name} = MOELAB_{name};" in gate
    assert "constexpr int DISPATCH_MAX_PARTS = MOELAB_DISPATCH_MAX_PARTS;" in processor
    assert processor.count("constexpr int BATCH = MOELAB_REDUCE_BATCH;") == 2  # both builds' final combine



def test_simulated_dispatch_shares_are_the_kernels():
    """sim.costs splits a stored chunk over processors as processor.cuh does: the same most shares,
    and the kernel's chunk slots E x CH (layout.Sizes) in its split."""
    for cfg in (presets.get("flashmoe"), presets.get("tiny"), presets.get("tiny-nodrop"),
                presets.get("tiny").replace(merge_sources=False),
                presets.get("flashmoe").replace(tokens=1024, experts=128)):
        s = layout.Sizes.of(cfg)
        assert costs.dispatch_slots(cfg) == s.E * s.CH
        assert costs.dispatch_parts(cfg, 263, "store") == max(1, min(263 // (s.E * s.CH), costs.DISPATCH_MAX_PARTS))
        assert costs.dispatch_parts(cfg, 263, "put") == 1
    # the staged dispatch's senders: the simulator's count is the one the host hands the kernel
    runtime = (layout.KERNEL_DIR.parent / "runtime.py").read_text()
    assert "staged_blocks: int = layout.STAGED_BLOCKS" in runtime
    assert "staged_blocks=staged_blocks if dispatch == \"staged\" else 0" in runtime


def test_bench_cases_name_their_dispatch():
    """The kernel's staged dispatch keeps the plain names and traces; the flat one is traced under
    -store, the put path and other sender counts untraced."""
    from gpu import cases

    names = {d: cases.bench_cases(2, "default", "x-", dispatch=d)[0] for d in ("staged", "store", "put")}
    assert [names[d]["name"] for d in names] == [f"bench-flashmoe{tag}-p2" for tag in ("", "-store", "-put")]
    assert [names[d]["dispatch"] for d in names] == ["staged", "store", "put"]
    assert names["store"]["trace"] == "x-trace-flashmoe-store-p2.npz" and names["put"]["trace"] is None
    senders = cases.bench_cases(2, "default", "x-", staged_blocks=16)[0]
    assert senders["name"] == "bench-flashmoe-senders16-p2" and senders["trace"] is None
    assert senders["staged_blocks"] == 16 and "staged_blocks" not in names["staged"]


@pytest.mark.parametrize("tokens,hidden,grid", [(1024, 2048, 264), (4096, 2048, 264), (8192, 2048, 264),
                                                (200, 128, 264), (333, 256, 385), (96, 64, 9), (16384, 4096, 264)])
def test_gate_split_is_whole_slices_within_capacity(tokens, hidden, grid):
    """The simulator's split of a gate item's H (costs.gate_splits, as gate.cuh computes it) never
    leaves a split empty, uses whole slices, and fits the partial-logit copies the host allocates."""
    s = costs.gate_splits(tokens, hidden, grid)
    slices = -(-hidden // costs.GATE_DEPTH)
    per = -(-slices // s)
    assert 1 <= s <= layout.gate_split_capacity(tokens, grid)
    assert (s - 1) * per < slices <= s * per  # every split has at least one slice
    assert s == 1 or s * -(-tokens // costs.GATE_TOKENS) <= grid


def test_cache_key_covers_sources_options_and_toolchain():
    src = [("moe.cu", b"a"), ("gate.cuh", b"b")]
    k = build.cache_key({"TILE_M": 128}, "sm_90", "nvcc 13.0", "3.4.5", src)
    assert k == build.cache_key({"TILE_M": 128}, "sm_90", "nvcc 13.0", "3.4.5", list(reversed(src)))
    others = [build.cache_key({"TILE_M": 64}, "sm_90", "nvcc 13.0", "3.4.5", src),
              build.cache_key({"TILE_M": 128}, "sm_100", "nvcc 13.0", "3.4.5", src),
              build.cache_key({"TILE_M": 128}, "sm_90", "nvcc 13.1", "3.4.5", src),
              build.cache_key({"TILE_M": 128}, "sm_90", "nvcc 13.0", "3.8.0", src),
              build.cache_key({"TILE_M": 128}, "sm_90", "nvcc 13.0", "3.4.5", [("moe.cu", b"a2"), ("gate.cuh", b"b")])]
    assert k not in others and len(set(others)) == len(others)
    assert layout.compile_options(presets.get("tiny")) == {"TILE_M": 32, "TILE_N": 32, "TILE_K": 8}


def test_error_record_decoding():
    assert errors.decode(np.zeros(11, np.int64)) is None
    words = np.array([1, 1, 263, 32, 3, 0, 5, 1, 0, 7, 5_000_000_000], np.int64)
    rec = errors.decode(words)
    assert rec["what"] == "tile" and rec["rank"] == 1 and rec["block"] == 263
    waited = r"rank 1 block 263 .* tile window 1 of local expert 5 to land \(0 of its 7 chunks"
    with pytest.raises(errors.KernelTimeout, match=waited):
        errors.raise_if_error(words)
    bad = words.copy()
    bad[4] = 7
    with pytest.raises(errors.KernelError, match="over the capacity") as e:
        errors.raise_if_error(bad)
    assert not isinstance(e.value, errors.KernelTimeout)
    with pytest.raises(ValueError):
        errors.decode(np.zeros(3, np.int64))


def test_kernel_errors_cross_processes_whole():
    # ranks gather each other's errors pickled (worker._gather): the copy keeps class, record, message
    words = np.array([1, 0, 7, 0, 10, 384, 2048, 5, 0, 0, 5_000_000_000], np.int64)
    with pytest.raises(errors.KernelTimeout) as e:
        errors.raise_if_error(words)
    copy = pickle.loads(pickle.dumps(e.value))
    assert type(copy) is errors.KernelTimeout and copy.record == e.value.record and str(copy) == str(e.value)
    assert "slice 5 (TMA: A rows from 384, weight rows from 2048)" in str(copy)


def _event(t0, t1, kind, expert, peer, rows, tile, col=0):
    w2 = kind | (expert & 0xFFFF) << 8 | (peer & 0xFFFF) << 24 | rows << 40
    return [t0, t1, w2, (tile & 0xFFFFFFFF) | col << 32]


def test_telemetry_decoding():
    n_proc, cap = 2, 4
    tlog = np.zeros((n_proc + 4, cap, 4), np.uint64)
    counts = np.zeros(n_proc + 4, np.int64)
    tlog[0, 0] = _event(1000, 1500, KIND["gemm0"], 5, 1, 128, 3, 64)
    tlog[0, 1] = _event(1500, 1600, KIND["combine"], -1, 0, 0, -1)
    counts[0] = 2
    tlog[1, 0] = _event(1100, 1200, KIND["dispatch"], 3, 1, 100, 0)
    counts[1] = 6  # 2 more than the log holds: dropped, counted
    tlog[n_proc + 1, 0] = _event(1300, 1300, KIND["signal"], 4, 1, 64, 0, 1)
    counts[n_proc + 1] = 1
    send_counts = np.array([[10, 0, 0, 300, 64, 0, 0, 0], [0, 0, 0, 0, 0, 256, 0, 0]])
    # no dropping, C = 300: source 1's rows of expert 5 are positions 300..555, windows 2..4
    cfg = Config(tokens=300, hidden=64, ffn=128, experts=8, ranks=2, capacity_factor=None, tile_m=128)
    ids = telemetry.tile_ids(cfg, send_counts)
    tb, dropped = telemetry.decode(tlog, counts, rank=0, node=0, n_proc=n_proc, hidden=64, origin_ns=1000, ids=ids)
    tr = tb.build()
    assert dropped == 2 and len(tr) == 2 + 4 + 1  # log 1 holds its cap of 4 (3 of them blank here)
    gemm = tr.where(kind="gemm0")
    assert gemm["start"][0] == 0 and gemm["end"][0] == 500 and gemm["expert"][0] == 5
    (expert, _, window, _), _ = plan.windows(cfg, send_counts)
    assert (expert[gemm["tile"][0]], window[gemm["tile"][0]]) == (5, 3)  # expert 5's second tile
    assert ids[5, 1] == -1 and ids[5, 2] >= 0  # windows without rows have no tile
    assert tr.where(kind="combine")["expert"][0] == -1
    disp = tr.where(kind="dispatch")
    assert disp["tile"][0] == ids[3, 0] and disp["bytes"][0] == 100 * 64 * 4
    sig = tr.where(role="subscriber")
    assert sig["lane"][0] == 0 and sig["tile"][0] == ids[4, 0]  # a return to this rank
    assert 0 < telemetry.processor_utilization(tr, n_proc) <= 1


def test_kernel_weights_append_the_shared_experts_and_interleave_gate_and_up():
    """The Layer's copy of the weights for the kernel: local experts then shared ones, W1's and b1's
    gate column j at 2j and its up column at 2j + 1; a layer with neither keeps the inputs' tensors."""
    torch = pytest.importorskip("torch")
    from gpu import runtime

    cfg = Config(tokens=8, hidden=64, ffn=64, experts=4, top_k=1, activation="swiglu", shared_experts=2, ranks=2)
    L, S, H, i = cfg.local_experts, cfg.shared_experts, cfg.hidden, cfg.ffn
    mine = (torch.randn(L, H, 2 * i), torch.randn(L, 2 * i), torch.randn(L, i, H), torch.randn(L, H))
    shared = (torch.randn(S, H, 2 * i), torch.randn(S, 2 * i), torch.randn(S, i, H), torch.randn(S, H))
    inputs = runtime.Inputs(x=None, wg=None, logit_offset=None, gate_bias=None, wg_bias=None, w1=mine[0], b1=mine[1],
                            w2=mine[2], b2=mine[3], shared=shared)
    k = runtime.kernel_weights(cfg, inputs)
    j = int(torch.randint(i, (1,)))
    for name, n in (("w1", 0), ("b1", 1)):
        both = torch.cat([mine[n], shared[n]])
        assert k[name].shape == both.shape and k[name].is_contiguous()
        assert torch.equal(k[name][..., 2 * j], both[..., j]) and torch.equal(k[name][..., 2 * j + 1], both[..., i + j])
    assert torch.equal(k["w2"], torch.cat([mine[2], shared[2]])) and torch.equal(k["b2"][L:], shared[3])
    plain = runtime.kernel_weights(cfg.replace(activation="silu", shared_experts=0, ffn=128),
                                   runtime.Inputs(None, None, None, None, None, *mine))
    assert all(plain[name] is t for name, t in zip(("w1", "b1", "w2", "b2"), mine))  # no copy
    assert np.array_equal(runtime.interleave_gated(np.arange(6)), [0, 3, 1, 4, 2, 5])
