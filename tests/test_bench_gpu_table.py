"""The GPU benchmark's table (benchmarks/bench_gpu.py): figures derived from worker results."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu import provenance
from reference import Config, presets

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_dispatch  # noqa: E402
import bench_gpu  # noqa: E402


def point(name, ranks, kernel_ms):
    cfg = {"name": name, "ranks": ranks, "tokens": 1024, "experts": 64, "hidden": 2048, "ffn": 2048, "top_k": 2,
           "precision": "bfloat16"}
    return {"name": f"bench-{name}-p{ranks}", "config": cfg, "kernel_ms": kernel_ms,
            "kernel_telemetry_ms": kernel_ms * 1.01, "kept_rows": 2048 * ranks, "torch_bfloat16_ms": 2 * kernel_ms,
            "gemm_ms_per_proc": 0.5, "sm_utilization": 0.8}


def test_overlap_efficiency_is_the_two_gpu_latency_over_this_one():
    rows = bench_gpu.table_rows([point("a", 1, 2.0), point("a", 2, 2.5), point("lonely", 1, 1.0)],
                                {"float32": 51.0, "bfloat16": 783.0})
    col = {name: i for i, name in enumerate(bench_gpu.TABLE_HEAD)}
    by_name = {r[0]: r for r in rows}
    assert by_name["bench-a-p1"][col["overlap eff T(2)/T(N)"]] == pytest.approx(1.25)
    assert by_name["bench-a-p2"][col["overlap eff T(2)/T(N)"]] == pytest.approx(1.0)
    assert by_name["bench-lonely-p1"][col["overlap eff T(2)/T(N)"]] == ""
    assert by_name["bench-a-p1"][col["speedup"]] == pytest.approx(2.0)
    assert by_name["bench-a-p1"][col["telemetry +%"]] == pytest.approx(1.0)
    assert "overlap eff T(2)/T(N)" in bench_gpu.table([point("a", 2, 2.5)], {"bfloat16": 783.0})


def test_kernel_is_set_against_the_torch_experts_alone_where_the_run_timed_them():
    col = {name: i for i, name in enumerate(bench_gpu.TABLE_HEAD)}
    timed = {**point("a", 1, 2.0), "torch_experts_bfloat16_ms": 1.6}
    row = bench_gpu.table_rows([timed], {"bfloat16": 783.0})[0]
    assert row[col["torch experts alone ms"]] == pytest.approx(1.6)
    assert row[col["kernel / torch experts"]] == pytest.approx(1.25)
    assert bench_gpu.speedup(timed) == pytest.approx(2.0)  # not a torch layer a user would run
    untimed = bench_gpu.table_rows([point("a", 1, 2.0)], {"bfloat16": 783.0})[0]
    assert untimed[col["torch experts alone ms"]] == untimed[col["kernel / torch experts"]] == ""
    alone = {**timed, "kernel_skipped": "not in the kernel"}
    del alone["kernel_ms"]
    row = bench_gpu.table_rows([alone], {"bfloat16": 783.0})[0]
    assert len(row) == len(bench_gpu.TABLE_HEAD) and row[col["torch experts alone ms"]] == pytest.approx(1.6)


def test_tile_flag_reads_m_n_k_or_says_what_it_wants():
    assert bench_gpu.tile_shape("128x256x64") == (128, 256, 64)
    for bad in ("128x256", "128x0x64", "axbxc", "128x256x64x1"):
        with pytest.raises(Exception, match="three positive integers MxNxK"):
            bench_gpu.tile_shape(bad)


def test_weights_bound_is_rows_per_expert_times_memory_rate_over_the_ceiling():
    # 2048 kept rows over 64 experts: 32 rows an expert, 2 FLOPs per row per bf16 weight of 2 bytes,
    # so 32 FLOPs a weight byte; at 4000 GB/s that is 128 TFLOP/s, 16% of 800
    p1 = point("a", 1, 1.0)
    assert bench_gpu.weights_bound(p1, 800.0, 4000.0) == pytest.approx(16.0)
    # 1024 tokens on each of two GPUs: 64 rows an expert (each GPU holds half the experts, all
    # their rows)
    assert bench_gpu.weights_bound(point("a", 2, 1.0), 800.0, 4000.0) == pytest.approx(32.0)
    # float32 weights are twice the bytes
    f32 = {**p1, "config": {**p1["config"], "precision": "float32"}}
    assert bench_gpu.weights_bound(f32, 800.0, 4000.0) == pytest.approx(8.0)
    col = bench_gpu.TABLE_HEAD.index("weights' bound % ceil")
    rows = bench_gpu.table_rows([p1], {"bfloat16": 800.0}, gbps=4000.0)
    assert rows[0][col] == pytest.approx(16.0)
    assert bench_gpu.table_rows([p1], {"bfloat16": 800.0})[0][col] == ""


def test_roofline_share_is_the_gemm_phase_over_the_lesser_of_bound_and_ceiling():
    assert bench_gpu.roofline_share(12.0, 16.0) == pytest.approx(75.0)  # the weights bind: 12 of 16
    assert bench_gpu.roofline_share(50.0, 131.0) == pytest.approx(50.0)  # the ceiling binds
    p1 = point("a", 1, 1.0)
    gemm, share = (bench_gpu.TABLE_HEAD.index(k) for k in ("GEMM phase % ceil", "GEMM phase % roofline"))
    row = bench_gpu.table_rows([p1], {"bfloat16": 800.0}, gbps=4000.0)[0]
    assert row[share] == pytest.approx(100 * row[gemm] / 16.0)  # its bound is 16% (above)
    assert bench_gpu.table_rows([p1], {"bfloat16": 800.0})[0][share] == ""


def test_torch_columns_speedup_over_the_dropless_layer_and_skipped_points():
    p = {**point("a", 1, 1.0), "torch_dropless_bfloat16_ms": 1.5, "torch_loop_bfloat16_ms": 1.8,
         "torch_bfloat16_skipped": "58.0 GB of buffers do not fit"}
    p.pop("torch_bfloat16_ms")
    skipped = {"name": "bench-b-p4", "config": {**p["config"], "name": "b", "ranks": 4}, "skipped": "out of memory"}
    rows = bench_gpu.table_rows([p, skipped], {"bfloat16": 800.0})
    col = {name: i for i, name in enumerate(bench_gpu.TABLE_HEAD)}
    assert rows[0][col["speedup"]] == pytest.approx(1.5)
    assert rows[0][col["loop torch ms"]] == pytest.approx(1.8)
    assert rows[0][col["padded torch ms"]] == "58.0 GB of buffers do not fit"
    assert rows[1][col["kernel ms"]] == "skipped: out of memory"
    assert len(rows[1]) == len(bench_gpu.TABLE_HEAD)


def test_roofline_columns_from_the_send_counts():
    # 32 rows to each of 64 experts of H = I = 2048 on one GPU: 2 x 2048 rows x 2 x 2048^2 FLOPs
    # = 34.4 GFLOP, 0.043 ms at 800 TFLOP/s; 64 experts' bf16 weights, 1.07 GB, 0.268 ms at 4000 GB/s
    p = {**point("a", 1, 1.0), "send_counts": [[32] * 64]}
    col = {name: i for i, name in enumerate(bench_gpu.TABLE_HEAD)}
    row = bench_gpu.table_rows([p], {"bfloat16": 800.0}, gbps=4000.0)[0]
    weights_ms = 64 * 2 * 2048 * 2048 * 2 / 4000e6
    assert (row[col["roofline ms"]], row[col["bound"]]) == (pytest.approx(weights_ms), "weights")
    assert row[col["kernel / roofline"]] == pytest.approx(1.0 / weights_ms)
    assert bench_gpu.table_rows([p], {"bfloat16": 800.0})[0][col["roofline ms"]] == ""  # no memory rate


def test_matrix_plan_runs_what_fits_and_says_why_it_skips_the_rest():
    cases, skipped, seconds = bench_gpu.matrix_plan([1, 4], ["bfloat16", "tf32x3"], ["qwen3-30b-a3b", "deepseek-v3",
                                                                                     "gpt-oss-120b"],
                                                    [1024, 4096, 16384], flashmoe=False, gpu_gb=80.0)
    names = {c["name"] for p in cases for c in cases[p]}
    why = {r["name"]: r["skipped"] for r in skipped}
    # the kernel runs the real layers (gated, shared experts, gpt-oss' ragged 2880 columns at the bench tiles)
    assert {"matrix-qwen3-30b-a3b-4k-bf16-p4", "matrix-gpt-oss-120b-16k-bf16-p1", "matrix-deepseek-v3-1k-bf16-p4",
            "matrix-gpt-oss-120b-4k-tf32x3-p1"} <= names
    assert not any("twin" in n for n in names | set(why))
    # DeepSeek-V3 at 4K a GPU fits 4 GPUs (staging and combox of T k rows), not one; at 16K, none
    assert "matrix-deepseek-v3-4k-bf16-p4" in names and "matrix-qwen3-30b-a3b-16k-tf32x3-p1" in names
    assert "more than 85% of 80 GB" in why["matrix-deepseek-v3-4k-bf16-p1"]  # inbox, outbuf: 2 x 256 x 4K x 7168 bf16
    assert "more than 85% of 80 GB" in why["matrix-deepseek-v3-16k-bf16-p4"]
    assert not names & set(why) and len(names) + len(why) == 2 * 2 * 3 * 3  # no twins, no torch-only points
    assert seconds > bench_gpu.CEILINGS_SECONDS + 2 * bench_gpu.SPAWN_SECONDS + 5 * bench_gpu.SPAWN_SECONDS_PER_GPU \
        + len(names) * bench_gpu.POINT_SECONDS
    # the skipped points keep their reason in the table
    rows = bench_gpu.table_rows(skipped, {"bfloat16": 800.0, "float32": 50.0, "tf32x3": 50.0})
    assert len(rows) == len(skipped) and all(str(r[bench_gpu.TABLE_HEAD.index("kernel ms")]).startswith("skipped")
                                             for r in rows)


def test_compact_results_drop_per_iteration_times_and_profiles():
    r = {**point("a", 1, 1.0), "kernel_ms_all": [1.0] * 10, "torch_bfloat16_profile": "table", "traceback": "x"}
    (c,) = bench_gpu.compact([{**r, "commit": "abc", "seed": 2}], {"commit": "abc", "seed": 1})
    assert "kernel_ms_all" not in c and "torch_bfloat16_profile" not in c and "traceback" not in c
    assert "commit" not in c and c["seed"] == 2  # the run's meta is kept once, a differing value stays
    assert c["kernel_ms"] == 1.0 and c["config"] == r["config"]


def test_speedup_is_over_the_fastest_torch_layer_and_tf32x3_roofline_over_a_third_of_tf32():
    p = {**point("a", 1, 1.0), "torch_dropless_bfloat16_ms": 1.5, "torch_loop_bfloat16_ms": 1.2}
    assert bench_gpu.speedup(p) == pytest.approx(1.2)
    assert bench_gpu.speedup({**p, "torch_bfloat16_ms": 1.1}) == pytest.approx(1.1)  # padded wins at small T
    assert bench_gpu.roofline_tflops("tf32x3", {"float32": 51.0, "tf32": 388.0}) == pytest.approx(388.0 / 3)
    assert bench_gpu.roofline_tflops("tf32x3", {"float32": 51.0, "tf32": 120.0}) == 51.0
    assert bench_gpu.roofline_tflops("bfloat16", {"bfloat16": 737.0}) == 737.0


def test_flops_count_a_gated_gemm0_s_both_halves_and_the_shared_experts_rows():
    """Qwen3-30B-A3B (gated, H 2048, I 768): 2 H (2 I + I) a row; DeepSeek-V2-Lite adds its two
    shared experts' T rows on every rank; a plain FlashMoE layer keeps 4 H I a row."""
    def res(name, ranks):
        cfg = presets.get(name).replace(ranks=ranks)
        return {"config": cfg.to_dict(), "kept_rows": 1000}, cfg

    r, cfg = res("qwen3-30b-a3b", 4)
    assert bench_gpu.flops(r) == 2.0 * 1000 * 2048 * (2 * 768 + 768)
    r, cfg = res("deepseek-v2-lite", 2)
    assert bench_gpu.flops(r) == 2.0 * (1000 + 2 * cfg.tokens * 2) * 2048 * (2 * 1408 + 1408)
    r, cfg = res("flashmoe", 1)
    assert bench_gpu.flops(r) == 4.0 * 1000 * cfg.hidden * cfg.ffn


