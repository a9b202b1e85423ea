"""The megakernel on real GPUs (pytest -m gpu; skipped cleanly without torch or a CUDA device).

For 1, 2 and 4 GPUs (as many as the machine has): every check case of gpu.cases against the
float64 golden (routing exactly, output rel. error < 1e-5, poisoned outputs fully written,
telemetry on/off bit-identical), and with more than one GPU a rank that sits out: the others
must raise KernelTimeout within their time budget instead of hanging. The bf16 kernel (tensor
cores) on the bf16 check cases against the reference's bf16-emulated golden: routing exactly (the
reference routes the bf16-rounded tokens and gate weights), rel. error < 2e-2, outputs poisoned
and fully written, telemetry on/off bit-identical. The TF32 kernel on the tf32 check cases against
the reference's tf32 path (rel. error < 1e-4) and against float64 (< 5e-3, gpu.cases.TF32_VS_FLOAT64), routing
exactly, outputs poisoned and fully written, telemetry on/off bit-identical. The split TF32
kernel (tf32x3) on its check cases against float64 at float32's tolerance (< 1e-5), and against
the torch float32 layer, routing exactly, outputs poisoned and fully written, telemetry on/off
bit-identical. Real models' layers (cases.feature_check_cases: gated, shared experts, ragged,
scaled before the expert; gpt-oss' and DeepSeek-V2-Lite's sizes) in every build against the golden
of their precision, outputs poisoned and fully written, telemetry on/off bit-identical.
"""

import os

import cuda_gpus
import pytest

from gpu import cases
from gpu.cases import GOLDEN_TOLERANCE, TF32_VS_FLOAT64
from reference import Config

pytestmark = pytest.mark.gpu



@pytest.fixture(scope="module", params=[1, 2, 4])
def suite(request, tmp_path_factory):
    p = request.param
    if cuda_gpus.count() < p:
        pytest.skip(f"needs {p} CUDA GPU(s), found {cuda_gpus.count()}")
    from gpu import spawn

    seed = int.from_bytes(os.urandom(4), "little")
    todo = (cases.check_cases(p, seed) + cases.bf16_check_cases(p, seed) + cases.tf32_check_cases(p, seed)
            + cases.tf32x3_check_cases(p, seed) + cases.feature_check_cases(p, seed)
            + ([cases.sit_out_case(p)] if p > 1 else []))
    results = spawn.run(todo, p, tmp_path_factory.mktemp(f"gpus{p}"), timeout_s=120)
    return p, {r["name"]: r for r in results}


def assert_matches_golden(r: dict, precision: str) -> None:
    """A check case's result against the golden of its precision (cases.GOLDEN_TOLERANCE)."""
    assert "failed" not in r, r["name"] + ": " + r.get("failed", "")
    assert r["golden_path"] == {"float32": "float64", "tf32x3": "float64"}.get(precision, precision), r["name"]
    assert r["routing_equal"] and r["counts_equal"], r["name"]
    assert r["weight_max_abs_err"] < 1e-12, r["name"]
    assert not r["nan"], r["name"]  # the poisoned outputs were all written
    assert r["rel_err"] < GOLDEN_TOLERANCE[precision], (r["name"], r["rel_err"])
    assert r["telemetry_same_output"], r["name"]


def test_kernel_matches_golden(suite):
    p, results = suite
    checks = [r for name, r in results.items()
              if name.startswith("check-")
              and not name.startswith(("check-bf16-", "check-tf32-", "check-tf32x3-", "check-feat-"))]
    assert checks
    for r in checks:
        assert_matches_golden(r, "float32")


def tensor_core_checks(p: int, results: dict, tag: str, precision: str) -> list[dict]:
    """The check-<tag>- cases, each held to its precision's golden and routed as the torch layer
    routed it, the all-to-one-expert case having dropped rows; returned for the test's own checks."""
    checks = [r for name, r in results.items() if name.startswith(f"check-{tag}-")]
    assert checks
    for r in checks:
        assert_matches_golden(r, precision)
        assert r["baseline_routing_equal"], r["name"]
    assert results[f"check-{tag}-one_expert_dropping-p{p}"]["dropped"] > 0
    return checks


def test_bf16_kernel_matches_bf16_golden(suite):
    p, results = suite
    for r in tensor_core_checks(p, results, "bf16", "bfloat16"):
        assert r["config"]["precision"] == "bfloat16", r["name"]


def test_tf32_kernel_matches_tf32_golden_and_float64(suite):
    p, results = suite
    for r in tensor_core_checks(p, results, "tf32", "tf32"):
        assert r["config"]["precision"] == "tf32", r["name"]
        assert r["rel_err_float64"] < TF32_VS_FLOAT64, (r["name"], r["rel_err_float64"])


def test_tf32x3_kernel_matches_float64_at_float32s_tolerance(suite):
    p, results = suite
    for r in tensor_core_checks(p, results, "tf32x3", "tf32x3"):
        assert r["config"]["precision"] == "tf32x3", r["name"]
        assert r["vs_baseline_rel_err"] < GOLDEN_TOLERANCE["tf32x3"], (r["name"], r["vs_baseline_rel_err"])


def test_real_models_layers_match_their_golden(suite):
    """Gated activations, shared experts, ragged H and I and the scaled-before-expert top-1, alone and
    together, in every build, and gpt-oss' and DeepSeek-V2-Lite's sizes at the bench tiles."""
    p, results = suite
    checks = [r for name, r in results.items() if name.startswith("check-feat-")]
    assert len(checks) == len(cases.feature_check_cases(p, 0))
    for r in checks:
        assert_matches_golden(r, Config.from_dict(r["config"]).precision)


def test_dropping_and_skew_were_exercised(suite):
    p, results = suite
    assert results[f"check-one_expert_dropping-p{p}"]["dropped"] > 0
    assert results[f"check-one_expert_nodrop-p{p}"]["dropped"] == 0


def test_rank_that_sits_out_makes_the_others_raise(suite):
    p, results = suite
    if p == 1:
        pytest.skip("needs a second rank")
    r = results[f"sit-out-p{p}"]
    assert r["raised"] == "KernelTimeout", r
    assert "timed out" in r["error"] and "rank" in r["error"]
    assert r["seconds_to_raise"] < 10


def test_validation_layer_12_matches_its_golden(tmp_path):
    """A validation layer whose warps each combine more than one token, H's last round of row loads
    part full: the layer that showed the combine's lanes must share every round."""
    if cuda_gpus.count() < 1:
        pytest.skip("needs a CUDA GPU")
    from gpu import spawn
    from reference import validation_set

    cfg = next(c for c in validation_set.layers() if c.name == "val-12")
    cfg = cfg.replace(**cases.PRECISIONS["bfloat16"][0])
    (r,) = spawn.run([{"name": "check-val-12-p1", "config": cfg.to_dict(), "inputs": "reference", "golden": True}],
                     1, tmp_path, timeout_s=120)
    assert_matches_golden(r, "bfloat16")
