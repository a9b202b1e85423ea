"""FlashMoE's persistent kernel on one GPU: gate, dispatch, then processors fed by the OS block.

The work is the tile plan's (reference.plan): a tile is a window of an expert's slots at its
owner, made of chunks, each the rows of one source rank. Every block runs the gate, then the
processor blocks move this GPU's outgoing chunks, each for this GPU or an NVLink peer gathered
straight into the owner's inbox: on the kernel's "staged" path (its default, costs.DEFAULT_DISPATCH) 16
blocks send the peers' chunks one after another, local
expert by local expert, while the others store this GPU's own
(`staged_shares`); on its "store" path up to 4 blocks share each chunk (all processors busy when
the dispatch slots are fewer) and the last one signals; a chunk across nodes, or every chunk on
the "put" path, is packed by one block and put with its signal. The stores into NVLink peers of
every GPU's blocks share the ports on their way, each GPU's way out and way in (sim.ports: the
senders of three GPUs storing into the one that owns the hot experts share its way in). Then
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
  (its GPU or an NVLink peer: its bytes for the peers go through this GPU's NVLink port, shared
  equally with the flows in it, and no sooner than at the block's store rate; the task holds
  its block until they have) and counts itself in there; a chunk is back when the last one's
  count lands. Across nodes there is no
  such path: the one finishing the tile's last GEMM1 puts each chunk, through the NIC;
- a returned chunk arrives at its source: one combine task, and the chunk is done;
- once every task of this GPU is done, each processor sums its share of the tokens' returned
  rows in choice order, the kept ones (the final combine; costs.reduce_ns, absent when the preset
  gives it 0).
A processor is free again `handoff_ns` after its task ends (the scheduler sees it idle and mails
the next task); a landed tile's or returned chunk's tasks can start `wake_ns` after the
subscriber's turn, an expert's tasks queued together (the bf16 build's queue) the time one thread
takes to write them later (costs.enqueue_ns: after the subscriber's turn for GEMM0, after the
expert's last GEMM0 task for GEMM1), a burst of tasks goes out one each `assign_ns`, and the final
combine starts `stop_ns` after the last task.

The scheduler is a FIFO ready queue served by identical processors, two mailbox slots each: a
task goes to an idle processor, else into the lowest busy one's free second slot, else to the one
that frees first. `Scheduler` computes that assignment when the tasks are enqueued,
which gives the same schedule as processor processes polling the queue, with one simulation
event per tile phase (and per chunk combine) instead of several per task (the trace still has
one row per task, its "tile" column the plan's tile); a task storing into peers ends when its
flow leaves the port, and the queue waits where a block so held might free first.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from reference import Config, TilePlan
from reference.plan import COMBINE, DISPATCH, GEMM0, GEMM1, NETWORK, NVLINK, RETURN, TASK_KINDS, chunk_slots

from . import costs
from .clock import Clock
from .hardware import Hardware
from .links import SharedLink
from .ports import Move
from .trace import KIND, ROLE, TraceBuilder
from .variant import Variant

SUBSCRIBER_WARPS = 3  # FlashMoE's OS block: 1 scheduler warp + 3 subscriber warps
SUBSCRIBER, SIGNAL = ROLE["subscriber"], KIND["signal"]  # a subscriber's row, appended whole
Done = Callable[[Any, int, float, float], None]  # a task's (tag, lane, start, end), once its end is known
# a free processor's heap key: its free time in 2^-62 ns steps (exact from 2^-10 ns on: a float that
# large is a whole number of them), then its lane, as one int: an int compares in a fraction of a
# (time, lane) tuple's time, and the scheduler compares millions
KEY_STEPS, LANE_BITS = float(1 << 62), 12


def heap_key(t: float, lane: int) -> int:
    """A processor free at `t` as its free heap's key (the scheduler's loop writes it out inline)."""
    return (int(t * KEY_STEPS) << LANE_BITS) | lane


class Scheduler:
    """Processor blocks as a heap of (time free, lane); a queued task goes to an idle one, else, as
    the kernel's scheduler deals a second task into a busy processor's other mailbox slot, to the
    lowest lane running its last task (os.cuh scheduler), else to the earliest free; a block is free
    again `handoff` after its task ends; the scheduler hands out one task each `assign`.

    A task that stores into NVLink peers holds its block until its bytes have gone through this
    GPU's port (`port`, a link the flows in it share: links.SharedLink) and no sooner than its
    stores at the block's own rate: its end is known only when its flow leaves, so a queued task
    waits while a held block may free before the earliest known one (the FIFO rule needs it)."""

    def __init__(self, free_at: list[float], handoff: float = 0.0, assign: float = 0.0,
                 env: Clock | None = None, port: SharedLink | None = None):
        if len(free_at) > 1 << LANE_BITS:
            raise ValueError(f"{len(free_at)} processors: the scheduler's heap keys hold at most {1 << LANE_BITS}")
        self.free = [heap_key(t, lane) for lane, t in enumerate(free_at)]
        self.free_at = list(free_at)  # each lane's end of its work (inf while held)
        self.key = list(self.free)  # each lane's live heap key (-1 while held); other entries are stale
        self.last_start = list(free_at)  # the start of each lane's last task (until then it holds both slots)
        self.running_last: list[int] = []  # lanes that may be running their last task, lowest first (lazy)
        self.listed = [False] * len(free_at)  # whether a lane is in running_last (once is enough)
        self.starting: list[tuple[float, int]] = []  # (start, lane) of tasks queued in a lane's second slot
        self.handoff, self.assign_ns = handoff, assign
        self.env, self.port = env, port
        self.turn = 0.0  # when the scheduler can hand out its next task
        heapq.heapify(self.free)
        # queued tasks: (enqueued at, own work, its stores at the block's rate, bytes for the port, done, tag)
        self.queue: deque[tuple[float, float, float, float, Done, Any]] = deque()
        self.held: list[tuple[float, int, int]] = []  # (earliest free, seq, lane) of blocks held by stores
        self.holding: dict[int, int] = {}  # lane -> seq of its live `held` entry
        self.seq = 0
        self.wake_at = math.inf  # the pending wake-up's time

    def assign(self, now: float, durations) -> list[tuple[int, float, float]]:
        """(lane, start, end) of tasks without stores for the port enqueued at `now`, in queue order."""
        out: list[tuple[int, float, float]] = []

        def done(_, lane: int, start: float, end: float) -> None:
            out.append((lane, start, end))

        self.submit(now, [(d, 0.0, 0.0, done, None) for d in durations])
        return out

    def submit(self, now: float, tasks: list[tuple[float, float, float, Done, Any]]) -> None:
        """Queue tasks (own work, stores at the block's rate, bytes through the port, done, tag)
        enqueued at `now`; done(tag, lane, start, end) is called once each task's end is known (a
        task without bytes for the port as it is handed out, in queue order)."""
        self.enqueue([(now, d, s, b, done, tag) for d, s, b, done, tag in tasks])

    def enqueue(self, entries: list[tuple[float, float, float, float, Done, Any]]) -> None:
        """Queue tasks as `submit` does, each with its own enqueue time first."""
        self.queue.extend(entries)
        self.pump()

    def pump(self) -> None:
        """Hand out queued tasks in order while the earliest known free block is sure to be first."""
        # the loop runs once a task, millions of times a large run: the state it touches is in locals
        # (`turn` written back on the way out: `done` only records, it never pumps again)
        queue, free, held, holding = self.queue, self.free, self.held, self.holding
        free_at, last_start, starting, running = self.free_at, self.last_start, self.starting, self.running_last
        turn, assign, handoff, inf = self.turn, self.assign_ns, self.handoff, math.inf
        keys, bits, steps, lanes = self.key, LANE_BITS, KEY_STEPS, (1 << LANE_BITS) - 1
        listed = self.listed
        heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace
        while queue:
            while held and holding.get(held[0][2]) != held[0][1]:
                heappop(held)  # a block released since
            while free and keys[free[0] & lanes] != free[0]:
                heappop(free)  # a lane given another task since
            lane = free[0] & lanes if free else -1
            t = free_at[lane] if free else inf
            enqueued = queue[0][0]
            dealt, second = enqueued if enqueued > turn else turn, -1
            if t > dealt:  # no idle lane: the lowest running its last task takes it next
                second = self.lowest_running_last(dealt)
                if second >= 0:
                    t, lane = free_at[second], second
            if second < 0 and held and t > held[0][0] and t > self.env.now:
                # a held block may free first: wait for a flow to leave the port, or until t
                if free and t < self.wake_at:
                    self.wake_at = t
                    self.env.call_in(t - self.env.now, self._wake)
                break
            _, own, store, nbytes, done, tag = queue.popleft()
            start = dealt if dealt > t else t
            turn = dealt + assign
            work_end = start + own
            last_start[lane] = start
            if start > dealt:
                heappush(starting, (start, lane))
            elif not listed[lane]:
                listed[lane] = True
                heappush(running, lane)
            if nbytes:
                if second < 0:
                    heappop(free)
                free_at[lane], keys[lane] = inf, -1
                self.seq += 1
                holding[lane] = self.seq
                heappush(held, (work_end + store + handoff, self.seq, lane))
                self.port.transfer_at(work_end, nbytes,
                                      partial(self._release, lane, start, work_end + store, done, tag))
            else:
                end = work_end + store
                free_at[lane] = end + handoff  # the block taken, free again at end
                keys[lane] = key = (int((end + handoff) * steps) << bits) | lane  # heap_key, inline
                if second < 0:  # the heap's top
                    heapreplace(free, key)
                else:
                    heappush(free, key)
                done(tag, lane, start, end)
        self.turn = turn

    def lowest_running_last(self, now: float) -> int:
        """The lowest lane running its last task at `now` (its other mailbox slot free), or -1."""
        running, starting, last_start, free_at = self.running_last, self.starting, self.last_start, self.free_at
        listed = self.listed
        while starting and starting[0][0] <= now:
            q = heapq.heappop(starting)[1]
            if not listed[q]:
                listed[q] = True
                heapq.heappush(running, q)
        while running:
            q = running[0]
            if last_start[q] <= now < free_at[q] < math.inf:
                return q
            heapq.heappop(running)  # idle, held or holding a second task: pushed again when it runs its last
            listed[q] = False
        return -1

    def _wake(self) -> None:
        self.wake_at = math.inf
        self.pump()

    def _release(self, lane: int, start: float, floor: float, done: Done, tag) -> None:
        end = max(floor, self.env.now)
        del self.holding[lane]
        self.free_at[lane] = end + self.handoff
        self.key[lane] = key = heap_key(self.free_at[lane], lane)
        heapq.heappush(self.free, key)
        done(tag, lane, start, end)
        self.pump()


class TilePhases:
    """The plan's work as the kernel meets it: tasks[tile][kind] -> the tile's GEMM0 or GEMM1 task
    ids in plan order, combine[chunk] -> the chunk's combine task, transfer[chunk, kind] -> its
    dispatch or return transfer (a tile's chunks: TilePlan.tile_chunks); `returns[tile]` its
    chunks' return transfers, `dispatched[tile]` how many of its chunks are dispatched,
    `tile_expert` and the transfer columns the plan's, as Python lists (the kernels' event handlers
    index them per task, where a NumPy scalar costs more than the rest); `task_kind_code` each
    task's trace code (trace.KIND), for its rows."""

    def __init__(self, plan: TilePlan):
        gemm = np.flatnonzero(plan.task_chunk < 0)
        order = gemm[np.lexsort((gemm, plan.task_kind[gemm], plan.task_tile[gemm]))]
        tile, kind = plan.task_tile[order], plan.task_kind[order]
        cut = np.flatnonzero((np.diff(tile) != 0) | (np.diff(kind) != 0)) + 1
        n_tiles, n_chunks = plan.tile_expert.size, plan.chunk_tile.size
        self.tasks: list[dict[int, list[int]]] = [{} for _ in range(n_tiles)]
        ids, firsts = order.tolist(), np.r_[0, cut].tolist() if order.size else []
        for a, b, t, k in zip(firsts, firsts[1:] + [len(ids)], tile[firsts].tolist(), kind[firsts].tolist()):
            self.tasks[t][k] = ids[a:b]
        combine = np.flatnonzero(plan.task_chunk >= 0)
        self.combine = np.full(n_chunks, -1, np.int64)
        self.combine[plan.task_chunk[combine]] = combine
        self.transfer = np.full((n_chunks, 2), -1, np.int64)
        self.transfer[plan.transfer_chunk, plan.transfer_kind] = np.arange(plan.transfer_chunk.size)
        ret, lo = self.transfer[:, RETURN].tolist(), plan.chunk_lo.tolist()
        self.returns = [ret[lo[t]:lo[t + 1]] for t in range(n_tiles)]
        sent = np.r_[0, np.cumsum(self.transfer[:, DISPATCH] >= 0)]
        self.dispatched = (sent[plan.chunk_lo[1:]] - sent[plan.chunk_lo[:-1]]).tolist()
        self.tile_expert = plan.tile_expert.tolist()
        self.task_kind_code = np.array([KIND[k] for k in TASK_KINDS], np.int8)[plan.task_kind]
        (self.transfer_chunk, self.transfer_tile, self.transfer_src, self.transfer_dst, self.transfer_kind,
         self.transfer_link, self.transfer_bytes) = (
            a.tolist() for a in (plan.transfer_chunk, plan.transfer_tile, plan.transfer_src, plan.transfer_dst,
                                 plan.transfer_kind, plan.transfer_link, plan.transfer_bytes))


