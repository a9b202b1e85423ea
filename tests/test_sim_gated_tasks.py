"""The simulator prices a task by the weight columns it reads (reference.plan.weight_columns): a gated
GEMM0 task reads its gate and its up columns, twice a plain one's, and a ragged last column block
fewer; its FLOPs per row are its FLOPs over its tile's rows."""

import numpy as np
import pytest

import reference
from reference import Config
from reference.plan import COMBINE, GEMM0
from sim import costs


def small(**changes) -> Config:
    cfg = Config(name="t", tokens=256, hidden=256, ffn=384, experts=8, top_k=2, ranks=2, dtype="bfloat16",
                 tile_m=64, tile_n=128, tile_k=64, seed=int(np.random.default_rng().integers(1 << 30)))
    return cfg.replace(**changes)


@pytest.mark.parametrize("changes", [{}, {"activation": "swiglu"}, {"ffn": 320}, {"activation": "swiglu", "ffn": 320}])
def test_a_tasks_flops_per_row_times_its_rows_are_its_flops(changes):
    cfg = small(**changes)
    plan = reference.plan_of(cfg)
    gemm = plan.task_kind != COMBINE
    rows = plan.tile_rows[plan.task_tile]
    assert np.array_equal((costs.flops_per_row(cfg, plan) * rows)[gemm], plan.task_flops[gemm].astype(float))


def test_a_gated_gemm0_task_loads_twice_the_weights_of_a_plain_one():
    plain = small(activation="silu")
    gated = plain.replace(activation="swiglu")
    p_plan, g_plan = reference.plan_of(plain), reference.plan_of(gated)
    assert np.array_equal(p_plan.task_kind, g_plan.task_kind)  # the same routing and tiles
    p = costs.weight_bytes_alone(plain, p_plan, 132, "expert-both")
    g = costs.weight_bytes_alone(gated, g_plan, 132, "expert-both")
    gemm0 = p_plan.task_kind == GEMM0
    assert np.allclose(g[gemm0], 2 * p[gemm0]) and np.array_equal(g[~gemm0], p[~gemm0])
    ragged = plain.replace(ffn=320)  # column blocks of 128, 128 and 64
    r_plan = reference.plan_of(ragged)
    r = costs.weight_bytes_alone(ragged, r_plan, 132, "expert-both")
    last = (r_plan.task_kind == GEMM0) & (r_plan.task_cols == 64)
    assert last.any() and np.allclose(r[last] * 2, r[(r_plan.task_kind == GEMM0) & (r_plan.task_cols == 128)][0])
