"""How a chunk moves between GPUs: local copies, NVLink puts, and the NIC path with its fence schemes.

A chunk is the rows of one source rank in one tile (reference.plan): each goes to the tile's owner
and back as a transfer of its own; trace rows name the chunk's tile.

Inside a node a put-with-signal is one NVLink transfer: it shares the source GPU's NVLink port
with the other puts in flight, then pays the NVLink latency; its flag lands with its data.
Across nodes every GPU has a NIC (bandwidth shared by its writes in flight). A write lands at
the peer one NIC latency after it leaves, and its completion comes back one latency later. The
signal that tells the peer a chunk has landed must not overtake the chunk; the transports differ
in how they guarantee that:

- `ibgda`: a GPU thread posts the write and the signal to the NIC itself, on the queue pair to the
  peer that the GPU's blocks share under a lock (NVSHMEM's nvshmemi_ibgda_put_signal), so one
  peer's posts queue; the signal carries a fence flag, so the NIC sends it once the earlier
  writes to that peer have completed.
- `ibrc`: a CPU proxy thread per GPU takes requests from a ring in host memory. For every chunk
  it posts the write, then fences (it blocks until all of its writes in flight have completed:
  the NIC pipeline drains), then posts the signal.
- `decoupled` (Perseus): the proxy posts every write as its request comes; the signals are
  batched per destination: once the last chunk of a destination batch (this GPU's chunks for one
  peer in one phase, dispatch or return) is written, one fence and one signal cover them all.
- `nic_order` (Perseus): per chunk, the proxy posts the write and a signal with a fence flag; the
  NIC does the ordering and the proxy never blocks.
- `perseus`: both: one flagged signal per destination batch, and the proxy never blocks.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from functools import partial

import numpy as np
import simpy

from reference import Config, TilePlan
from reference.plan import LOCAL, NETWORK, NVLINK

from .clock import Clock
from .hardware import Hardware
from .kernel import TilePhases
from .links import SharedLink
from .trace import KIND, ROLE, TraceBuilder

TRANSPORTS = ("ibgda", "ibrc", "decoupled", "nic_order", "perseus")
PROXY_TRANSPORTS = ("ibrc", "decoupled", "nic_order", "perseus")
BATCHED = ("decoupled", "perseus")  # one signal per destination batch
NIC_ORDERED = ("ibgda", "nic_order", "perseus")  # signals carry a fence flag

Deliver = Callable[[int, list[int]], None]  # (destination rank, transfer ids) when a signal lands
# the trace codes of the rows written per transfer (appended as whole rows: the engine packs them)
NIC, PROXY, LINK = ROLE["nic"], ROLE["proxy"], ROLE["link"]
PUT, FENCE, SIGNAL = KIND["put"], KIND["fence"], KIND["signal"]


class Nic:
    """One GPU's NIC: writes share its bandwidth; it tracks which writes have not completed."""

    def __init__(self, env: Clock, hw: Hardware, rank: int, node: int, rec: TraceBuilder):
        self.env, self.hw, self.rank, self.node, self.rec = env, hw, rank, node, rec
        # the NIC reads GPU memory over PCIe (GPUDirect RDMA): the slower of the two bounds it
        self.link = SharedLink(env, min(hw.nic_gbps, hw.pcie_gbps))
        # per peer, and for all peers, in posting order: the completions not yet seen (a write
        # leaves as it completes)
        self.inflight: dict[int, dict[simpy.Event, None]] = {}
        self.posted: dict[simpy.Event, None] = {}

    def write(self, peer: int, tile: int, nbytes: int, expert: int) -> simpy.Event:
        """Post an RDMA write; the event is its completion (the sender's view)."""
        done = self.env.event()
        done.callbacks.append(lambda _: self._completed(peer, done))  # first: gone from pending() as it fires
        self.inflight.setdefault(peer, {})[done] = None
        self.posted[done] = None
        self.link.transfer_at(self.env.now, nbytes, partial(self._sent, peer, tile, nbytes, expert, self.env.now, done))
        return done

    def _sent(self, peer, tile, nbytes, expert, posted, done) -> None:
        """The write's last byte has left the NIC: it lands a latency later, its completion comes back
        one more after that (one scheduled event, no process of its own)."""
        lands = self.env.now + self.hw.nic_latency_ns
        self.rec.append((self.rank, self.node, 0, NIC, PUT, posted, lands, expert, tile, peer, nbytes))
        done._ok, done._value = True, None  # succeed `done` at a delay, as simpy.Timeout does
        self.env.schedule(done, delay=2 * self.hw.nic_latency_ns)

    def _completed(self, peer: int, done: simpy.Event) -> None:
        del self.inflight[peer][done]
        del self.posted[done]

    def pending(self, peer: int | None = None) -> list[simpy.Event]:
        """Writes (to `peer`, or to anyone) posted so far that have not completed."""
        return list(self.inflight.get(peer, ()) if peer is not None else self.posted)

    def drained(self, peer: int | None = None) -> simpy.Event:
        """An event that fires once the writes pending now (to `peer`, or to anyone) have completed."""
        pending = self.pending(peer)
        return pending[0] if len(pending) == 1 else self.env.all_of(pending)

    def signal(self, peer: int, tile: int, flagged: bool, then: Callable[[], None]) -> None:
        """Send a signal (a small RDMA atomic); with a fence flag the NIC first waits until the
        earlier writes to `peer` have completed. `then()` is called when the signal has landed."""
        if flagged:
            start = self.env.now
            self.drained(peer).callbacks.append(lambda _: self._send_signal(peer, tile, start, then))
        else:
            self._send_signal(peer, tile, None, then)

    def _send_signal(self, peer: int, tile: int, fenced_from: float | None, then: Callable[[], None]) -> None:
        sent, lands = self.env.now, self.env.now + self.hw.nic_latency_ns
        if fenced_from is not None:
            self.rec.append((self.rank, self.node, 0, NIC, FENCE, fenced_from, sent, -1, tile, peer, 0))
        self.rec.append((self.rank, self.node, 0, NIC, SIGNAL, sent, lands, -1, tile, peer, 0))
        self.env.call_in(self.hw.nic_latency_ns, then)


