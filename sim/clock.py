"""`Clock`: the simulator's SimPy environment, and its plain timed callbacks.

Every part of the simulated kernel and fabric schedules its next step with `call_in(delay, fn,
*args)`: a call at a time, in SimPy's own queue and order (the place a `Timeout` made at that
moment would take), without a `Timeout` object, its callbacks list and a closure each; a large run
schedules millions. SimPy's events and processes (the baseline's, a NIC's completions) run in the
same queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy
from simpy.events import NORMAL


class Clock(simpy.Environment):
    """A SimPy environment with `call_in`; `now` is a plain attribute (the simulator reads it
    millions of times); it counts the events it processes (for the speed table), calls `tick()`
    every `TICK` of them (the trace builder packs its rows there) and reports every `REPORT_EVERY`,
    so that a long run shows it is moving; `run` takes the schedule to its end in one loop (SimPy's
    step, without its per-event calls)."""

    TICK = 1 << 14
    REPORT_EVERY = 1 << 18  # a multiple of TICK
    now = 0.0  # shadows SimPy's property: the instance's own attribute, kept equal to `_now`

    def __init__(self, say: Callable[[str], None] = lambda _: None, tick: Callable[[], None] = lambda: None):
        super().__init__()
        self.now = self._now
        self.events, self.say, self.tick = 0, say, tick
        # SimPy binds its event constructors (timeout, event, ...) to an environment of its own class
        # only: bound here too, `env.timeout` is not a new method object each call
        for name in ("process", "timeout", "event", "all_of", "any_of"):
            setattr(self, name, getattr(self, name))

    def call_in(self, delay: float, fn: Callable[..., None], *args) -> None:
        """Call `fn(*args)` `delay` from now."""
        if delay < 0:
            raise ValueError(f"a call {delay} ns in the past: a delay is at least 0")
        heapq.heappush(self._queue, (self.now + delay, NORMAL, next(self._eid), (fn, args)))

    def run(self, until=None) -> None:
        if until is not None:
            raise ValueError("the layer's simulation runs to the end of its schedule: no `until`")
        queue, pop, tick, mask = self._queue, heapq.heappop, self.tick, self.TICK - 1
        while queue:
            now, _, _, event = pop(queue)
            self._now = self.now = now
            if event.__class__ is tuple:
                fn, args = event
                fn(*args)
            else:
                callbacks, event.callbacks = event.callbacks, None
                for callback in callbacks:
                    callback(event)
                if not event._ok and not hasattr(event, "_defused"):
                    raise event._value  # a failed event nobody handled (as SimPy's step raises it)
            self.events += 1
            if not self.events & mask:
                tick()
                if not self.events % self.REPORT_EVERY:
                    self.say(f"{self.events:,} events, simulated time {now / 1e3:,.1f} µs")
