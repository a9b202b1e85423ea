"""The zoo's full-size checks without a GPU: their cases, and gpu.worker.run_zoo_check on a fake world
(threads as ranks, torch CPU tensors as the GPUs'): where the 'kernel' computes the golden the check
holds, with each rank streaming only its experts the sample chose; where the kernel misses an expert's
weights, routes a token elsewhere or lacks the memory, the check says so."""

import dataclasses
import threading
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpu import cases, layout, spawn, worker  # noqa: E402
from gpu.runtime import Inputs, logit_offset  # noqa: E402
from reference import Config, golden, presets, routing, weights  # noqa: E402
from reference.numerics import round_bf16  # noqa: E402


def test_every_zoo_model_is_checked_at_full_size_on_1_2_and_4_gpus():
    for p in (1, 2, 4):
        todo = cases.zoo_check_cases(p, 7)
        assert len(todo) == len(presets.ZOO) * len(cases.ZOO_CHECK_DTYPES)
        for case in todo:
            assert "skip" not in case, case  # every model's experts divide over 1, 2 and 4 GPUs
            cfg = Config.from_dict(case["config"])
            model = case["name"].removeprefix("zoo-").rsplit("-", 2)[0]
            layer = presets.ZOO[model]
            run = dict(name=cfg.name, tokens=cases.ZOO_CHECK_TOKENS, ranks=p, precision=cfg.precision,
                       tile_m=cfg.tile_m, tile_n=cfg.tile_n, tile_k=cfg.tile_k)
            assert cfg == layer.replace(**run)  # the true layer: H, I, E, k, router, activation, shared, bias
            assert cfg.precision in cases.ZOO_CHECK_DTYPES and cfg == cases.in_dtype(cfg, cfg.precision)  # bench tile
            layout.check_supported(cfg)
            assert case["zoo_samples"] == cases.ZOO_CHECK_SAMPLES and case["seed"] == 7
    names = [c["name"] for c in cases.zoo_trace_cases(4, "h100x4-")]
    assert names == [f"zootrace-{m}-4k-p4" for m in presets.ZOO]
    assert [c["trace"] for c in cases.zoo_trace_cases(4, "h100x4-")] == [
        f"h100x4-trace-zoo-{m}-4k-p4.npz" for m in presets.ZOO]


def test_a_case_the_kernel_cannot_place_carries_its_reason():
    # no zoo model has fewer than 8 experts: 3 GPUs stand for a count that does not divide them
    todo = cases.zoo_check_cases(3, 1)
    assert all("do not divide over 3 GPUs" in c["skip"] for c in todo if presets.ZOO[
        c["name"].removeprefix("zoo-").rsplit("-", 2)[0]].experts % 3)


def test_deepseek_v3_on_one_gpu_is_sized_before_anything_is_drawn():
    """bf16 on one GPU: its 257 experts' weights drawn in float32 (45 GB) beside their bf16 copy, or
    the layer's inputs, buffers and weight copies (gpu.layout: 68 GB); tf32x3 (float32 weights, 91 GB)
    does not fit an H100, bf16 hardly (85% of its free memory). NVSHMEM's heap (4 GB, 8 GB) is taken
    apart, by gpu.spawn, for the job's largest layer."""
    v3 = {c["name"]: Config.from_dict(c["config"]) for c in cases.zoo_check_cases(1, 0)}
    bf16, split = (worker.zoo_check_bytes(v3[f"zoo-deepseek-v3-{t}-p1"]) for t in ("bf16", "tf32x3"))
    weights = 257 * 7168 * 3 * 2048
    assert 60e9 < bf16 < 141e9 * 0.85 and split > 80e9
    assert bf16 >= 2 * 2 * weights and split >= 2 * 4 * weights  # the inputs and one copy, at least
    assert spawn.symmetric_heap_bytes(cases.zoo_check_cases(1, 0)) < 10e9