def test_matrix_times_the_models_the_kernel_runs_as_twins_in_torch_as_they_are():
    cases, skipped, _ = bench_gpu.matrix_plan([4], ["bfloat16"], ["qwen3-30b-a3b"], [4096], flashmoe=False, gpu_gb=80.0)
    (real,) = cases[4]  # the kernel runs the gated layer itself: no twin, no torch-only point
    assert real["name"] == "matrix-qwen3-30b-a3b-4k-bf16-p4" and real["config"]["activation"] == "swiglu"
    assert "torch_only" not in real
    # a layer the kernel refuses (more groups than the gate takes) runs as its twin, and in torch as it is
    from gpu import cases as gpu_cases

    wide = presets.ZOO["deepseek-v3"].replace(n_group=64, topk_group=8, ranks=4)
    twin = gpu_cases.kernel_twin(wide)
    assert (twin.n_group, twin.topk_group, twin.name) == (1, 1, "deepseek-v3-twin")
    real = {"name": "matrix-qwen3-30b-a3b-4k-bf16-p4", "config": real["config"],
            "torch_only": f"not in the kernel: {gpu_cases.kernel_refuses(wide)}"}
    # its row: the reason in the kernel's column, the torch layers and the roofline beside it
    res = {"name": real["name"], "config": real["config"], "kernel_skipped": real["torch_only"],
           "torch_dropless_bfloat16_ms": 3.0, "torch_bfloat16_skipped": "no room",
           "send_counts": [[256] * 128] * 4, "kept_rows": 4 * 4096 * 8}
    col = {name: i for i, name in enumerate(bench_gpu.TABLE_HEAD)}
    (row,) = bench_gpu.table_rows([res], {"bfloat16": 800.0}, gbps=3000.0, nvlink=400.0)
    assert row[col["kernel ms"]].startswith("not in the kernel") and row[col["dropless torch ms"]] == 3.0
    assert row[col["padded torch ms"]] == "no room" and row[col["bound"]] == "nvlink"
    assert len(row) == len(bench_gpu.TABLE_HEAD)


