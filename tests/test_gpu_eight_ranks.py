"""The 8-GPU run (on a machine not lent today) checked as far as a CPU can: every case the
GPU tests and the benchmark would launch on P = 8 is a valid config the kernel supports, with its
experts placed 1/8 per rank, and its symmetric buffers fit an H200."""

import pytest

from gpu import cases, layout
from reference import Config

H200_BYTES = 141e9


def _eight_rank_cases() -> list[dict]:
    return (cases.check_cases(8, seed=7) + [cases.sit_out_case(8)] + cases.bench_cases(8, "sweep")
            + cases.bf16_check_cases(8, seed=7) + cases.bench_cases(8, "tiles", dtype="bfloat16")
            + cases.feature_check_cases(8, seed=7))


@pytest.mark.parametrize("case", _eight_rank_cases(), ids=lambda c: c["name"])
def test_every_eight_rank_case_is_supported_and_fits(case):
    cfg = Config.from_dict(case["config"])
    layout.check_supported(cfg)
    sizes = layout.Sizes.of(cfg)
    assert cfg.ranks == sizes.P == 8
    assert cfg.experts == 8 * sizes.L
    assert [cfg.owner(e) for e in range(cfg.experts)] == [e // sizes.L for e in range(cfg.experts)]
    assert sizes.symmetric_bytes < H200_BYTES / 2


def test_the_benchmark_covers_the_default_and_both_sweeps_on_eight():
    names = {c["name"] for c in cases.bench_cases(8, "sweep")}
    assert "bench-flashmoe-p8" in names
    assert {"bench-flashmoe-tokens-1k-p8", "bench-flashmoe-tokens-16k-p8"} <= names
    assert {"bench-flashmoe-experts-8-p8", "bench-flashmoe-experts-128-p8"} <= names
