"""A link whose bandwidth is shared equally by the transfers on it (an NVLink port, a NIC).

Processor sharing, computed exactly with virtual time: `served` counts the bytes each transfer
in flight has received so far; it grows at bandwidth / n while n transfers share the link, so a
transfer of b bytes that starts when `served` is s leaves when `served` reaches s + b. One timer
is pending at a time, for the transfer that leaves first; an arrival or a departure re-arms it.
"""

from __future__ import annotations

import heapq

import simpy

# departures within this many virtual bytes of each other leave together (float round-off)
_EPS_BYTES = 1e-6


class SharedLink:
    def __init__(self, env: simpy.Environment, gbps: float):
        self.env, self.rate = env, gbps  # bytes per ns
        self.served = 0.0
        self.updated = 0.0
        self.flows: list[tuple[float, int, simpy.Event]] = []  # (served at departure, seq, event)
        self.seq = 0
        self.armed = 0  # generation of the pending timer; older timers are stale

    def transfer(self, nbytes: float) -> simpy.Event:
        """An event that succeeds when the last of `nbytes` has left the link."""
        self._advance()
        done = self.env.event()
        heapq.heappush(self.flows, (self.served + nbytes, self.seq, done))
        self.seq += 1
        self._arm()
        return done

    def _advance(self) -> None:
        if self.flows:
            self.served += (self.env.now - self.updated) * self.rate / len(self.flows)
        self.updated = self.env.now

    def _arm(self) -> None:
        self.armed += 1
        if self.flows:
            wait = max(0.0, (self.flows[0][0] - self.served) * len(self.flows) / self.rate)
            generation = self.armed
            self.env.timeout(wait).callbacks.append(lambda _: self._depart(generation))

    def _depart(self, generation: int) -> None:
        if generation != self.armed:
            return
        self._advance()
        while self.flows and self.flows[0][0] <= self.served + _EPS_BYTES:
            heapq.heappop(self.flows)[2].succeed()
        self._arm()
