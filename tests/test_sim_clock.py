"""The simulator's clock: plain timed calls keep SimPy's order, beside SimPy's own events."""

from __future__ import annotations

import random

import pytest

from sim.clock import Clock


def test_calls_and_timeouts_run_in_time_then_scheduling_order():
    rng = random.Random()
    env, ran = Clock(), []
    delays = [rng.choice([0.0, 1.5, 2.0, 2.0, 7.25]) for _ in range(40)]
    for i, d in enumerate(delays):
        if i % 2:
            env.call_in(d, lambda i=i: ran.append((env.now, i)))
        else:
            env.timeout(d).callbacks.append(lambda _, i=i: ran.append((env.now, i)))
    env.run()
    # a stable sort by time: ties in the order they were scheduled, calls and timeouts alike
    assert ran == sorted(((d, i) for i, d in enumerate(delays)), key=lambda p: p[0])
    assert env.events == len(delays) and env.now == max(delays)


def test_a_call_schedules_the_next_and_processes_run_beside_it():
    env, seen = Clock(), []

    def step(n: int) -> None:
        seen.append(("call", env.now))
        if n:
            env.call_in(3.0, step, n - 1)

    def proc():
        yield env.timeout(4.0)
        seen.append(("process", env.now))

    env.call_in(1.0, step, 2)
    env.process(proc())
    env.run()
    assert seen == [("call", 1.0), ("process", 4.0), ("call", 4.0), ("call", 7.0)]


def test_a_call_in_the_past_is_refused():
    with pytest.raises(ValueError, match="at least 0"):
        Clock().call_in(-1.0, lambda: None)


def test_run_takes_no_until():
    with pytest.raises(ValueError, match="no `until`"):
        Clock().run(until=5)
