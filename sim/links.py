"""A link whose bandwidth is shared equally by the transfers on it (an NVLink port, a NIC).

Processor sharing, computed exactly with virtual time: `served` counts the bytes each transfer
in flight has received so far; it grows at bandwidth / n while n transfers share the link, so a
transfer of b bytes that starts when `served` is s leaves when `served` reaches s + b. One timer
is pending at a time, for the transfer that leaves first or the next one announced to come
(transfer_at); an arrival or a departure re-arms it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import simpy

from .clock import Clock

# departures within this many virtual bytes of each other leave together (float round-off)
_EPS_BYTES = 1e-6


class SharedLink:
    def __init__(self, env: Clock, gbps: float):
        self.env, self.rate = env, gbps  # bytes per ns
        self.served = 0.0
        self.updated = 0.0
        # (served at departure, seq, its event or callback)
        self.flows: list[tuple[float, int, simpy.Event | Callable[[], None]]] = []
        self.joins: list[tuple[float, int, float, Callable[[], None]]] = []  # (time, seq, bytes, then) to come
        self.seq = 0
        self.armed = 0  # generation of the pending timer; older timers are stale
        self.armed_at = math.inf  # when the pending timer fires

    def transfer(self, nbytes: float) -> simpy.Event:
        """An event that succeeds when the last of `nbytes` has left the link."""
        self._advance()
        done = self.env.event()
        self._enter(nbytes, done)
        self._arm()
        return done

    def transfer_at(self, at: float, nbytes: float, then: Callable[[], None]) -> None:
        """`nbytes` that enter the link at time `at` (now or later); `then()` is called when the last
        has left. The link's one timer serves these arrivals and departures: no event of their own."""
        heapq.heappush(self.joins, (at, self.seq, nbytes, then))
        self.seq += 1
        if at <= self.env.now:
            self._advance()
            self._admit()
        self._arm()

    def _enter(self, nbytes: float, done) -> None:
        heapq.heappush(self.flows, (self.served + nbytes, self.seq, done))
        self.seq += 1

    def _admit(self) -> None:
        while self.joins and self.joins[0][0] <= self.env.now:
            _, _, nbytes, then = heapq.heappop(self.joins)
            self._enter(nbytes, then)

    def _advance(self) -> None:
        if self.flows:
            self.served += (self.env.now - self.updated) * self.rate / len(self.flows)
        self.updated = self.env.now

    def _arm(self) -> None:
        at = math.inf
        if self.flows:
            at = self.env.now + max(0.0, (self.flows[0][0] - self.served) * len(self.flows) / self.rate)
        if self.joins:
            at = min(at, self.joins[0][0])
        if at == self.armed_at or at == math.inf:
            return  # the pending timer serves it (or nothing is left)
        self.armed += 1
        self.armed_at = at
        self.env.call_in(at - self.env.now, self._depart, self.armed)

    def _depart(self, generation: int) -> None:
        if generation != self.armed:
            return
        self.armed_at = math.inf
        self._advance()
        done = []
        while self.flows and self.flows[0][0] <= self.served + _EPS_BYTES:
            done.append(heapq.heappop(self.flows)[2])
        self._admit()
        self._arm()
        for d in done:
            if isinstance(d, simpy.Event):
                d.succeed()
            else:
                d()
