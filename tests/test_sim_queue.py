"""The simulated kernel queues a tile's GEMM tasks as the kernel build does (costs.queue_policy):
"tile", GEMM0's as each tile lands (with its last chunk) and GEMM1's as its GEMM0 tasks end;
"expert" (the older bf16 build), GEMM0's of all of an expert's tiles once its last has
landed, column block by column block (os.cuh enqueue_expert); "expert-both" (the bf16 build),
GEMM1's so too, once every tile's GEMM0 tasks have ended."""

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
    cfg = presets.get("flashmoe").replace(ranks=2, tokens=3072, precision="bfloat16", tile_n=256, tile_k=64, seed=seed,
                                          merge_sources=merge)
    return sim.simulate(cfg, hardware=HW, queue=queue).trace


def tasks_of(trace, kind: str) -> dict[tuple[int, int], list[tuple[float, float, int]]]:
    """Per (rank, expert): its `kind` tasks' (start, end, tile) in start order."""
    c = trace.columns
    m = (c["role"] == ROLE["processor"]) & (c["kind"] == KIND[kind])
    tasks: dict[tuple[int, int], list] = {}
    for r, e, t, start, end in zip(c["rank"][m], c["expert"][m], c["tile"][m], c["start"][m], c["end"][m]):
        tasks.setdefault((int(r), int(e)), []).append((float(start), float(end), int(t)))
    return {k: sorted(v) for k, v in tasks.items()}


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
    return {k: [(start, t) for start, _, t in v] for k, v in tasks_of(trace, "gemm0").items()}, landed


@pytest.mark.parametrize("merge", [True, False])
def test_an_expert_waits_for_its_last_tile_only_with_the_expert_queue(merge):
    seed = int(np.random.randint(1e6))
    early = {}
    for queue in costs.QUEUE_POLICIES:
        tasks, landed = gemm0_and_landings(layer(queue, seed, merge))
        early[queue] = sum(ts[0][0] < landed[key] for key, ts in tasks.items())
    assert early["expert"] == early["expert-both"] == 0
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
        if queue in costs.BY_EXPERT:
            assert all(spread)
        else:  # a tile's column blocks go out together
            assert not any(spread)


@pytest.mark.parametrize("merge", [True, False])
def test_only_expert_both_queues_an_experts_gemm1_tasks_together(merge):
    """With "expert-both" an expert's GEMM1 tasks start once every one of its tiles' GEMM0 tasks
    has ended, one column block of every tile first; otherwise a tile's go out together, its
    first before the expert's other tile's GEMM0 tasks have all ended."""
    seed = int(np.random.randint(1e6))
    for queue in costs.QUEUE_POLICIES:
        trace = layer(queue, seed, merge)
        g0, g1 = tasks_of(trace, "gemm0"), tasks_of(trace, "gemm1")
        waited, spread = [], []
        for key, ts in g1.items():
            tiles = len({t for _, _, t in ts})
            assert tiles == 2, "C = 96 slots a source: two tiles per expert"
            waited.append(ts[0][0] >= max(end for _, end, _ in g0[key]) - 1e-6)  # ns, float sums
            spread.append(len({t for _, _, t in ts[:tiles]}) == tiles)
        if queue == "expert-both":
            assert all(waited) and all(spread)
        else:
            assert not all(waited) and not any(spread)


def test_the_default_is_the_kernel_builds_and_a_bad_policy_is_named():
    cfg = presets.get("tiny")
    assert sim.simulate(cfg).trace.meta["queue"] == "tile"
    assert sim.simulate(cfg.replace(precision="bfloat16")).trace.meta["queue"] == "expert-both"
    with pytest.raises(sim.SimError, match="queue"):
        sim.simulate(cfg, queue="fifo")


def test_cli_picks_the_queue(capsys):
    assert main(["sim", "--config", "tiny", "--set", "precision=bfloat16", "--queue", "tile", "--json", "--quiet"]) == 0
    assert '"queue": "tile"' in capsys.readouterr().out
    assert main(["sim", "--config", "tiny", "--queue", "fifo"]) == 2


def test_a_task_with_no_idle_processor_goes_into_the_lowest_second_slot_not_the_first_to_free():
    """The kernel's scheduler deals idle processors first, then a second task into each busy one's
    other mailbox slot in lane order (os.cuh): a task waits behind lane 0's long task though lane 1
    frees first, and the next, lane 0 holding two, goes to lane 1; with both holding two the next
    goes to the processor that frees first."""
    from sim.kernel import Scheduler

    long, short = np.random.uniform(200.0, 400.0), np.random.uniform(10.0, 50.0)
    sched = Scheduler([0.0, 0.0], handoff=0.0, assign=0.0)
    assert [lane for lane, _, _ in sched.assign(0.0, [long, short])] == [0, 1]
    (lane, start, _), = sched.assign(1.0, [5.0])
    assert (lane, start) == (0, long)  # lane 1 frees at `short`, but lane 0 is the lowest with a free slot
    (lane, start, _), = sched.assign(2.0, [5.0])
    assert (lane, start) == (1, short)
    (lane, start, _), = sched.assign(3.0, [5.0])
    assert (lane, start) == (1, short + 5.0)  # both hold two: the first to free


def test_an_idle_processor_is_the_first_to_free_to_the_last_bit_then_the_lowest():
    """Free times a rounding error apart are not a tie: the earlier takes the task, whatever its lane
    (the scheduler's heap keys hold a time exactly); equal times go to the lower lane."""
    from sim.kernel import Scheduler

    t = float(np.random.uniform(1e3, 1e7))
    later = np.nextafter(t, np.inf)
    (lane, start, _), = Scheduler([later, t, t], handoff=0.0, assign=0.0).assign(2 * t, [1.0])
    assert (lane, start) == (1, 2 * t)
    lanes = [lane for lane, _, _ in Scheduler([later, t, t], handoff=0.0, assign=0.0).assign(0.0, [1e9] * 3)]
    assert lanes == [1, 2, 0]
