"""The gate phase's routers on real GPUs (pytest -m gpu; skipped cleanly without torch or a CUDA device).

For 1, 2 and 4 GPUs (as many as the machine has), every router of gpu.cases.ROUTERS (Mixtral's,
Qwen3's, DeepSeek-V2's and V3's group-limited top-k with routed scaling, Llama 4's sigmoid top-1,
gpt-oss' router bias; E up to 256, k up to 12, past the 8 choices of the selection's first round),
on fresh random inputs and on inputs whose experts and groups are tied (cases.tie_experts): the
kernel's experts, slots and counts equal the golden's,
its weights within float64 rounding of them, its output the golden's within float32's tolerance
(bf16's for the bf16 cases).
"""

import cuda_gpus
import pytest

from gpu.cases import GOLDEN_TOLERANCE

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("p", [1, 2, 4])
def test_every_router_routes_as_the_golden(p, tmp_path):
    from gpu import cases

    results = cuda_gpus.run_cases(cases.router_check_cases, p, tmp_path, timeout_s=180)
    for r in results:
        assert r["routing_equal"] and r["counts_equal"], r["name"]
        scale = r["config"]["routed_scaling"]
        assert r["weight_max_abs_err"] < 1e-12 * scale, (r["name"], r["weight_max_abs_err"])
        precision = r["config"]["precision"]
        assert r["rel_err"] < GOLDEN_TOLERANCE[precision], (r["name"], r["rel_err"])
        assert not r["nan"] and r["telemetry_same_output"], r["name"]
