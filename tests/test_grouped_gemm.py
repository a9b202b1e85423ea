"""benchmarks/grouped_gemm.py: the rows and FLOPs each zoo layer's grouped GEMMs are timed at, the
share of the ceiling it reports, its refusals, and the committed run's rows."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import grouped_gemm  # noqa: E402

from reference import presets  # noqa: E402

MEASURED = Path(__file__).resolve().parent.parent / "measurements" / "gpu" / "h200x1-grouped-gemm.json"


def test_a_layer_row_times_each_gemm_at_the_layer_s_own_shapes(monkeypatch):
    """Qwen3-30B-A3B at 4K: 256 rows an expert, GEMM0 2048 -> 2 x 768 (gated), GEMM1 768 -> 2048."""
    asked = []

    def fake(experts, rows, k, n):
        asked.append((experts, rows, k, n))
        return (1e-3 if k == 2048 else 5e-4), "k-major"

    monkeypatch.setattr(grouped_gemm, "grouped_seconds", fake)
    r = grouped_gemm.layer_row("qwen3-30b-a3b", 4096, ceiling=500.0)
    assert asked == [(128, 256, 2048, 1536), (128, 256, 768, 2048)]
    flops0, flops1 = 2.0 * 128 * 256 * 2048 * 1536, 2.0 * 128 * 256 * 768 * 2048
    assert r["gemm0_share_of_ceiling"] == pytest.approx(flops0 / 1e-3 / 1e12 / 500.0)
    assert r["both_ms"] == pytest.approx(1.5)
    assert r["both_share_of_ceiling"] == pytest.approx((flops0 + flops1) / 1.5e-3 / 1e12 / 500.0)


@pytest.mark.parametrize("argv, says", [(["--layers", "nope"], "'nope' is not allowed"),
                                        (["--tokens", "0"], "at least 1")])
def test_bad_arguments_are_refused_before_the_gpu_work(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        grouped_gemm.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_committed_run_covers_the_zoo_at_both_token_counts():
    doc = json.loads(MEASURED.read_text())
    assert doc["meta"]["commit"] and doc["meta"]["gpus_seen"] == ["NVIDIA H200"]
    for key, tokens in (("tokens_4096", 4096), ("tokens_16384", 16384)):
        rows = {r["layer"]: r for r in doc[key]}
        assert set(rows) == set(presets.ZOO)
        for name, r in rows.items():
            cfg = presets.get(name)
            assert r["rows_per_expert"] == round(tokens * cfg.top_k / cfg.experts)
            assert 0.3 < r["both_share_of_ceiling"] < 1.1
