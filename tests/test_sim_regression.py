"""The simulator's results on small multi-node layers, bit for bit, against a committed snapshot.

Each point (a layer spread one GPU a node, so no NVLink port enters, or two GPUs a node; every
transport and dispatch path) is simulated and its sorted trace reduced to a SHA-256 of its
columns; the snapshot (tests/golden/sim_multinode.json) also keeps the latency and fence counts,
so a failure says what moved. A change to the simulator that is meant to keep its results
rewrites nothing here; one that is meant to change them rewrites the snapshot, as its commit says:

    python -m tests.test_sim_regression --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from reference import Config, presets
from sim import engine
from sim.network import TRANSPORTS
from sim.trace import COLUMNS, DISPATCH_PATHS

SNAPSHOT = Path(__file__).parent / "golden" / "sim_multinode.json"
# one GPU a node (4x1: every transfer between GPUs crosses the network), or two (2x2: each GPU's
# NVLink port beside its NIC)
LAYERS = {
    "tiny-nodrop-4x1": presets.get("tiny-nodrop").replace(gpus_per_node=1),
    "tiny-nodrop-2x2": presets.get("tiny-nodrop").replace(gpus_per_node=2),
    "perseus-small-4x1": presets.get("perseus-comm").replace(name="perseus-small", tokens=64, hidden=256,
                                                             experts=16, ranks=4, gpus_per_node=1, tile_m=32,
                                                             precision="bfloat16"),
}
POINTS = [(layer, t, d) for layer in LAYERS for t in TRANSPORTS for d in DISPATCH_PATHS]


def key(layer: str, transport: str, dispatch: str) -> str:
    return f"{layer}/{transport}/{dispatch}"


def result(cfg: Config, transport: str, dispatch: str) -> dict:
    """The point's trace digest and its headline figures."""
    r = engine.simulate(cfg, "h100-sxm", transport, dispatch=dispatch)
    h = hashlib.sha256()
    for c in COLUMNS:
        h.update(r.trace[c].tobytes())
    return {"trace_sha256": h.hexdigest(), "rows": len(r.trace), "latency_ns": r.metrics["latency_ns"],
            "fences": r.metrics["fences"]["total"], "events": r.events}


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


@pytest.mark.parametrize("layer,transport,dispatch", POINTS)
def test_multinode_results_are_the_snapshot(snapshot, layer, transport, dispatch):
    got, want = result(LAYERS[layer], transport, dispatch), snapshot[key(layer, transport, dispatch)]
    assert got == want


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python -m tests.test_sim_regression --write", file=sys.stderr)
        return 2
    out = {key(*p): result(LAYERS[p[0]], p[1], p[2]) for p in POINTS}
    SNAPSHOT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(out)} points to {SNAPSHOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