@pytest.mark.parametrize("summary,precision", [("h200x4-bench-bf16.json", "bfloat16"),
                                               ("h200x2-bench-tf32.json", "tf32"),
                                               ("h200x4-bench-tf32x3.json", "tf32x3")])
def test_committed_summaries_from_before_precision_read_as_their_precision(summary, precision):
    # their configs carry dtype / tf32 / tf32x3 (some without tf32x3): Config.from_dict reads the precision
    path = Path(__file__).resolve().parents[1] / "measurements" / "gpu" / summary
    results = json.loads(path.read_text())["results"]
    assert all("precision" not in r["config"] for r in results)
    assert {Config.from_dict(r["config"]).precision for r in results} == {precision}
    assert {r[1] for r in bench_gpu.table_rows(results, {"float32": 50.0, "bfloat16": 800.0, "tf32": 400.0,
                                                        "tf32x3": 50.0})} == {precision}


def test_bench_dispatch_times_each_layer_on_each_path():
    rng = np.random.default_rng()
    senders = sorted({int(n) for n in rng.integers(1, 128, size=3)})
    layers, tokens = ["qwen3-30b-a3b", "gpt-oss-120b"], [4096, 16384]
    todo = bench_dispatch.dispatch_cases(layers, tokens, 4, "bfloat16", senders, ["staged", "store"], 20)
    ways = [("staged", n) for n in senders] + [("store", None)]
    assert [(c["dispatch"], c.get("staged_blocks")) for c in todo] == ways * len(layers) * len(tokens)
    assert len({c["name"] for c in todo}) == len(todo) and all(c["bench"] and c["baselines"] == [] for c in todo)
    assert [(c["config"]["top_k"], c["config"]["tokens"]) for c in todo[::len(ways)]] == [
        (8, 4096), (8, 16384), (4, 4096), (4, 16384)]
    # one GPU has one dispatch (the staged one is flat there): its store path, once a point
    one = bench_dispatch.dispatch_cases(layers, tokens, 1, "bfloat16", senders, ["staged"], 20)
    assert [c["dispatch"] for c in one] == ["store"] * 4
    assert [c["dispatch"] for c in bench_dispatch.dispatch_cases(layers, [4096], 2, "bfloat16", [16], ["store"], 20)] \
        == ["store"] * 2