class Proxy:
    """The CPU proxy thread of one GPU: takes requests from its ring and drives the NIC, one request
    at a time (each step a callback: the thread's story without a SimPy process to resume)."""

    def __init__(self, env, hw: Hardware, transport: str, nic: Nic, fabric: Fabric, batch_size: Counter):
        """`batch_size`: the chunks of each of this GPU's destination batches, by (peer, phase)."""
        self.env, self.hw, self.transport, self.nic, self.fabric = env, hw, transport, nic, fabric
        self.ring: deque[tuple[float, int]] = deque()  # (when it lands, transfer): landing in order
        self.busy = False  # posting, fencing, or waiting for the ring's first request to land
        self.batch_size = batch_size
        self.batches: dict[tuple[int, int], list[int]] = {}

    def request(self, x: int) -> None:
        """The GPU writes a request into the ring; it lands after a PCIe latency (the thread finds it
        there when it next looks: an event only where it waits for it)."""
        self.ring.append((self.env.now + self.hw.pcie_latency_ns, x))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        """Take the ring's next request: post its write (one proxy op), wait for it to land, or idle."""
        self.busy = bool(self.ring)
        if not self.busy:
            return
        lands, x = self.ring[0]
        if lands > self.env.now:
            self.env.call_in(lands - self.env.now, self._next)
            return
        self.ring.popleft()
        self._op(PUT, x, self.fabric.dst[x], self.fabric.nbytes[x], self._posted)

    def _posted(self, x: int, peer: int) -> None:
        """`x`'s write is posted: the NIC has it; its signal is due now, with its batch's last, or not yet."""
        self.fabric.write(self.nic, x)
        batch = self.complete_batch(x, peer)
        if not batch:
            self._next()
        elif self.transport in NIC_ORDERED:  # a fence flag on the signal: the NIC orders it
            self._op(SIGNAL, batch[-1], peer, 0, lambda *_: self._signalled(peer, batch, True))
        else:  # a proxy fence: the thread blocks until every write it posted has completed
            start = self.env.now
            self.nic.drained().callbacks.append(lambda _: self._fence(start, peer, batch))

    def _fence(self, start: float, peer: int, batch: list[int]) -> None:
        """The writes have completed: the fence's own cost, then the signal's post."""
        fenced = self.env.now + self.hw.fence_ns
        self._row(FENCE, start, fenced, batch[-1], peer, 0)
        self._row(SIGNAL, fenced, fenced + self.hw.proxy_op_ns, batch[-1], peer, 0)
        self.env.call_in(self.hw.fence_ns + self.hw.proxy_op_ns, self._signalled, peer, batch, False)

    def _signalled(self, peer: int, batch: list[int], flagged: bool) -> None:
        self.fabric.signal(self.nic, peer, batch, flagged)
        self._next()

    def complete_batch(self, x: int, peer: int) -> list[int]:
        """The transfers whose signal is due once `x` is written: `x` alone, or with batching
        the whole destination batch once its last chunk is written (else none yet)."""
        if self.transport not in BATCHED:
            return [x]
        key = (peer, self.fabric.kind[x])
        batch = self.batches.setdefault(key, [])
        batch.append(x)
        return self.batches.pop(key) if len(batch) == self.batch_size[key] else []

    def _op(self, kind: int, x: int, peer: int, nbytes: int, then: Callable[[int, int], None]) -> None:
        """One proxy operation (`kind`: its trace code) on transfer `x` (`proxy_op_ns`), then `then(x, peer)`."""
        now = self.env.now
        self._row(kind, now, now + self.hw.proxy_op_ns, x, peer, nbytes)
        self.env.call_in(self.hw.proxy_op_ns, then, x, peer)

    def _row(self, kind, start, end, x, peer, nbytes):
        f = self.fabric
        t = f.tile[x]
        f.rec.append((self.nic.rank, self.nic.node, 0, PROXY, kind, start, end, f.expert[t], t, peer, nbytes))


