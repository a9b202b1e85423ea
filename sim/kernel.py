"""FlashMoE's persistent kernel on one GPU: gate, dispatch, then processors fed by the OS block.

The work is the tile plan's (reference.plan): a tile is a window of an expert's slots at its
owner, made of chunks, each the rows of one source rank. Every block runs the gate, then the
processor blocks move this GPU's outgoing chunks, each for this GPU or an NVLink peer gathered
straight into the owner's inbox: on the kernel's "staged" path (its default, but from
costs.FLAT_DISPATCH_TOP_K choices a token on one node) 16 blocks send the peers' chunks one after another, local
expert by local expert, while the others store this GPU's own
(`staged_shares`); on its "store" path up to 4 blocks share each chunk (all processors busy when
the dispatch slots are fewer) and the last one signals; a chunk across nodes, or every chunk on
the "put" path, is packed by one block and put with its signal. Then
the OS block's subscriber warps watch the arrival flags (one signal per chunk) and turn landed
tiles into tasks for the scheduler warp, which hands them to processor blocks in queue order:

- a tile lands at its expert's owner with the last of its chunks: its GEMM0 tasks (one per
  tile_n columns of I) go into the queue, or, with the "expert-both" or "expert" queue policy
  (costs.QUEUE_POLICIES; the bf16 kernel's, costs.queue_policy), wait for the expert's last tile
  to land and go in with all of its tiles' tasks, column block by column block, the tasks
  reading one weight slice side by side;
- the processor finishing a tile's last GEMM0 enqueues the tile's GEMM1 tasks, or, with
  "expert-both", the one finishing the expert's last tile's enqueues every tile's, so;
- each GEMM1 task stores its column block of every chunk straight into the chunk's source rank
  (its GPU or an NVLink peer; the stores' time over NVLink is added to every task, and its bytes
  for the peers pass this GPU's NVLink port behind those of the tasks before it) and counts
  itself in there; a chunk is back when the last one's count lands. Across nodes there is no
  such path: the one finishing the tile's last GEMM1 puts each chunk, through the NIC;
- a returned chunk arrives at its source: one combine task, and the chunk is done;
- once every task of this GPU is done, each processor sums its share of the tokens' returned
  rows in choice order (the final combine; costs.reduce_ns, absent when the preset gives it 0).
A processor is free again `handoff_ns` after its task ends (the scheduler sees it idle and mails
the next task); a landed tile's or returned chunk's tasks can start `wake_ns` after the
subscriber's turn, a burst of tasks goes out one each `assign_ns`, and the final combine starts
`stop_ns` after the last task.

The scheduler is a FIFO ready queue served by identical processors, so each task goes to the
processor that frees first. `Scheduler` computes that assignment when the tasks are enqueued,
which gives the same schedule as processor processes polling the queue, with one simulation
event per tile phase (and per chunk combine) instead of several per task (the trace still has
one row per task, its "tile" column the plan's tile).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import simpy

from reference import Config, TilePlan
from reference.plan import COMBINE, DISPATCH, GEMM0, GEMM1, NETWORK, NVLINK, RETURN, TASK_KINDS, chunk_slots

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

    def assign(self, now: float, durations, finish: Callable[[int, float], float] | None = None
               ) -> list[tuple[int, float, float]]:
        """(lane, start, end) of tasks enqueued at `now`, in queue order; `finish(i, end)`, where
        given, moves task i's end later (what it waits for once its own work is done)."""
        out = []
        free, handoff, step, turn = self.free, self.handoff, self.assign_ns, self.turn
        for i, d in enumerate(durations):
            t, lane = free[0]
            start = max(now, t, turn)
            turn = max(now, turn) + step
            end = start + d if finish is None else finish(i, start + d)
            heapq.heapreplace(free, (end + handoff, lane))  # the popped lane, free again
            out.append((lane, start, end))
        self.turn = turn
        return out