class FusedKernel:
    """One GPU running the layer as one persistent kernel."""

    def __init__(self, env: Clock, cfg: Config, plan: TilePlan, hw: Hardware, rank: int,
                 phases: TilePhases, durations: list[float], rec: TraceBuilder,
                 send: Callable[..., None], on_chunk_done: Callable[[int], None], variant: Variant,
                 port: SharedLink):
        self.env, self.cfg, self.plan, self.hw, self.rank = env, cfg, plan, hw, rank
        self.variant = variant  # the kernel build's choices (sim.variant)
        self.node = cfg.node_of(rank)
        self.phases, self.durations, self.rec = phases, durations, rec  # durations: a list, per task
        self.send, self.on_chunk_done = send, on_chunk_done
        self.processors = hw.processors
        self.subscribers = [(0.0, w) for w in range(SUBSCRIBER_WARPS)]
        self.scheduler: Scheduler | None = None
        self.port = port  # this GPU's NVLink port, out: the GEMM1 tasks' stores share it with its puts
        # when every block is done with the gate (its top-k selected as the variant's `select`)
        self.gate_ns = costs.gate_ns(hw, cfg, variant.select) + hw.task_overhead_ns
        mine = np.flatnonzero(plan.tile_owner == rank)
        # phases still to run here: GEMM0 and GEMM1 of the tiles this GPU computes, the combine
        # of each chunk of its tokens; at zero the final combine starts
        self.phases_left = sum(len(phases.tasks[t]) for t in mine) + int(np.count_nonzero(plan.chunk_src == rank))
        # dispatched chunks of each tile here not landed yet: the tile lands with its last (a shared
        # expert's tile has none: it reads its tokens in place and is ready after the gate)
        self.chunks_left = {t: phases.dispatched[t] for t in mine.tolist()}
        # each local expert's landed tiles: its GEMM0 tasks wait for all
        self.expert_waiting: dict[int, list[int]] = {}
        # each local expert's tiles whose GEMM0 tasks are done: with "expert-both", their GEMM1 tasks wait for all
        self.expert_gemm0_done: dict[int, list[int]] = {}
        self.expert_tiles = {int(e): int(n) for e, n in zip(*np.unique(plan.tile_expert[mine], return_counts=True))}
        self.seen_ns = costs.signal_seen_ns(hw, cfg, plan, rank)
        # the processors' task rows, keyed by task
        self.task_rows = rec.keyed(rank, self.node, "processor", phases.task_kind_code, plan.task_tile,
                                   plan.tile_expert)

    def dispatch_moves(self) -> tuple[list[tuple[int, int, int]], list[Move], list[float]]:
        """This GPU's dispatch shares in the kernel's order, (processor, transfer, bytes) each, their
        moves (ports.Move) and each processor's walk after its last (deal_walks): a share stored into
        an NVLink peer moves its bytes through this GPU's way out and the peer's way in
        (ports.move_times shares them among all GPUs' flows), then its fence; any other its time
        alone (costs.dispatch_ns). A block's j-th share runs
        beside the other blocks' j-th (round j): the bytes each round has in flight and its shares
        over each link (at 16K tokens on two H100s, bf16, the first round stores into this GPU and
        the second, over NVLink, shares the port 125 ways)."""
        dealt = self.dispatch_shares()
        shares = [(lane, x, nbytes) for _, lane, x, nbytes, _ in dealt]
        leads, tails = self.deal_walks(dealt)
        taken = [0] * self.processors
        rounds = []
        for lane, _, _ in shares:
            rounds.append(taken[lane])
            taken[lane] += 1
        inflight = [0.0] * (max(rounds, default=-1) + 1)
        over: list[dict[int, int]] = [{} for _ in inflight]
        for j, (_, x, nbytes) in zip(rounds, shares):
            link = self.phases.transfer_link[x]
            inflight[j] += nbytes
            over[j][link] = over[j].get(link, 0) + 1
        parts = costs.dispatch_parts(self.cfg, self.processors, self.variant.dispatch)
        per_byte, fence = costs.nvlink_store_rate(self.hw, parts, self.variant.share_fences)
        row_bytes = self.cfg.hidden * self.cfg.dtype_bytes
        tokens = self.cfg.tokens * row_bytes  # this GPU's, which its shares gather
        moves = []
        for j, (_, x, nbytes), lead in zip(rounds, shares, leads):
            link, dst = self.phases.transfer_link[x], self.phases.transfer_dst[x]
            if link == NVLINK and costs.stores_dispatch(self.variant.dispatch, link):
                # the block's own rate on the bytes its copy loop pays for
                paid = costs.copied_bytes(self.hw, nbytes, row_bytes) / nbytes if nbytes else 1.0
                moves.append(Move(fence + self.hw.task_overhead_ns, nbytes, per_byte * paid, self.rank, dst, lead))
            else:
                ns = costs.dispatch_ns(self.hw, nbytes, link, self.variant.dispatch, inflight[j], over[j], tokens)
                moves.append(Move(ns, 0, 0.0, self.rank, dst, lead))
        return shares, moves, tails

    def deal_walks(self, dealt: list[tuple[int, int, int, int, int]]) -> tuple[list[float], list[float]]:
        """Each share's walk before it and each processor's walk after its last (dispatch_shares'
        order): the kernel's deal reads the row count of every expert on the processor's list in
        turn (processor.cuh deal_chunks), so a share costs a turnaround (the processor's first, which
        reads the list first, its own) plus a read for each place from the processor's share before
        (or the list's start) to its own, and the processor walks the rest of its list before its
        first task. A kernel that dealt chunk slots found its shares without the walk
        (costs.DISPATCH_DEALS): none."""
        if self.variant.deal != "chunks":
            return [0.0] * len(dealt), [0.0] * self.processors
        at, leads = [-1] * self.processors, []
        for _, lane, _, _, place in dealt:
            turnaround = self.hw.deal_first_ns if at[lane] < 0 else self.hw.deal_share_ns
            leads.append(turnaround + self.hw.deal_count_ns * (place - at[lane]))
            at[lane] = place
        return leads, [self.hw.deal_count_ns * (self.deal_list(lane) - 1 - at[lane]) for lane in range(self.processors)]

    def deal_list(self, lane: int) -> int:
        """The experts on processor `lane`'s deal list: every expert (flat), a staged sender's peers'
        local experts, or a storing processor's own GPU's."""
        if self.variant.dispatch != "staged" or self.cfg.ranks == 1:
            return self.cfg.experts
        experts = self.cfg.local_experts
        return experts * (self.cfg.ranks - 1) if lane < self.senders() else experts

    def senders(self) -> int:
        """The staged dispatch's senders: processors 0.. of them send the peers' chunks."""
        return min(self.variant.staged_blocks, self.processors - 1)

    def start(self, shares: list[tuple[int, int, int]], times: list[tuple[float, float]], tails: list[float]) -> None:
        """Gate on every block (for `gate_ns`), then the processor blocks move this GPU's outgoing
        chunks, each block its `shares` (dispatch_moves) in the kernel's order, at `times`, and walk
        `tails` more before their first task."""
        gate = self.gate_ns
        for lane in range(self.processors):
            self.rec.add(self.rank, self.node, lane, "processor", "gate", 0.0, gate)
        self.rec.add(self.rank, self.node, 0, "scheduler", "gate", 0.0, gate)
        free_at = [gate] * self.processors
        ph = self.phases
        ready: dict[int, float] = {}
        for (lane, x, nbytes), (start, end) in zip(shares, times):
            t = ph.transfer_tile[x]
            self.rec.add(self.rank, self.node, lane, "processor", "dispatch", start, end,
                         ph.tile_expert[t], t, ph.transfer_dst[x], nbytes)
            free_at[lane] = max(free_at[lane], end)
            ready[x] = max(ready.get(x, 0.0), end)
        free_at = [t + tail for t, tail in zip(free_at, tails)]
        for x, end in ready.items():
            stored = costs.stores_dispatch(self.variant.dispatch, ph.transfer_link[x])
            self.env.call_in(end, self.send, x, stored)
        self.scheduler = Scheduler(free_at, self.hw.handoff_ns, self.hw.assign_ns, self.env, self.port)
        for t in [t for t, n in self.chunks_left.items() if not n]:
            self.land(t, gate + self.hw.wake_ns)
        if not self.phases_left:
            self.final_combine(max(free_at))

    def numbered(self, slots: list[int]) -> list[int]:
        """Each chunk's number from its chunk slot, as the kernel deals (costs.DISPATCH_DEALS): its
        place among the chunks present, or, dealing slots, the slot itself."""
        if self.variant.deal == "slots":
            return slots
        place = {slot: i for i, slot in enumerate(sorted(set(slots)))}
        return [place[slot] for slot in slots]

    def dispatched_chunks(self) -> list[tuple[int, int, int]]:
        """(transfer, expert, j) of this GPU's dispatched chunks in plan order (expert by expert, a
        block's chunks in window order), j the chunk's place in its (source, expert) block."""
        p, taken, out = self.plan, {}, []
        for x in np.flatnonzero((p.transfer_kind == DISPATCH) & (p.transfer_src == self.rank)):
            e = int(p.tile_expert[p.chunk_tile[p.transfer_chunk[x]]])
            j = taken.get(e, 0)
            taken[e] = j + 1
            out.append((int(x), e, j))
        return out

    def dispatch_shares(self) -> list[tuple[int, int, int, int, int]]:
        """(share index u, processor, transfer, bytes, place) of this GPU's dispatch shares in u order:
        the kernel cuts each chunk numbered c (numbered) into `parts` shares, u = c parts + part, and
        deals share u to processor u mod processors; a chunk it packs and puts is one block's (its
        share 0). A share's place: its expert's on the processor's deal list (deal_list; flat, the
        expert)."""
        p, cfg = self.plan, self.cfg
        if self.variant.dispatch == "staged" and cfg.ranks > 1:
            return self.staged_shares()
        parts, per_expert = costs.dispatch_parts(cfg, self.processors, self.variant.dispatch), chunk_slots(cfg)
        chunks = self.dispatched_chunks()
        out = []
        for (x, e, _), c in zip(chunks, self.numbered([e * per_expert + j for _, e, j in chunks])):
            rows = int(p.chunk_rows[p.transfer_chunk[x]])
            n = parts if costs.stores_dispatch(self.variant.dispatch, int(p.transfer_link[x])) else 1
            share = -(-rows // n)
            for part in range(n):
                r0, u = min(rows, part * share), c * parts + part
                nbytes = (min(rows, r0 + share) - r0) * int(p.transfer_bytes[x]) // rows
                out.append((u, u % self.processors, x, nbytes, e))
        return sorted(out)

    def staged_shares(self) -> list[tuple[int, int, int, int, int]]:
        """The staged dispatch's shares (trace.DISPATCH_PATHS), one per chunk: the peers' chunks,
        local expert by local expert with the peers counted k = 0.. from rank + 1 on (the senders
        stagger their owners), slot (le (P - 1) + k) CH + j, numbered (numbered) u and dealt to
        processor u mod R; this GPU's own, slot le CH + j, to processor R + u mod (the other
        processors)."""
        p, cfg = self.plan, self.cfg
        r, slots, experts = self.senders(), chunk_slots(cfg), cfg.local_experts
        remote, local = [], []
        for x, e, j in self.dispatched_chunks():
            owner, le = divmod(e, experts)
            if owner == self.rank:
                local.append((le * slots + j, x))
            else:
                remote.append(((le * (cfg.ranks - 1) + (owner - self.rank - 1) % cfg.ranks) * slots + j, x))

        def dealt(chunks: list[tuple[int, int]], first: int, blocks: int) -> list[tuple[int, int, int, int, int]]:
            numbers = self.numbered([slot for slot, _ in chunks])
            return sorted((u, first + u % blocks, x, int(p.transfer_bytes[x]), slot // slots)
                          for u, (slot, x) in zip(numbers, chunks))

        return dealt(remote, 0, r) + dealt(local, r, self.processors - r)

    def arrive(self, x: int) -> None:
        """Transfer `x`'s signal has landed here: a subscriber warp takes its chunk once its pass
        sees it (`seen_ns`). A dispatched tile lands with its last chunk and its tasks are queued; a
        returned chunk is combined."""
        ph = self.phases
        c, t = ph.transfer_chunk[x], ph.transfer_tile[x]
        free, warp = self.subscribers[0]
        start = max(self.env.now + self.seen_ns, free)
        end = start + self.hw.subscriber_ns
        heapq.heapreplace(self.subscribers, (end, warp))
        self.rec.append((self.rank, self.node, warp, SUBSCRIBER, SIGNAL, start, end, ph.tile_expert[t], t,
                         ph.transfer_src[x], 0))  # the engine packs the rows
        wake = end + self.hw.wake_ns - self.env.now
        if ph.transfer_kind[x] == RETURN:
            self.env.call_in(wake, self.enqueue_combine, c)
            return
        self.chunks_left[t] -= 1
        if not self.chunks_left[t]:
            self.land(t, wake)

    def land(self, t: int, wake: float) -> None:
        """Tile `t` has all its rows here: its GEMM0 tasks are queued `wake` from now (with the
        rest of its expert's tiles where the queue policy gathers them)."""
        if self.variant.queue in costs.BY_EXPERT:
            # the expert's tiles wait for its last, then go into the queue together, written by one thread
            tiles = self.expert_complete(self.expert_waiting, t)
            if tiles:
                self.env.call_in(wake + self.enqueue_ns(tiles, GEMM0), self.enqueue_expert, tiles, GEMM0)
        else:
            self.env.call_in(wake, self.enqueue, t, GEMM0)

    def enqueue(self, t: int, kind: int) -> None:
        """Hand tile `t`'s tasks of one GEMM phase to the scheduler."""
        self.hand_out(kind, [(t, task) for task in self.phases.tasks[t][kind]])

    def enqueue_combine(self, c: int) -> None:
        """Hand chunk `c`'s combine task to the scheduler."""
        self.hand_out(COMBINE, [(c, int(self.phases.combine[c]))])

    def expert_complete(self, gathered: dict[int, list[int]], t: int) -> list[int] | None:
        """Tile `t` counted in with its expert's in `gathered`: all of the expert's tiles here, in
        order, once `t` is the last of them; else None."""
        e = self.phases.tile_expert[t]
        tiles = gathered.setdefault(e, [])
        tiles.append(t)
        return sorted(tiles) if len(tiles) == self.expert_tiles[e] else None

    def enqueue_ns(self, tiles: list[int], kind: int) -> float:
        """The time one thread takes to queue the tasks of phase `kind` of an expert's `tiles` together."""
        return costs.enqueue_ns(self.hw, self.cfg, sum(len(self.phases.tasks[t][kind]) for t in tiles))

    def enqueue_expert(self, tiles: list[int], kind: int) -> None:
        """An expert's tiles' tasks of one GEMM phase, column block by column block (os.cuh
        enqueue_expert)."""
        per_tile = [self.phases.tasks[t][kind] for t in tiles]
        self.hand_out(kind, [(t, int(tasks[c])) for c in range(max(map(len, per_tile)))
                             for t, tasks in zip(tiles, per_tile) if c < len(tasks)])

    def hand_out(self, kind: int, order: list[tuple[int, int]]) -> None:
        """Hand (unit, task) pairs of one phase to the scheduler in queue order, a unit being a
        tile (GEMM0, GEMM1) or a chunk (combine); each unit goes on when its last task ends."""
        # a GEMM1 task stores its share of every chunk home: the bytes for NVLink peers take it their
        # stores at the block's rate and go through this GPU's port, shared with the flows in it (none
        # across nodes: the tile's last task hands those chunks to a NIC)
        own = self.durations
        left: dict[int, list[float]] = {}  # unit -> [its tasks not ended, its last end]
        for u, _ in order:
            left.setdefault(u, [0, 0.0])[0] += 1
        add, env = self.task_rows.add, self.env
        now = env.now

        def done(unit_task: tuple[int, int], lane: int, start: float, end: float) -> None:
            u, task = unit_task
            add((lane, start, end, task))
            unit = left[u]
            unit[0] -= 1
            if end > unit[1]:
                unit[1] = end
            if not unit[0]:
                # an end a rounding error before now is now
                env.call_in(max(unit[1] - env.now, 0.0), self.phase_done, u, kind)

        if kind == GEMM1:
            peer = {u: self.peer_bytes(u) for u in left}
            store = {u: costs.store_ns(self.hw, NVLINK, b) for u, b in peer.items()}
            tasks = [(now, own[ut[1]], store[ut[0]], peer[ut[0]], done, ut) for ut in order]
        else:
            tasks = [(now, own[ut[1]], 0.0, 0.0, done, ut) for ut in order]
        self.scheduler.enqueue(tasks)

    def peer_bytes(self, t: int) -> float:
        """The bytes a GEMM1 task of tile `t` stores into NVLink peers: its column block of each
        chunk whose source is one."""
        ph = self.phases
        share, link, nbytes = len(ph.tasks[t][GEMM1]), ph.transfer_link, ph.transfer_bytes
        return sum(nbytes[x] / share for x in ph.returns[t] if link[x] == NVLINK)

    def phase_done(self, u: int, kind: int) -> None:
        """Unit `u` (a tile, or a chunk for the combine) finished its phase `kind`."""
        self.phases_left -= 1
        if kind == GEMM0 and self.variant.queue == "expert-both":
            # the processor ending the expert's last tile's GEMM0 queues every tile's GEMM1 tasks
            tiles = self.expert_complete(self.expert_gemm0_done, u)
            queued = self.enqueue_ns(tiles, GEMM1) if tiles else 0.0
            if queued:
                self.env.call_in(queued, self.enqueue_expert, tiles, GEMM1)
            elif tiles:  # a preset that does not model it: at once, in this event
                self.enqueue_expert(tiles, GEMM1)
        elif kind == GEMM0:
            self.enqueue(u, GEMM1)
        elif kind == GEMM1:  # every chunk goes home: stored by the tasks, or put through the NIC
            for x in self.phases.returns[u]:
                self.send(x, stored=self.phases.transfer_link[x] != NETWORK)
        else:
            self.on_chunk_done(u)
        if not self.phases_left:
            self.final_combine(self.env.now + self.hw.stop_ns)

    def final_combine(self, start: float) -> None:
        """Every processor sums its share of this GPU's tokens (costs.reduce_block_ns, when the preset
        models it), each token's kept rows: the routed ones that came back (a dropped choice is
        skipped) and its shared experts'."""
        p, cfg = self.plan, self.cfg
        routed = (p.chunk_src == self.rank) & (p.tile_expert[p.chunk_tile] < cfg.experts)
        rows = int(p.chunk_rows[routed].sum()) / cfg.tokens + cfg.shared_experts
        for lane, d in enumerate(costs.reduce_block_ns(self.hw, cfg, self.processors, rows)):
            if d > 0:
                self.rec.add(self.rank, self.node, lane, "processor", "combine", start, start + d)
