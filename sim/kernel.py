"""FlashMoE's persistent kernel on one GPU: gate, dispatch, then processors fed by the OS block.

Every block runs the gate, then the processor blocks move this GPU's outgoing token tiles: on the
kernel's "store" path each tile for this GPU or an NVLink peer is gathered straight into the
owner's inbox by up to 4 blocks (all processors busy when the tiles are fewer) and the last one
signals; a tile across nodes, or every tile on the "put" path, is packed by one block and put
with its signal. Then the OS block's subscriber warps
watch the arrival flags and turn arrived tiles into tasks for the scheduler warp, which
hands them to processor blocks in queue order:

- a dispatched tile arrives at its expert's owner: its GEMM0 tasks (one per tile_n columns of I)
  go into the queue, or, with the "expert" queue policy (the bf16 kernel's, costs.queue_policy),
  wait for the expert's last tile from any source and go in with all of its tiles' tasks, column
  block by column block, the tasks reading one weight slice side by side;
- the processor finishing a tile's last GEMM0 enqueues the tile's GEMM1 tasks;
- each GEMM1 task stores its column block straight into the source rank's memory (its GPU or an
  NVLink peer; the stores' time over NVLink is added to every task) and counts itself in there;
  the tile is back when the last one's count lands. Across nodes there is no such path: the one
  finishing the last GEMM1 puts the whole tile, through the NIC;
- the returned tile arrives at the source: one combine task, and the tile is done;
- once every task of this GPU is done, each processor sums its share of the tokens' returned
  rows in choice order (the final combine; costs.reduce_ns, absent when the preset gives it 0).
A processor is free again `handoff_ns` after its task ends (the scheduler sees it idle and mails
the next task); a landed tile's tasks can start `wake_ns` after the subscriber's turn, a burst of
tasks goes out one each `assign_ns`, and the final combine starts `stop_ns` after the last task.

The scheduler is a FIFO ready queue served by identical processors, so each task goes to the
processor that frees first. `Scheduler` computes that assignment when the tasks are enqueued,
which gives the same schedule as processor processes polling the queue, with one simulation
event per tile phase instead of several per task (the trace still has one row per task).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import simpy

from reference import Config, TilePlan
from reference.plan import COMBINE, DISPATCH, GEMM0, GEMM1, NETWORK, RETURN, TASK_KINDS

from . import costs
from .hardware import Hardware
from .trace import TraceBuilder

SUBSCRIBER_WARPS = 3  # FlashMoE's OS block: 1 scheduler warp + 3 subscriber warps


class Scheduler:
    """Processor blocks as a heap of (time free, lane); tasks go to the earliest free one, which
    is free again `handoff` after the task ends; the scheduler hands out one task each `assign`."""

    def __init__(self, free_at: list[float], handoff: float = 0.0, assign: float = 0.0):
        self.free = [(t, lane) for lane, t in enumerate(free_at)]
        self.handoff, self.assign_ns = handoff, assign
        self.turn = 0.0  # when the scheduler can hand out its next task
        heapq.heapify(self.free)

    def assign(self, now: float, durations) -> list[tuple[int, float, float]]:
        """(lane, start, end) of tasks enqueued at `now`, in queue order."""
        out = []
        for d in durations:
            t, lane = heapq.heappop(self.free)
            start = max(now, t, self.turn)
            self.turn = max(now, self.turn) + self.assign_ns
            end = start + d
            heapq.heappush(self.free, (end + self.handoff, lane))
            out.append((lane, start, end))
        return out


class TilePhases:
    """The tasks of each tile grouped by phase: tasks[tile][kind] -> task ids in plan order."""

    def __init__(self, plan: TilePlan):
        order = np.lexsort((np.arange(plan.task_kind.size), plan.task_kind, plan.task_tile))
        tile, kind = plan.task_tile[order], plan.task_kind[order]
        cut = np.flatnonzero((np.diff(tile) != 0) | (np.diff(kind) != 0)) + 1
        self.tasks: list[dict[int, np.ndarray]] = [{} for _ in range(plan.tile_src.size)]
        for group in np.split(order, cut):
            if group.size:
                self.tasks[int(plan.task_tile[group[0]])][int(plan.task_kind[group[0]])] = group
        self.transfer = np.full((plan.tile_src.size, 2), -1, np.int64)
        self.transfer[plan.transfer_tile, plan.transfer_kind] = np.arange(plan.transfer_tile.size)


class FusedKernel:
    """One GPU running the layer as one persistent kernel."""

    def __init__(self, env: simpy.Environment, cfg: Config, plan: TilePlan, hw: Hardware, rank: int,
                 phases: TilePhases, durations: np.ndarray, rec: TraceBuilder,
                 send: Callable[..., None], on_tile_done: Callable[[int], None], dispatch: str, queue: str):
        self.env, self.cfg, self.plan, self.hw, self.rank = env, cfg, plan, hw, rank
        self.dispatch, self.queue = dispatch, queue  # costs.DISPATCH_PATHS, costs.QUEUE_POLICIES
        self.node = cfg.node_of(rank)
        self.phases, self.durations, self.rec = phases, durations, rec
        self.send, self.on_tile_done = send, on_tile_done
        self.processors = hw.processors
        self.subscribers = [(0.0, w) for w in range(SUBSCRIBER_WARPS)]
        self.scheduler: Scheduler | None = None
        # phases still to run here: GEMM0 and GEMM1 of the tiles this GPU computes, the combine
        # of the tiles of its tokens; at zero the final combine starts
        self.phases_left = sum(len(phases.tasks[t]) - (COMBINE in phases.tasks[t])
                               for t in np.flatnonzero(plan.tile_owner == rank)) + \
            sum(COMBINE in phases.tasks[t] for t in np.flatnonzero(plan.tile_src == rank))
        # each local expert's dispatched tiles, from every source: its GEMM0 tasks wait for all
        self.expert_waiting: dict[int, list[int]] = {}
        self.expert_tiles = {int(e): int(n) for e, n in
                             zip(*np.unique(plan.tile_expert[plan.tile_owner == rank], return_counts=True))}

    def start(self) -> None:
        """Gate on every block, then the processor blocks move this GPU's outgoing tiles, each
        block its shares in the kernel's order."""
        gate = costs.gate_ns(self.hw, self.cfg) + self.hw.task_overhead_ns
        for lane in range(self.processors):
            self.rec.add(self.rank, self.node, lane, "processor", "gate", 0.0, gate)
        self.rec.add(self.rank, self.node, 0, "scheduler", "gate", 0.0, gate)
        shares = self.dispatch_shares()
        free_at = [gate] * self.processors
        # a block's j-th share runs beside the other blocks' j-th (round j): the bytes each round
        # has in flight and its shares over each link (at 16K tokens on two H100s, bf16, the first
        # round stores into this GPU and the second, over NVLink, shares the port 125 ways)
        taken = [0] * self.processors
        rounds = []
        for _, lane, _, _ in shares:
            rounds.append(taken[lane])
            taken[lane] += 1
        inflight = [0.0] * (max(rounds, default=-1) + 1)
        over: list[dict[int, int]] = [{} for _ in inflight]
        for j, (_, _, x, nbytes) in zip(rounds, shares):
            link = int(self.plan.transfer_link[x])
            inflight[j] += nbytes
            over[j][link] = over[j].get(link, 0) + 1
        ready: dict[int, float] = {}
        for j, (_, lane, x, nbytes) in zip(rounds, shares):
            t, link = int(self.plan.transfer_tile[x]), int(self.plan.transfer_link[x])
            end = free_at[lane] + costs.dispatch_ns(self.hw, nbytes, link, self.dispatch, inflight[j], over[j])
            self.rec.add(self.rank, self.node, lane, "processor", "dispatch", free_at[lane], end,
                         int(self.plan.tile_expert[t]), t, int(self.plan.transfer_dst[x]), nbytes)
            free_at[lane] = end
            ready[x] = max(ready.get(x, 0.0), end)
        for x, end in ready.items():
            stored = costs.stores_dispatch(self.dispatch, int(self.plan.transfer_link[x]))
            self.env.timeout(end).callbacks.append(lambda _, x=x, stored=stored: self.send(x, stored=stored))
        self.scheduler = Scheduler(free_at, self.hw.handoff_ns, self.hw.assign_ns)
        if not self.phases_left:
            self.final_combine(max(free_at))

    def dispatch_shares(self) -> list[tuple[int, int, int, int]]:
        """(share index u, processor, transfer, bytes) of this GPU's dispatch shares in u order: the
        kernel numbers the shares of tile slot (expert, chunk) slot x parts + part and gives share u
        to processor u mod processors; a tile it packs and puts is one block's."""
        p, cfg = self.plan, self.cfg
        parts = costs.dispatch_parts(cfg, self.processors, self.dispatch)
        per_expert = costs.dispatch_slots(cfg) // (cfg.experts + cfg.shared_experts)
        out = []
        for x in np.flatnonzero((p.transfer_kind == DISPATCH) & (p.transfer_src == self.rank)):
            t = int(p.transfer_tile[x])
            e, rows = int(p.tile_expert[t]), int(p.tile_rows[t])
            chunk = (int(p.tile_row0[t]) - int(p.block_offsets[self.rank * p.n_experts + e])) // cfg.tile_m
            n = parts if costs.stores_dispatch(self.dispatch, int(p.transfer_link[x])) else 1
            share = -(-rows // n)
            for part in range(n):
                r0 = min(rows, part * share)
                u = (e * per_expert + chunk) * parts + part
                nbytes = (min(rows, r0 + share) - r0) * int(p.transfer_bytes[x]) // rows
                out.append((u, u % self.processors, int(x), nbytes))
        return sorted(out)

    def arrive(self, x: int) -> None:
        """Transfer `x`'s signal has landed here: a subscriber warp turns its tile into tasks."""
        t = int(self.plan.transfer_tile[x])
        free, warp = heapq.heappop(self.subscribers)
        start = max(self.env.now, free)
        end = start + self.hw.subscriber_ns
        heapq.heappush(self.subscribers, (end, warp))
        self.rec.add(self.rank, self.node, warp, "subscriber", "signal", start, end,
                     int(self.plan.tile_expert[t]), t, int(self.plan.transfer_src[x]))
        if int(self.plan.transfer_kind[x]) == DISPATCH and self.queue == "expert":
            # the expert's tiles wait for its last, then go into the queue together
            e = int(self.plan.tile_expert[t])
            waiting = self.expert_waiting.setdefault(e, [])
            waiting.append(t)
            if len(waiting) < self.expert_tiles[e]:
                return
            self.env.timeout(end + self.hw.wake_ns - self.env.now).callbacks.append(
                lambda _: self.enqueue_expert(sorted(waiting)))
        else:
            kind = GEMM0 if int(self.plan.transfer_kind[x]) == DISPATCH else COMBINE
            self.env.timeout(end + self.hw.wake_ns - self.env.now).callbacks.append(lambda _: self.enqueue(t, kind))

    def enqueue(self, t: int, kind: int) -> None:
        """Hand tile `t`'s tasks of one phase to the scheduler."""
        self.hand_out(kind, [(t, int(task)) for task in self.phases.tasks[t][kind]])

    def enqueue_expert(self, tiles: list[int]) -> None:
        """An expert's tiles' GEMM0 tasks, column block by column block (os.cuh enqueue_expert)."""
        per_tile = [self.phases.tasks[t][GEMM0] for t in tiles]
        self.hand_out(GEMM0, [(t, int(tasks[c])) for c in range(max(map(len, per_tile)))
                              for t, tasks in zip(tiles, per_tile) if c < len(tasks)])

    def hand_out(self, kind: int, order: list[tuple[int, int]]) -> None:
        """Hand (tile, task) pairs of one phase to the scheduler in queue order; each tile goes on
        when its last task ends."""
        stores: dict[int, float] = {}
        if kind == GEMM1:  # each task stores its share of the tile home (none across nodes: a NIC puts it)
            for t in {t for t, _ in order}:
                x = int(self.phases.transfer[t, RETURN])
                stores[t] = costs.store_ns(self.hw, int(self.plan.transfer_link[x]),
                                           int(self.plan.transfer_bytes[x]) / len(self.phases.tasks[t][kind]))
        durations = [float(self.durations[task]) + stores.get(t, 0.0) for t, task in order]
        last: dict[int, float] = {}
        for (t, _), (lane, start, end) in zip(order, self.scheduler.assign(self.env.now, durations)):
            self.rec.add(self.rank, self.node, lane, "processor", TASK_KINDS[kind], start, end,
                         int(self.plan.tile_expert[t]), t)
            last[t] = max(last.get(t, end), end)
        for t, end in last.items():
            self.env.timeout(end - self.env.now).callbacks.append(lambda _, t=t: self.phase_done(t, kind))

    def phase_done(self, t: int, kind: int) -> None:
        self.phases_left -= 1
        if kind == GEMM0:
            self.enqueue(t, GEMM1)
        elif kind == GEMM1:
            x = int(self.phases.transfer[t, RETURN])
            self.send(x, stored=int(self.plan.transfer_link[x]) != NETWORK)
        else:
            self.on_tile_done(t)
        if not self.phases_left:
            self.final_combine(self.env.now + self.hw.stop_ns)

    def final_combine(self, start: float) -> None:
        """Every processor sums its share of this GPU's tokens (when the preset models it)."""
        d = costs.reduce_ns(self.hw, self.cfg, self.processors)
        if d > 0:
            for lane in range(self.processors):
                self.rec.add(self.rank, self.node, lane, "processor", "combine", start, start + d)
