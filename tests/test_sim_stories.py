"""The papers' stories as assertions on the sweeps: FlashMoE's fused kernel beats the
bulk-synchronous baseline at its default; on a communication-bound layer `ibrc` slows down as
nodes are added while Perseus (`perseus`) stays near `ibgda`, and decoupled signaling issues far
fewer fences than `ibrc`."""

import pytest

from reference import presets
from sim import sweeps

# the sweep's communication-bound layer (256 small experts, k = 8) on nodes of 2 GPUs: the tiles
# per GPU, and so the fence pattern, are those of nodes of 8
COMM = sweeps.COMM_BOUND


def test_fused_kernel_beats_the_baseline_at_the_flashmoe_default():
    (row,) = sweeps.fused_vs_baseline({"default": [presets.get("flashmoe")]})
    assert row["speedup"] > 1.0
    assert row["fused_sm_util"] > row["baseline_sm_util"]


@pytest.fixture(scope="module")
def multinode():
    rows = sweeps.multinode(COMM, nodes=(1, 2, 4, 8), gpus_per_node=2, transports=("ibgda", "ibrc", "perseus"))
    rows += sweeps.multinode(COMM, nodes=(8,), gpus_per_node=2, transports=("decoupled",))
    return rows


def test_ibrc_latency_grows_with_nodes_while_perseus_stays_near_ibgda(multinode):
    table = sweeps.latency_table(multinode)
    ibrc = [r["ibrc"] for r in table]
    assert all(b > a for a, b in zip(ibrc, ibrc[1:])), ibrc
    assert ibrc[-1] > 2 * ibrc[0]
    for r in table:
        assert r["perseus"] <= 1.5 * r["ibgda"], r
    assert table[-1]["ibrc"] > 4 * table[-1]["perseus"]


def test_decoupled_issues_at_least_4x_fewer_fences_than_ibrc_on_8_nodes(multinode):
    fences = {r["transport"]: r for r in sweeps.fence_table(multinode, 8)}
    assert fences["ibrc"]["fences"] >= 4 * fences["decoupled"]["fences"] > 0
    assert fences["perseus"]["proxy_blocked_us"] == 0 < fences["ibrc"]["proxy_blocked_us"]
