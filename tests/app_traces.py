"""Small synthetic traces shaped like the simulator's, for the app's tests (no simulator needed)."""

import numpy as np

from reference import presets
from sim.trace import Trace, TraceBuilder


def pipeline_trace(ranks: int = 2, blocks: int = 40, tasks: int = 30, seed: int = 0,
                   config: str = "tiny") -> Trace:
    """Processor blocks running GEMM and combine tasks with idle gaps, plus one scheduler,
    proxy, NIC and link interval per GPU; meta names `config`."""
    rng = np.random.default_rng(seed)
    tb = TraceBuilder()
    kinds = ("gemm0", "gemm1", "combine", "idle")
    for rank in range(ranks):
        peer = (rank + 1) % ranks
        for lane in range(blocks):
            t = 0.0
            for i in range(tasks):
                d = float(rng.uniform(100, 1000))
                tb.add(rank, 0, lane, "processor", kinds[int(rng.integers(4))], t, t + d,
                       expert=i % 4, tile=i)
                t += d + float(rng.uniform(0, 200))
        tb.add(rank, 0, 0, "scheduler", "wait", 0, 5000)
        tb.add(rank, 0, 0, "proxy", "fence", 100, 900, peer=peer)
        tb.add(rank, 0, 0, "nic", "put", 0, 400, peer=peer, nbytes=4096)
        tb.add(rank, 0, peer, "link", "put", 0, 400, peer=peer, nbytes=4096)
    return tb.build({"producer": "test", "config": presets.get(config).to_dict()})
