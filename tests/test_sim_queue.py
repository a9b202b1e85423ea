"""The simulated subscriber queues a dispatched tile's GEMM0 tasks as the kernel build does
(costs.queue_policy): "tile", as each tile lands (with its last chunk); "expert" (the bf16
build), all of an expert's tiles once its last has landed, column block by column block
(os.cuh enqueue_expert)."""

import numpy as np
import pytest

import sim
from moelab.cli import main
from reference import presets
from sim import compare, costs, hardware
from sim.trace import KIND, ROLE

# the H100's calibrated preset (the scheduler hands out a task each assign_ns) with processors to
# spare: every task starts as it is handed out, so start order is queue order
HW = hardware.get(str(compare.MEASUREMENTS / "calibrated-h100.json")).replace(sms=4096)


def layer(queue: str, seed: int, merge: bool):
    """Two GPUs, C = 96 slots per (source, expert): two tiles per expert, merged (the second source's
    first 32 slots share the first source's tile) or not (a tile per source)."""
    cfg = presets.get("flashmoe").replace(ranks=2, tokens=3072, dtype="bfloat16", tile_n=256, tile_k=64, seed=seed,
                                          merge_sources=merge)
    return sim.simulate(cfg, hardware=HW, queue=queue).trace


def gemm0_and_landings(trace):
    """Per (rank, expert): its GEMM0 tasks' (start, tile) in start order, and when its last dispatched
    tile landed (a tile lands with the last of its chunks; a chunk's first signal at its owner is
    its dispatch: its return, if it is the owner's own, comes later)."""
    c = trace.columns
    sig = (c["role"] == ROLE["subscriber"]) & (c["kind"] == KIND["signal"])
    first: dict[tuple[int, int, int], tuple[float, int]] = {}  # (rank, tile, source) -> (first signal's end, expert)
    for r, e, t, src, end in zip(c["rank"][sig], c["expert"][sig], c["tile"][sig], c["peer"][sig], c["end"][sig]):
        if (r, t, src) not in first or end < first[r, t, src][0]:
            first[r, t, src] = (float(end), int(e))
    landed: dict[tuple[int, int], float] = {}
    for (r, _, _), (end, e) in first.items():
        landed[int(r), e] = max(landed.get((int(r), e), 0.0), end)
    g0 = (c["role"] == ROLE["processor"]) & (c["kind"] == KIND["gemm0"])
    tasks: dict[tuple[int, int], list] = {}
    for r, e, t, start in zip(c["rank"][g0], c["expert"][g0], c["tile"][g0], c["start"][g0]):
        tasks.setdefault((int(r), int(e)), []).append((float(start), int(t)))
    return {k: sorted(v) for k, v in tasks.items()}, landed


@pytest.mark.parametrize("merge", [True, False])
def test_an_expert_waits_for_its_last_tile_only_with_the_expert_queue(merge):
    seed = int(np.random.randint(1e6))
    early = {}
    for queue in costs.QUEUE_POLICIES:
        tasks, landed = gemm0_and_landings(layer(queue, seed, merge))
        early[queue] = sum(ts[0][0] < landed[key] for key, ts in tasks.items())
    assert early["expert"] == 0
    assert early["tile"] > 0  # the GPU's own tiles start before the peer's land


@pytest.mark.parametrize("merge", [True, False])
def test_the_expert_queue_hands_out_one_column_block_of_every_tile_first(merge):
    seed = int(np.random.randint(1e6))
    for queue in costs.QUEUE_POLICIES:
        tasks, _ = gemm0_and_landings(layer(queue, seed, merge))
        spread = []
        for ts in tasks.values():
            tiles = len({t for _, t in ts})
            starts = [s for s, _ in ts]
            assert len(set(starts)) == len(starts), "a burst's tasks start one assign_ns apart"
            spread.append(len({t for _, t in ts[:tiles]}) == tiles)
        if queue == "expert":
            assert all(spread)
        else:  # a tile's column blocks go out together
            assert not any(spread)


def test_the_default_is_the_kernel_builds_and_a_bad_policy_is_named():
    cfg = presets.get("tiny")
    assert sim.simulate(cfg).trace.meta["queue"] == "tile"
    assert sim.simulate(cfg.replace(dtype="bfloat16")).trace.meta["queue"] == "expert"
    with pytest.raises(sim.SimError, match="queue"):
        sim.simulate(cfg, queue="fifo")


def test_cli_picks_the_queue(capsys):
    assert main(["sim", "--config", "tiny", "--set", "dtype=bfloat16", "--queue", "tile", "--json", "--quiet"]) == 0
    assert '"queue": "tile"' in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sim", "--config", "tiny", "--queue", "fifo"])