class World:
    """p ranks as threads: an all-gather over a barrier stands for gpu.worker._gather."""

    def __init__(self, p: int):
        self.barrier, self.slots = threading.Barrier(p), [None] * p

    def gather(self, session, obj):
        self.slots[session.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


def cpu_inputs(cfg: Config, rank: int, asked: list) -> Inputs:
    """The reference's seeded inputs of `rank` as torch CPU tensors, in the kernel's dtype; every
    expert's weights a tensor that notes in `asked` which expert was read."""
    wg, gate_bias = weights.gate(cfg)
    local = range(rank * cfg.local_experts, (rank + 1) * cfg.local_experts)

    def stacked(experts):
        parts = [weights.expert(cfg, e) for e in experts]
        return tuple(torch.from_numpy(np.stack([ex[i] for ex in parts])) for i in range(4))

    shared = stacked(range(cfg.experts, cfg.experts + cfg.shared_experts)) if cfg.shared_experts else None
    inputs = Inputs(x=torch.from_numpy(weights.tokens(cfg, rank)), wg=torch.from_numpy(wg),
                    logit_offset=torch.from_numpy(logit_offset(cfg)), gate_bias=torch.from_numpy(gate_bias).double(),
                    wg_bias=torch.from_numpy(weights.router_bias(cfg)).double(), **dict(
                        zip(("w1", "b1", "w2", "b2"), stacked(local))), shared=shared).as_dtype(cfg.dtype)
    return dataclasses.replace(inputs, w1=Noting(inputs.w1, rank * cfg.local_experts, asked))


class Noting:
    """A stack of experts' W1 whose every read of one expert is noted (its global index)."""

    def __init__(self, t, first: int, asked: list):
        self.t, self.first, self.asked = t, first, asked

    def __getitem__(self, i):
        self.asked.append(self.first + i)
        return self.t[i]


def run_world(cfg: Config, monkeypatch, samples: int, kernel=lambda y, r: (y, r), free: int = 1 << 40,
              threads: int = 1):
    """run_zoo_check on cfg.ranks threads, each rank's golden in `threads` threads of its own; the
    'kernel' gives the golden of its precision from the weights as the kernel holds them (kernel(y,
    routing) may change them first). Rank 0's result and the experts each rank read."""
    p = cfg.ranks
    kept_w = weights.draw(cfg)
    if cfg.dtype == "bfloat16":  # the weights as the bf16 kernel holds them
        kept_w = dataclasses.replace(kept_w, **{k: round_bf16(getattr(kept_w, k)) for k in ("x", "w1", "w2")})
    r = routing.route(cfg, kept_w.x, kept_w.wg, kept_w.gate_bias, kept_w.wg_bias)
    y, r = kernel(golden.dense(cfg, kept_w, r, worker.golden_path(cfg)), r)
    asked = [[] for _ in range(p)]

    class Layer:
        def __init__(self, session, cfg, inputs, timeout_ms):
            self.rank = session.rank

        def poison(self):
            pass

        def close(self):
            pass

        def output(self):
            return y[self.rank]

        def routing(self):
            return {"expert": r.expert[self.rank], "slot": r.slot[self.rank], "weight": r.weight[self.rank],
                    "counts": r.counts(cfg.experts)[self.rank]}

    world = World(p)
    monkeypatch.setattr(worker, "_gather", world.gather)
    monkeypatch.setattr(worker, "run_everywhere", lambda session, layer: None)
    monkeypatch.setattr(worker, "golden_threads", lambda world: threads)
    monkeypatch.setattr(worker, "Layer", Layer)
    monkeypatch.setattr(worker.Inputs, "random", classmethod(lambda c, cfg, rank, seed: cpu_inputs(cfg, rank,
                                                                                                    asked[rank])))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free, free))
    case = {"name": "zoo-test", "config": cfg.to_dict(), "seed": 5, "zoo_samples": samples}
    results, errors = [None] * p, []

    def rank(i):
        try:
            results[i] = worker.run_zoo_check(SimpleNamespace(rank=i, world=p, name="fake GPU"), case)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            world.barrier.abort()

    ranks = [threading.Thread(target=rank, args=(i,)) for i in range(p)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join(60)
    assert not errors, errors
    return results[0], asked, r


# a DeepSeek-like layer (sigmoid with selection bias, groups, routed scaling, gated, two shared
# experts) and a Llama-4-like one (top-1 scaled before its expert, a shared one), gpt-oss' biases
SMALL = {
    "deepseek": dict(tokens=48, hidden=128, ffn=64, experts=16, top_k=4, gate="sigmoid_bias", n_group=4, topk_group=2,
                     routed_scaling=2.5, shared_experts=2, activation="swiglu", bias=False, capacity_factor=None),
    "llama4": dict(tokens=40, hidden=128, ffn=128, experts=8, top_k=1, gate="sigmoid_topk", scale_before_expert=True,
                   shared_experts=1, activation="swiglu", bias=False, capacity_factor=None),
    "gpt_oss": dict(tokens=40, hidden=128, ffn=64, experts=8, top_k=2, gate="topk_softmax", router_bias=True,
                    activation="swiglu_oai", swiglu_limit=7.0, bias=True, capacity_factor=None),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "tf32x3"])
