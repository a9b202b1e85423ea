"""What keeps the simulator fast and small at cluster scale changes no result: the trace builder's
packed columns (rows appended whole, packed by the engine; task rows keyed by their task), the
routing drawn rank by rank, its top-k by partition, its sampled logits' triangular product, the
metrics' per-GPU sums from one sort, and sweeps run in worker processes."""

import numpy as np

import reference
from reference import presets, routing, weights
from reference.routing import _top
from sim import metrics, sweeps
from sim.trace import COLUMNS, KINDS, ROLES, TraceBuilder


def test_packed_rows_are_the_rows_added(monkeypatch):
    rng = np.random.default_rng()
    monkeypatch.setattr(TraceBuilder, "CHUNK", 7)  # several packs and a partial one
    n = int(rng.integers(20, 40))
    rows = [(int(rng.integers(0, 8)), int(rng.integers(0, 2)), int(rng.integers(0, 100)), ROLES[rng.integers(6)],
             KINDS[rng.integers(10)], float(rng.random()), float(rng.random() + 1), int(rng.integers(-1, 9)),
             int(rng.integers(-1, 99)), int(rng.integers(-1, 8)), int(rng.integers(0, 1 << 40))) for _ in range(n)]
    rec = TraceBuilder()
    for r in rows:
        rec.add(*r)
    trace = rec.build()
    assert len(trace) == n
    for i, c in enumerate(COLUMNS):
        want = [{"role": ROLES.index, "kind": KINDS.index}.get(c, lambda v: v)(r[i]) for r in rows]
        assert np.array_equal(trace[c], np.asarray(want, COLUMNS[c])), c


def test_keyed_rows_are_the_rows_their_ids_name_after_the_others():
    """Task rows appended as (lane, start, end, task) to each GPU's keyed log: the trace holds each
    as the whole row its task's kind, tile and expert make, after the rows appended whole."""
    rng = np.random.default_rng()
    tasks, tiles = int(rng.integers(50, 80)), int(rng.integers(5, 12))
    kind_of = rng.integers(0, len(KINDS), tasks).astype(np.int8)
    tile_of = rng.integers(0, tiles, tasks)
    expert_of_tile = rng.integers(0, 64, tiles)
    rec = TraceBuilder()
    whole = (3, 1, 0, ROLES.index("nic"), KINDS.index("put"), 0.5, 2.5, 7, 1, 2, 4096)
    rec.append(whole)
    logs = [rec.keyed(rank, rank // 2, "processor", kind_of, tile_of, expert_of_tile) for rank in range(3)]
    want = {rank: [] for rank in range(3)}
    for _ in range(int(rng.integers(20, 40))):
        rank, lane, task = int(rng.integers(3)), int(rng.integers(0, 132)), int(rng.integers(tasks))
        start = float(rng.random() * 1e7)
        end = start + float(rng.random())
        logs[rank].add((lane, start, end, task))
        t = int(tile_of[task])
        want[rank].append((rank, rank // 2, lane, ROLES.index("processor"), int(kind_of[task]), start, end,
                           int(expert_of_tile[t]), t, -1, 0))
    rows = [whole] + [row for rank in range(3) for row in want[rank]]
    trace = rec.build()
    for i, c in enumerate(COLUMNS):
        assert np.array_equal(trace[c], np.asarray([r[i] for r in rows], COLUMNS[c])), c
    assert len(rec.build()) == 0  # the rows moved into the trace


def test_routing_rank_by_rank_is_the_routing_of_all_ranks_at_once():
    cfg = presets.get("tiny-deepseek").replace(seed=int(np.random.default_rng().integers(1 << 30)))
    wg, bias = weights.gate(cfg)
    at_once = routing.route(cfg, np.stack([weights.tokens(cfg, r) for r in range(cfg.ranks)]), wg, bias,
                            weights.router_bias(cfg))
    streamed = reference.route_config(cfg)
    for f in ("expert", "weight", "slot"):
        assert np.array_equal(getattr(streamed, f), getattr(at_once, f)), f


def test_top_k_by_partition_is_the_stable_sorts_first_k():
    rng = np.random.default_rng()
    for trial in range(200):
        t, e = int(rng.integers(1, 50)), int(rng.integers(2, 40))
        k = int(rng.integers(1, e + 1))
        if trial % 2:  # ties everywhere, excluded experts (-inf), signed zeros and NaN
            score = rng.integers(-3, 3, (t, e)).astype(np.float64) * rng.choice([1.0, -0.0], (t, e))
            score[rng.random((t, e)) < 0.2] = -np.inf
            score[rng.random((t, e)) < 0.03] = np.nan
        else:
            score = rng.standard_normal((t, e))
        assert np.array_equal(_top(score, k), np.argsort(-score, axis=-1, kind="stable")[:, :k]), (score, k)


def test_per_gpu_sums_from_one_sort_are_the_masked_sums():
    rng = np.random.default_rng()
    n, ranks = int(rng.integers(1000, 5000)), int(rng.integers(1, 40))
    rank, mask = rng.integers(0, ranks, n).astype(np.int32), rng.random(n) < 0.6
    values = rng.exponential(1e3, n)
    asked = np.unique(rng.integers(0, ranks + 2, ranks))  # some with no rows
    for r, got in zip(asked, metrics.by_rank(rank, mask, values, asked)):
        assert got.sum() == values[mask & (rank == r)].sum()  # the same floats in the same order


def test_parallel_points_come_back_in_the_jobs_order():
    exps = np.random.default_rng().permutation(12).tolist()
    assert sweeps.in_parallel(pow, [(3, e) for e in exps], workers=2) == [3 ** e for e in exps]
    assert sweeps.in_parallel(pow, [(3, e) for e in exps], workers=1) == [3 ** e for e in exps]


def test_rows_appended_whole_and_packed_by_the_engine_are_the_rows(monkeypatch):
    """The hot handlers append whole rows (codes, every column) and the engine packs them now and
    then: the trace holds them in order, mixed with rows added the checked way."""
    rng = np.random.default_rng()
    monkeypatch.setattr(TraceBuilder, "CHUNK", 5)
    rec = TraceBuilder()
    want = []
    for i in range(int(rng.integers(20, 40))):
        row = (int(rng.integers(0, 8)), 0, i, int(rng.integers(len(ROLES))), int(rng.integers(len(KINDS))),
               float(rng.random()), float(rng.random() + 1), -1, i, -1, int(rng.integers(0, 1 << 40)))
        if rng.random() < 0.5:
            rec.append(row)
        else:
            rec.add(row[0], row[1], row[2], ROLES[row[3]], KINDS[row[4]], *row[5:])
        if rng.random() < 0.3:
            rec.pack_full()
        want.append(row)
    trace = rec.build()
    for i, c in enumerate(COLUMNS):
        assert np.array_equal(trace[c], np.asarray([r[i] for r in want], COLUMNS[c])), c
    assert len(rec.build()) == 0  # the rows moved into the trace


def test_sampled_logits_times_the_triangular_factor_blockwise_are_the_product():
    rng = np.random.default_rng()
    for _ in range(5):
        t, e = int(rng.integers(1, 300)), int(rng.integers(1, 200))
        k = min(e, int(rng.integers(1, 200)))  # R of Wg = QR is min(H, E) x E, upper trapezoidal
        y = rng.standard_normal((t, k)).astype(np.float32)
        r = np.triu(rng.standard_normal((k, e))).astype(np.float32)
        got = routing._times_upper(y, r)
        want = y.astype(np.float64) @ r.astype(np.float64)
        assert got.dtype == np.float32 and np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