class TilePhases:
    """The plan's work as the kernel meets it: tasks[tile][kind] -> the tile's GEMM0 or GEMM1 task
    ids in plan order, combine[chunk] -> the chunk's combine task, transfer[chunk, kind] -> its
    dispatch or return transfer (a tile's chunks: TilePlan.tile_chunks); `returns[tile]` its
    chunks' return transfers, `task_tile` and `tile_expert` the plan's, as Python lists (the
    kernels' event handlers index them per task, where a NumPy scalar costs more than the rest)."""

    def __init__(self, plan: TilePlan):
        gemm = np.flatnonzero(plan.task_chunk < 0)
        order = gemm[np.lexsort((gemm, plan.task_kind[gemm], plan.task_tile[gemm]))]
        tile, kind = plan.task_tile[order], plan.task_kind[order]
        cut = np.flatnonzero((np.diff(tile) != 0) | (np.diff(kind) != 0)) + 1
        n_tiles, n_chunks = plan.tile_expert.size, plan.chunk_tile.size
        self.tasks: list[dict[int, list[int]]] = [{} for _ in range(n_tiles)]
        for group in np.split(order, cut):
            if group.size:
                self.tasks[int(plan.task_tile[group[0]])][int(plan.task_kind[group[0]])] = group.tolist()
        combine = np.flatnonzero(plan.task_chunk >= 0)
        self.combine = np.full(n_chunks, -1, np.int64)
        self.combine[plan.task_chunk[combine]] = combine
        self.transfer = np.full((n_chunks, 2), -1, np.int64)
        self.transfer[plan.transfer_chunk, plan.transfer_kind] = np.arange(plan.transfer_chunk.size)
        ret = self.transfer[:, RETURN]
        self.returns = [ret[plan.tile_chunks(t)].tolist() for t in range(n_tiles)]
        self.task_tile, self.tile_expert = plan.task_tile.tolist(), plan.tile_expert.tolist()