class Fabric:
    """Every GPU's NVLink port, NIC and (for proxy transports) proxy; `send` moves one transfer."""

    def __init__(self, env: Clock, cfg: Config, plan: TilePlan, hw: Hardware, transport: str,
                 rec: TraceBuilder, deliver: Deliver, phases: TilePhases):
        """`phases`: the plan's columns as Python lists, the kernels' own (read once per event)."""
        self.env, self.cfg, self.plan, self.hw, self.transport, self.rec = env, cfg, plan, hw, transport, rec
        self.deliver = deliver
        self.link, self.src, self.dst, self.kind, self.nbytes, self.tile, self.expert = (
            phases.transfer_link, phases.transfer_src, phases.transfer_dst, phases.transfer_kind,
            phases.transfer_bytes, phases.transfer_tile, phases.tile_expert)
        ranks = range(cfg.ranks)
        self.nvlink = [SharedLink(env, hw.nvlink_gbps) for _ in ranks]
        self.nics = [Nic(env, hw, r, cfg.node_of(r), rec) for r in ranks] if cfg.nodes > 1 else []
        self.proxies = []
        if self.nics and transport in PROXY_TRANSPORTS:
            # a destination batch: one GPU's chunks for one peer in one phase (dispatch or return)
            batches = [Counter() for _ in ranks]
            net = np.flatnonzero(plan.transfer_link == NETWORK)
            for src, dst, kind in zip(*(a[net].tolist() for a in (plan.transfer_src, plan.transfer_dst,
                                                                   plan.transfer_kind))):
                batches[src][dst, kind] += 1
            self.proxies = [Proxy(env, hw, transport, nic, self, batches[nic.rank]) for nic in self.nics]
        self.qp_free: dict[tuple[int, int], float] = {}  # ibgda: when each (GPU, peer) queue pair is free

    def send(self, x: int, stored: bool = False) -> None:
        """The GPU issues transfer `x` now (a put with its signal), or, `stored`, only the signal of
        one whose bytes its blocks have already stored into the peer (over NVLink or locally)."""
        link, src, dst = self.link[x], self.src[x], self.dst[x]
        if link == LOCAL:
            self._link_rows(x, self.env.now)
            self.deliver(dst, [x])
        elif link == NVLINK:
            self._nvlink_put(x, stored)
        elif self.proxies:
            self.proxies[src].request(x)
        else:
            self._ibgda_put(x)

    def _nvlink_put(self, x: int, stored: bool) -> None:
        """The source's port moves the put's bytes (stored ones moved during the tasks), then its
        flag lands an NVLink latency later."""
        now = self.env.now
        if stored:
            self._nvlink_sent(x, now)
        else:
            self.nvlink[self.src[x]].transfer_at(now, self.nbytes[x], partial(self._nvlink_sent, x, now))

    def _nvlink_sent(self, x: int, start: float) -> None:
        self.env.call_in(self.hw.nvlink_latency_ns, self._nvlink_landed, x, start)

    def _nvlink_landed(self, x: int, start: float) -> None:
        self._link_rows(x, start)
        self.deliver(self.dst[x], [x])

    def _link_rows(self, x: int, start: float) -> None:
        """A put and its signal on the source's link lane to the destination (lane = peer rank)."""
        src, dst, t = self.src[x], self.dst[x], self.tile[x]
        e, node, now = self.expert[t], self.cfg.node_of(src), self.env.now
        self.rec.append((src, node, dst, LINK, PUT, start, now, e, t, dst, self.nbytes[x]))
        self.rec.append((src, node, dst, LINK, SIGNAL, now, now, e, t, dst, 0))

    def _ibgda_put(self, x: int) -> None:
        """A GPU thread takes the queue pair to the peer (its blocks share it under a lock), writes the
        put's and the signal's work requests and rings the doorbell for each: one peer's put-with-
        signals are posted one after another."""
        src, dst = self.src[x], self.dst[x]
        start = max(self.env.now, self.qp_free.get((src, dst), 0.0))
        self.qp_free[src, dst] = start + 2 * self.hw.gpu_post_ns
        self.env.call_in(start - self.env.now + self.hw.gpu_post_ns, self._ibgda_posted, x)

    def _ibgda_posted(self, x: int) -> None:
        """The put is posted: the NIC has it; the signal's post follows."""
        nic = self.nics[self.src[x]]
        self.write(nic, x)
        self.env.call_in(self.hw.gpu_post_ns, self.signal, nic, self.dst[x], [x], True)

    def write(self, nic: Nic, x: int) -> simpy.Event:
        t = self.tile[x]
        return nic.write(self.dst[x], t, self.nbytes[x], self.expert[t])

    def signal(self, nic: Nic, peer: int, xs: list[int], flagged: bool) -> None:
        """Send the signal covering transfers `xs`; deliver them when it lands."""
        nic.signal(peer, self.tile[xs[-1]], flagged, lambda: self.deliver(peer, xs))
