"""The dispatch's stores through the NVLink ports: every GPU's way out and way in, each shared by the
flows through it, for all GPUs' processor blocks at once.

A block moves its shares one after another (`Move`s), each after its walk to it (`lead_ns`). A move
stores `nbytes` into a peer at the block's own rate (`ns_per_byte`) or, where its flows are more, at
its equal part of the busier of the two ports on its way (`gbps` / the flows in the source's way out
or the destination's way in), then waits `fixed_ns` (its fence's round trip, the task's overhead); a
move without bytes (into the block's own GPU) takes `fixed_ns` alone. The rates change when a flow
starts or ends at one of a flow's ports, so the many senders storing into the GPU that owns the hot
experts share its way in, whichever GPU they are on. No port passes more than `gbps`: its flows'
rates are each at most `gbps` / their count.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple


class Move(NamedTuple):
    fixed_ns: float  # after its bytes (or alone, without bytes)
    nbytes: float  # through the ports (0: none)
    ns_per_byte: float  # the block's own rate alone
    way_out: int  # port ids: any hashable numbering, distinct for every port direction
    way_in: int
    lead_ns: float = 0.0  # before it: the block's walk to it (its deal's count loads)


def move_times(lanes: list[list[Move]], start: list[float], gbps: float) -> list[list[tuple[float, float]]]:
    """(start, end) of every move of each lane (one block's moves in order, from `start[lane]`)."""
    times: list[list[tuple[float, float]]] = [[] for _ in lanes]
    at: dict[tuple[str, int], set[int]] = {}  # port -> its flows
    flows: dict[int, _Flow] = {}
    events: list[tuple[float, int, int, int]] = []  # (time, seq, lane or flow, flow's version; -1: a lane's next move)
    seq = 0

    def push(t: float, who: int, version: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, who, version))
        seq += 1

    def rerate(port: tuple[str, int], now: float) -> None:
        for f in at[port]:
            flow = flows[f]
            flow.left -= flow.rate * (now - flow.since)
            flow.since, flow.version = now, flow.version + 1
            flow.rate = min(flow.cap, *(gbps / len(at[p]) for p in flow.ports))
            push(now + max(flow.left, 0.0) / flow.rate, f, flow.version)

    def next_move(lane: int, t: float) -> None:
        if len(times[lane]) < len(lanes[lane]):
            push(t + lanes[lane][len(times[lane])].lead_ns, lane, -1)

    for lane, t in enumerate(start):
        next_move(lane, t)
    while events:
        now, f, who, version = heapq.heappop(events)
        if version < 0:  # lane `who` begins its next move
            move = lanes[who][len(times[who])]
            if not move.nbytes:
                times[who].append((now, now + move.fixed_ns))
                next_move(who, now + move.fixed_ns)
                continue
            flow = _Flow(move, who, now)
            flows[f] = flow  # its id: the event's sequence number, never reused
            times[who].append((now, now))  # its end is known when its bytes are through
            for p in flow.ports:
                at.setdefault(p, set()).add(f)
            for p in flow.ports:
                rerate(p, now)
            continue
        flow = flows.get(who)
        if flow is None or flow.version != version:
            continue  # rerated since
        del flows[who]
        for p in flow.ports:
            at[p].discard(who)
        for p in flow.ports:
            rerate(p, now)
        end = now + flow.move.fixed_ns
        times[flow.lane][-1] = (times[flow.lane][-1][0], end)
        next_move(flow.lane, end)
    return times


class _Flow:
    """A move's bytes in flight: `left` of them at `rate` since `since`."""

    __slots__ = ("move", "lane", "ports", "cap", "left", "rate", "since", "version")

    def __init__(self, move: Move, lane: int, now: float):
        self.move, self.lane = move, lane
        self.ports = (("out", move.way_out), ("in", move.way_in))
        self.cap = 1.0 / move.ns_per_byte if move.ns_per_byte > 0 else float("inf")
        self.left, self.rate, self.since, self.version = float(move.nbytes), 0.0, now, 0