class FusedKernel:
    """One GPU running the layer as one persistent kernel."""

    def __init__(self, env: simpy.Environment, cfg: Config, plan: TilePlan, hw: Hardware, rank: int,
                 phases: TilePhases, durations: list[float], rec: TraceBuilder,
                 send: Callable[..., None], on_chunk_done: Callable[[int], None], dispatch: str, queue: str,
                 staged_blocks: int = costs.STAGED_BLOCKS, sharing: dict[int, int] | None = None):
        self.env, self.cfg, self.plan, self.hw, self.rank = env, cfg, plan, hw, rank
        self.dispatch, self.queue = dispatch, queue  # trace.DISPATCH_PATHS, costs.QUEUE_POLICIES
        self.staged_blocks = staged_blocks  # the staged path's senders
        self.node = cfg.node_of(rank)
        self.phases, self.durations, self.rec = phases, durations, rec  # durations: a list, per task
        self.send, self.on_chunk_done = send, on_chunk_done
        self.processors = hw.processors
        self.subscribers = [(0.0, w) for w in range(SUBSCRIBER_WARPS)]
        self.scheduler: Scheduler | None = None
        self.port_free = 0.0  # when this GPU's NVLink port has sent the GEMM1 stores queued so far
        self.stores: list[tuple[int, float, float]] = []  # (task, own work's end, stores' end) through the port
        self.sharing = sharing  # task -> GEMM1 tasks storing through the port at once (port_sharing)
        mine = np.flatnonzero(plan.tile_owner == rank)
        # phases still to run here: GEMM0 and GEMM1 of the tiles this GPU computes, the combine
        # of each chunk of its tokens; at zero the final combine starts
        self.phases_left = sum(len(phases.tasks[t]) for t in mine) + int(np.count_nonzero(plan.chunk_src == rank))
        # dispatched chunks of each tile here not landed yet: the tile lands with its last (a shared
        # expert's tile has none: it reads its tokens in place and is ready after the gate)
        self.chunks_left = {int(t): sum(int(phases.transfer[c, DISPATCH]) >= 0 for c in plan.tile_chunks(t))
                            for t in mine}
        # each local expert's landed tiles: its GEMM0 tasks wait for all
        self.expert_waiting: dict[int, list[int]] = {}
        # each local expert's tiles whose GEMM0 tasks are done: with "expert-both", their GEMM1 tasks wait for all
        self.expert_gemm0_done: dict[int, list[int]] = {}
        self.expert_tiles = {int(e): int(n) for e, n in zip(*np.unique(plan.tile_expert[mine], return_counts=True))}

    def start(self) -> None:
        """Gate on every block, then the processor blocks move this GPU's outgoing chunks, each
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
        for t in [t for t, n in self.chunks_left.items() if not n]:
            self.land(t, gate + self.hw.wake_ns)
        if not self.phases_left:
            self.final_combine(max(free_at))

    def dispatch_shares(self) -> list[tuple[int, int, int, int]]:
        """(share index u, processor, transfer, bytes) of this GPU's dispatch shares in u order: the
        kernel has plan.chunk_slots dispatch slots per expert, slot j for the j-th chunk of this
        GPU's block in window order; it numbers the shares of slot (expert, j) slot x parts + part
        and gives share u to processor u mod processors; a chunk it packs and puts is one block's."""
        p, cfg = self.plan, self.cfg
        if self.dispatch == "staged" and cfg.ranks > 1:
            return self.staged_shares()
        parts = costs.dispatch_parts(cfg, self.processors, self.dispatch)
        per_expert = chunk_slots(cfg)
        taken: dict[int, int] = {}  # chunks of each expert's block met so far
        out = []
        # dispatch transfers in plan order: a block's chunks in window order (chunks are tile-major)
        for x in np.flatnonzero((p.transfer_kind == DISPATCH) & (p.transfer_src == self.rank)):
            c = int(p.transfer_chunk[x])
            e, rows = int(p.tile_expert[p.chunk_tile[c]]), int(p.chunk_rows[c])
            j = taken.get(e, 0)
            taken[e] = j + 1
            n = parts if costs.stores_dispatch(self.dispatch, int(p.transfer_link[x])) else 1
            share = -(-rows // n)
            for part in range(n):
                r0 = min(rows, part * share)
                u = (e * per_expert + j) * parts + part
                nbytes = (min(rows, r0 + share) - r0) * int(p.transfer_bytes[x]) // rows
                out.append((u, u % self.processors, int(x), nbytes))
        return sorted(out)

    def staged_shares(self) -> list[tuple[int, int, int, int]]:
        """The staged dispatch's shares (trace.DISPATCH_PATHS), one per chunk, as the kernel numbers
        its chunk slots: a peer's slot j of local expert le, the peers counted k = 0.. from rank + 1
        on (the senders stagger their owners), is u = (le (P - 1) + k) CH + j on processor u mod R;
        this GPU's own slot j of local expert le is u = le CH + j on processor R + u mod (the
        other processors)."""
        p, cfg = self.plan, self.cfg
        r, slots, experts = min(self.staged_blocks, self.processors - 1), chunk_slots(cfg), cfg.local_experts
        taken: dict[int, int] = {}
        remote, local = [], []
        for x in np.flatnonzero((p.transfer_kind == DISPATCH) & (p.transfer_src == self.rank)):
            e = int(p.tile_expert[p.chunk_tile[p.transfer_chunk[x]]])
            j = taken.get(e, 0)
            taken[e] = j + 1
            owner, le = divmod(e, experts)
            if owner == self.rank:
                u = le * slots + j
                local.append((u, r + u % (self.processors - r), int(x), int(p.transfer_bytes[x])))
            else:
                u = (le * (cfg.ranks - 1) + (owner - self.rank - 1) % cfg.ranks) * slots + j
                remote.append((u, u % r, int(x), int(p.transfer_bytes[x])))
        return sorted(remote) + sorted(local)

    def arrive(self, x: int) -> None:
        """Transfer `x`'s signal has landed here: a subscriber warp takes its chunk. A dispatched
        tile lands with its last chunk and its tasks are queued; a returned chunk is combined."""
        p = self.plan
        c, t = int(p.transfer_chunk[x]), int(p.transfer_tile[x])
        free, warp = heapq.heappop(self.subscribers)
        start = max(self.env.now, free)
        end = start + self.hw.subscriber_ns
        heapq.heappush(self.subscribers, (end, warp))
        self.rec.add(self.rank, self.node, warp, "subscriber", "signal", start, end,
                     int(p.tile_expert[t]), t, int(p.transfer_src[x]))
        wake = end + self.hw.wake_ns - self.env.now
        if int(p.transfer_kind[x]) == RETURN:
            self.env.timeout(wake).callbacks.append(lambda _: self.enqueue_combine(c))
            return
        self.chunks_left[t] -= 1
        if not self.chunks_left[t]:
            self.land(t, wake)

    def land(self, t: int, wake: float) -> None:
        """Tile `t` has all its rows here: its GEMM0 tasks are queued `wake` from now (with the
        rest of its expert's tiles where the queue policy gathers them)."""
        if self.queue in costs.BY_EXPERT:
            # the expert's tiles wait for its last, then go into the queue together
            tiles = self.expert_complete(self.expert_waiting, t)
            if tiles:
                self.env.timeout(wake).callbacks.append(lambda _: self.enqueue_expert(tiles, GEMM0))
        else:
            self.env.timeout(wake).callbacks.append(lambda _: self.enqueue(t, GEMM0))

    def enqueue(self, t: int, kind: int) -> None:
        """Hand tile `t`'s tasks of one GEMM phase to the scheduler."""
        self.hand_out(kind, [(t, task) for task in self.phases.tasks[t][kind]])

    def enqueue_combine(self, c: int) -> None:
        """Hand chunk `c`'s combine task to the scheduler."""
        self.hand_out(COMBINE, [(c, int(self.phases.combine[c]))])

    def expert_complete(self, gathered: dict[int, list[int]], t: int) -> list[int] | None:
        """Tile `t` counted in with its expert's in `gathered`: all of the expert's tiles here, in
        order, once `t` is the last of them; else None."""
        e = int(self.plan.tile_expert[t])
        tiles = gathered.setdefault(e, [])
        tiles.append(t)
        return sorted(tiles) if len(tiles) == self.expert_tiles[e] else None

    def enqueue_expert(self, tiles: list[int], kind: int) -> None:
        """An expert's tiles' tasks of one GEMM phase, column block by column block (os.cuh
        enqueue_expert)."""
        per_tile = [self.phases.tasks[t][kind] for t in tiles]
        self.hand_out(kind, [(t, int(tasks[c])) for c in range(max(map(len, per_tile)))
                             for t, tasks in zip(tiles, per_tile) if c < len(tasks)])

    def hand_out(self, kind: int, order: list[tuple[int, int]]) -> None:
        """Hand (unit, task) pairs of one phase to the scheduler in queue order, a unit being a
        tile (GEMM0, GEMM1) or a chunk (combine); each unit goes on when its last task ends."""
        # a GEMM1 task stores its share of every chunk home: the bytes for NVLink peers cost it
        # their stores and queue at this GPU's port (none across nodes: the tile's last task hands
        # those chunks to a NIC)
        own = self.durations
        finish = None
        if kind == GEMM1:
            peer = {u: self.peer_bytes(u) for u in dict.fromkeys(u for u, _ in order)}
            extra = {u: costs.store_ns(self.hw, NVLINK, b) for u, b in peer.items()}
            durations = [own[task] + extra[u] for u, task in order]
            finish = lambda i, end: self.through_port(end, peer[order[i][0]], order[i][1])  # noqa: E731
        else:
            durations = [own[task] for _, task in order]
        last: dict[int, float] = {}
        add, rank, node, name = self.rec.add, self.rank, self.node, TASK_KINDS[kind]
        task_tile, tile_expert = self.phases.task_tile, self.phases.tile_expert
        for (u, task), (lane, start, end) in zip(order, self.scheduler.assign(self.env.now, durations, finish)):
            t = task_tile[task]
            add(rank, node, lane, "processor", name, start, end, tile_expert[t], t)
            if end >= last.get(u, end):
                last[u] = end
        for u, end in last.items():
            self.env.timeout(end - self.env.now).callbacks.append(lambda _, u=u: self.phase_done(u, kind))

    def peer_bytes(self, t: int) -> float:
        """The bytes a GEMM1 task of tile `t` stores into NVLink peers: its column block of each
        chunk whose source is one."""
        p, share = self.plan, len(self.phases.tasks[t][GEMM1])
        xs = self.phases.returns[t]
        return sum(int(p.transfer_bytes[x]) / share for x in xs if int(p.transfer_link[x]) == NVLINK)

    def through_port(self, end: float, nbytes: float, task: int) -> float:
        """When a GEMM1 task whose own work ends at `end` is done, its `nbytes` for the peers having
        gone through this GPU's NVLink port behind those of the tasks before it: a wave of tasks
        ending together queues there (four H200s, 1K tokens: 131 tasks' 48 KiB each, 17 us)."""
        if not nbytes:
            return end
        if self.sharing is not None and task in self.sharing:
            # the port's share beside the tasks it met: a wave of n such tasks all end when the
            # wave's bytes have gone, as the last one queued would (its own behind its work)
            return end + nbytes * (self.sharing[task] - 1) / self.hw.nvlink_gbps
        self.port_free = max(self.port_free, end - nbytes / self.hw.nvlink_gbps) + nbytes / self.hw.nvlink_gbps
        self.stores.append((task, end, max(end, self.port_free)))
        return max(end, self.port_free)

    def port_sharing(self) -> dict[int, int]:
        """Each GEMM1 task that stored through the port: how many tasks (itself included) were
        storing while it was, from its work's end to its stores' end, when they queued one after
        another."""
        if not self.stores:
            return {}
        _, e, f = (np.array(c) for c in zip(*self.stores))
        starts, ends = np.sort(e), np.sort(f)
        # [e_j, f_j] meets [e_i, f_i]: e_j <= f_i and f_j >= e_i
        n = np.searchsorted(starts, f, side="right") - np.searchsorted(ends, e, side="left")
        return {t: int(max(c, 1)) for (t, _, _), c in zip(self.stores, n)}

    def phase_done(self, u: int, kind: int) -> None:
        """Unit `u` (a tile, or a chunk for the combine) finished its phase `kind`."""
        self.phases_left -= 1
        if kind == GEMM0 and self.queue == "expert-both":
            # the processor ending the expert's last tile's GEMM0 queues every tile's GEMM1 tasks
            tiles = self.expert_complete(self.expert_gemm0_done, u)
            if tiles:
                self.enqueue_expert(tiles, GEMM1)
        elif kind == GEMM0:
            self.enqueue(u, GEMM1)
        elif kind == GEMM1:  # every chunk goes home: stored by the tasks, or put through the NIC
            for x in self.phases.returns[u]:
                self.send(x, stored=int(self.plan.transfer_link[x]) != NETWORK)
        else:
            self.on_chunk_done(u)
        if not self.phases_left:
            self.final_combine(self.env.now + self.hw.stop_ns)

    def final_combine(self, start: float) -> None:
        """Every processor sums its share of this GPU's tokens (when the preset models it)."""
        d = costs.reduce_ns(self.hw, self.cfg, self.processors)
        if d > 0:
            for lane in range(self.processors):
                self.rec.add(self.rank, self.node, lane, "processor", "combine", start, start + d)
