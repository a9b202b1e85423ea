"""gpu.MoELayer on real GPUs (pytest -m gpu; skipped cleanly without torch or a CUDA device): on 1, 2
and 4 GPUs (as many as the machine has), each case of gpu.cases.moe_layer_cases builds the layer
from the reference's weights as torch tensors and calls it three times with new tokens; every call
routes as the golden does and matches its output within the precision's tolerance.
"""

import cuda_gpus
import pytest

from gpu.cases import GOLDEN_TOLERANCE

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("p", [1, 2, 4])
def test_moe_layer_matches_the_golden_call_after_call(p, tmp_path):
    from gpu import cases

    results = cuda_gpus.run_cases(cases.moe_layer_cases, p, tmp_path, timeout_s=180)
    for r in results:
        assert len(r["calls"]) == 3, r["name"]
        precision = r["config"]["precision"]
        for call in r["calls"]:
            assert call["routing_equal"] and call["counts_equal"] and not call["nan"], r["name"]
            assert call["weight_max_abs_err"] < 1e-12, (r["name"], call["weight_max_abs_err"])
            assert call["rel_err"] < GOLDEN_TOLERANCE[precision], (r["name"], call["rel_err"])