@pytest.mark.parametrize("layer", SMALL)
def test_a_kernel_that_computes_the_golden_passes(layer, dtype, monkeypatch):
    p = 2
    cfg = cases.in_dtype(presets.get("tiny").replace(ranks=p, seed=int.from_bytes(np.random.bytes(4), "little"),
                                                     **SMALL[layer]), dtype)
    res, asked, r = run_world(cfg, monkeypatch, samples=8, threads=3)
    assert res["routing_equal"] and res["counts_equal"] and res["weight_max_abs_err"] == 0, res
    assert res["golden_path"] == worker.golden_path(cfg) and res["samples"] == 2 * 8 and not res["nan"]
    assert res["rel_err"] < 1e-12 if dtype == "tf32x3" else res["rel_err"] < 2e-2
    if dtype == "bfloat16":
        assert 1e-5 < res["rel_err_float64"] < 2e-2  # the bf16 path against the float64 truth
    assert res["golden_threads"] == 3
    # each rank read only its own experts, each once, and only those a sampled token chose
    for rank in range(p):
        own = set(range(rank * cfg.local_experts, (rank + 1) * cfg.local_experts))
        assert set(asked[rank]) <= own and len(asked[rank]) == len(set(asked[rank]))
    assert res["experts_streamed"] == sum(map(len, asked))


def test_every_token_sampled_reads_every_chosen_expert_and_matches_dense_exactly(monkeypatch):
    cfg = cases.in_dtype(presets.get("tiny").replace(ranks=2, **SMALL["deepseek"]), "tf32x3")
    res, asked, r = run_world(cfg, monkeypatch, samples=cfg.tokens)
    assert sorted(a for ranks in asked for a in ranks) == sorted(set(r.expert.ravel().tolist()))
    assert res["rel_err"] < 1e-13 and res["routing_equal"]


def test_a_kernel_that_misses_an_expert_or_a_route_fails(monkeypatch):
    cfg = cases.in_dtype(presets.get("tiny").replace(ranks=2, **SMALL["deepseek"]), "bfloat16")
    w = weights.draw(cfg)
    hit = int(np.bincount(routing.route(cfg, w.x, w.wg, w.gate_bias).expert.ravel()).argmax())

    def wrong_expert(y, r):  # the outputs of the tokens that chose `hit` shifted, as a stale weight would
        y = y.copy()
        y[(r.expert == hit).any(-1)] += 0.5
        return y, r

    res, _, _ = run_world(cfg, monkeypatch, samples=cfg.tokens, kernel=wrong_expert)
    assert res["routing_equal"] and res["rel_err"] > 0.05

    def wrong_route(y, r):
        expert = r.expert.copy()
        expert[0, 0, 0] = (expert[0, 0, 0] + 1) % cfg.experts
        return y, dataclasses.replace(r, expert=expert)

    res, _, _ = run_world(cfg, monkeypatch, samples=4, kernel=wrong_route)
    assert not res["routing_equal"]


def test_a_layer_past_the_free_memory_is_skipped_before_it_is_drawn(monkeypatch):
    cfg = cases.in_dtype(presets.get("tiny").replace(ranks=2, **SMALL["llama4"]), "bfloat16")
    res, asked, _ = run_world(cfg, monkeypatch, samples=4, free=worker.zoo_check_bytes(cfg))
    assert "needs" in res["skipped"] and "GiB free" in res["skipped"] and asked == [[], []]


def test_a_zoo_trace_is_a_calibrated_measured_run_that_compare_predicts(tmp_path):
    """A zootrace case's trace, its events simulated and its meta as the validation part's traces carry
    it (the same worker and bench writes both), is read by `moelab compare` as a measured run on its GPU:
    its config the zoo layer, its tile one the GPU's calibration covers, not a validation layer."""
    from sim import compare, heldout, simulate
    from sim.trace import Trace

    case = next(c for c in cases.zoo_trace_cases(4, "h200x4-") if c["name"] == "zootrace-qwen3-30b-a3b-4k-p4")
    cfg = Config.from_dict(case["config"])
    assert cfg == presets.ZOO["qwen3-30b-a3b"].replace(name="qwen3-30b-a3b-4k")  # the preset, bf16 at its tile
    like = Trace.load(sorted(compare.MEASUREMENTS.glob("gpu/h200x4-trace-val-*-p4.npz"))[0])  # the writers' meta
    events = simulate(cfg).trace
    meta = {**like.meta, "config": cfg.to_dict(), "name": case["name"], "processors": events.meta["processors"]}
    Trace(events.columns, meta).save(tmp_path / case["trace"])
    (run,) = compare.measured_runs(tmp_path)
    assert run.name == "h200x4-trace-zoo-qwen3-30b-a3b-4k-p4" and run.config == cfg and run.gpu_tag == "h200"
    assert compare.uncovered(run) is None and not heldout.is_validation(run)
    c = compare.compare(run)
    assert {r[0].split(" ")[0] for r in c.rows} >= {"layer", "gemm0", "gemm1", "dispatch", "combine"}