def test_zoo_plan_lines_and_misses():
    """The zoo suites' plan: every check on each GPU count, the traced presets that fit a GPU (the others
    listed with the reason), a guess of the time; one line per check, and which of them miss."""
    cases, skipped, guess = bench_gpu.zoo_plan([1, 4], ["zoo", "zootrace"], "h100x4-", 3, 80.0, 32,
                                               list(presets.ZOO))
    checks = [c for c in cases[1] + cases[4] if "zoo_samples" in c]
    assert len(checks) == 2 * 2 * len(presets.ZOO) and all(c["seed"] == 3 for c in checks)
    traced = [c["name"] for c in cases[1] + cases[4] if c.get("trace")] + [r["name"] for r in skipped]
    assert sorted(traced) == sorted(f"zootrace-{m}-4k-p{p}" for m in presets.ZOO for p in (1, 4))
    too_big = {c["name"] for p in (1, 4) for c in bench_gpu.zoo_trace_cases(p)
               if bench_gpu.matrix_skip(bench_gpu.Config.from_dict(c["config"]), 80.0)}
    assert {r["name"] for r in skipped} == too_big and "zootrace-qwen3-30b-a3b-4k-p4" not in too_big
    assert all("GB a GPU" in r["skipped"] for r in skipped) and 0 < guess < 600
    cfg = checks[0]["config"]
    ok = {"name": "zoo-x-bf16-p1", "config": cfg, "routing_equal": True, "counts_equal": True, "nan": False,
          "rel_err": 4e-3, "rel_err_float64": 5e-3, "golden_path": "bfloat16", "seconds": 3.2, "samples": 32,
          "experts_streamed": 8, "golden_seconds": 1.5}
    assert "vs float64 5.00e-03, vs bfloat16 golden 4.00e-03, routing equal" in bench_gpu.zoo_line(ok)
    assert not bench_gpu.zoo_failed(ok) and not bench_gpu.zoo_failed({"name": "s", "skipped": "needs 90 GiB"})
    for bad in ({"rel_err": 0.05}, {"rel_err_float64": 0.03}, {"routing_equal": False}, {"nan": True}):
        assert bench_gpu.zoo_failed({**ok, **bad}), bad
    assert bench_gpu.zoo_failed({"name": "f", "failed": "KernelTimeout: ..."})
    assert "skipped: needs 90 GiB" in bench_gpu.zoo_line({"name": "s", "skipped": "needs 90 GiB"})


def test_the_plans_gpu_memory_is_the_machines_own_first_gpus(monkeypatch):
    class Done:
        returncode, stdout = 0, "143771\n143771\n"  # nvidia-smi's MiB of two H200s

    monkeypatch.setattr(provenance.subprocess, "run", lambda *a, **k: Done())
    assert bench_gpu.local_gpu_gb() == pytest.approx(143771 * 2**20 / 1e9)

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(provenance.subprocess, "run", missing)
    assert bench_gpu.local_gpu_gb() is None


def test_a_point_off_the_torch_layer_is_a_failure():
    """The timed suites check their output only against the torch layer: an error of a wrong sum
    (the validation layer val-12 measured 0.96) fails the run, bf16's rounding (~0.006) does not."""
    rng = np.random.default_rng()
    rounding = float(rng.uniform(1e-7, 0.019))
    assert not bench_gpu.disagrees_with_torch({"name": "x", "vs_baseline_rel_err": rounding})
    assert bench_gpu.disagrees_with_torch({"name": "x", "vs_baseline_rel_err": float(rng.uniform(0.021, 2.0))})
    assert not bench_gpu.disagrees_with_torch({"name": "x"})  # untimed against torch: nothing to check
