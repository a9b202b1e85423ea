"""The scheduler's and the signals' latencies: handoff_ns, the processors' median gap between tasks
(the megakernel's telemetry on a 12K-token layer); wake_ns, assign_ns and stop_ns on a 1.5K-token
layer on one GPU (processors idle); nvlink_latency_ns, half a bare-signal round trip between two
GPUs, with the put-with-signal round trips checked against it. Each figure is one measured median
(no residual to bound); the checks print the two-GPU and round-trip figures beside the model's.

`fit_signal_seen`: signal_seen_ns and signal_seen_ns_per_entry, least squares of the in-layer
layers' median delay from a tile's last dispatch share to the subscriber's signal against the
entries the GPU's subscriber watches (one GPU); residual bound: SEEN_BOUND.

`fit_enqueue`: enqueue_ns, enqueue_source_ns and enqueue_task_ns, least squares of every in-layer
layer's enqueues of an expert's tasks (one GPU's layers and the two-GPU return layer: one and two
source ranks) against its source ranks and its tasks; wake_ns is then what the small scheduler
layer's first task waits beyond its expert's enqueue. Residual bound: ENQUEUE_BOUND."""

from __future__ import annotations

import math

import numpy as np

from reference import Config

from .common import CalibrationError, Fit, entry_world, layer_label, need, tokens_label

IDLE_NEEDS = ("first_task_ns", "assign_ns_per_task", "stop_ns")
SEEN_NAMES = ("signal_seen_ns", "signal_seen_ns_per_entry")
SEEN_BOUND = (1.1, 4.5)  # (mean, largest) over the layers' medians: at 128 entries they spread 0.8-6.5 us
ENQUEUE_NAMES = ("enqueue_ns", "enqueue_source_ns", "enqueue_task_ns")
ENQUEUE_BOUND = (0.15, 0.5)  # (mean, largest) over the layers' medians: 4-112 tasks, the most 32% under the line


def fit_signal_seen(layers: list[dict], origin: str) -> Fit:
    """The subscriber's delay in seeing a landed tile from the in-layer `layers` (signal_seen);
    files from before it: 0 (not modelled)."""
    f = Fit()
    pts = [(c, c["signal_seen"]["watched"], c["signal_seen"]["ns"]["median"]) for c in layers
           if (c.get("signal_seen") or {}).get("ns")]
    if len({w for _, w, _ in pts}) < 2:
        for name in SEEN_NAMES:
            f.set(name, 0.0, f"{origin}: the subscriber's delay in seeing a landed tile not timed (a file from "
                  "before it): not modelled")
        return f
    x = np.array([w for _, w, _ in pts], np.float64)
    y = np.array([ns for _, _, ns in pts], np.float64)
    (fixed, per), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
    if per < 0:
        fixed, per = float(y.mean()), 0.0
    how = (f"{origin}: the median delay from a tile's last dispatch share to the subscriber's signal inside the "
           f"megakernel at {tokens_label([c for c, _, _ in pts])} tokens (one GPU), least squares of time = fixed + "
           "the entries its subscriber watches (its tiles and returned chunks) x per entry")
    for name, v in zip(SEEN_NAMES, (fixed, per)):
        f.set(name, max(float(v), 0.0), how)
    for c, w, ns in pts:
        f.check(f"in layer: a landed tile's signal seen, {layer_label(c)}, {w} entries watched (ns)", ns,
                f.values["signal_seen_ns"] + w * f.values["signal_seen_ns_per_entry"])
    return f


def fit_enqueue(raw: dict, origin: str) -> Fit:
    """One thread's enqueue of an expert's tasks (os.cuh enqueue_expert) from the in-layer layers'
    `enqueues` ([tasks, ns] each, on `world` source ranks); files or builds without them: 0 (not
    modelled)."""
    f = Fit()
    layers = [(c, entry_world(raw, c)) for c in raw.get("in_layer") or [] if c.get("enqueues")]
    pts = np.array([(world, n, ns) for c, world in layers for n, ns in c["enqueues"]], np.float64)
    if not len(pts) or len(np.unique(pts[:, 0])) < 2 or len(np.unique(pts[:, 1])) < 2:
        for name in ENQUEUE_NAMES:
            f.set(name, 0.0, f"{origin}: an expert's enqueue not timed on one and two GPUs (a file from before "
                  "it, or a build that queues a tile's tasks as it lands): not modelled")
        return f
    x = np.column_stack([np.ones(len(pts)), pts[:, 0], pts[:, 1]])
    fitted, *_ = np.linalg.lstsq(x, pts[:, 2], rcond=None)
    how = (f"{origin}: the megakernel's enqueues of an expert's tasks in its in-layer layers ({len(pts)}: "
           f"{', '.join(f'{int((pts[:, 0] == w).sum())} on {int(w)} GPU(s)' for w in np.unique(pts[:, 0]))}, "
           f"{int(pts[:, 1].min())}-{int(pts[:, 1].max())} tasks), least squares of time = fixed + source ranks x "
           "per source + tasks x per task")
    for name, v in zip(ENQUEUE_NAMES, fitted):
        f.set(name, max(float(v), 0.0), how)
    for c, world in layers:
        n, ns = np.median(np.array(c["enqueues"], np.float64), axis=0)
        f.check(f"in layer: an expert's enqueue, {layer_label(c)}, {world} GPU(s), median {n:.0f} tasks (ns)", ns,
                f.values["enqueue_ns"] + world * f.values["enqueue_source_ns"] + n * f.values["enqueue_task_ns"])
    return f


def fit_latency(raw: dict, origin: str) -> Fit:
    """The NVLink latency, before the moves' fits (a share stored into the peer ends with a round trip)."""
    f = Fit()
    bare = [p for p in pings(raw) if p["bytes"] == 0]
    if bare:
        f.set("nvlink_latency_ns", bare[0]["round_trip_ns"] / 2, f"{origin}: half a bare-signal round trip")
    return f


def pings(raw: dict) -> list[dict]:
    return [p for p in raw.get("pingpong", []) if not p.get("failed")]


def check_round_trips(raw: dict, given: dict) -> Fit:
    """Put-with-signal round trips against `given`'s NVLink latency and put rate (checks only)."""
    f = Fit()
    if "nvlink_latency_ns" in given:
        for p in pings(raw):
            if p["bytes"]:
                f.check(f"put-with-signal round trip {p['bytes']} B, 1 block (ns; not fitted)", p["round_trip_ns"],
                        2 * (given["nvlink_latency_ns"] + p["bytes"] * given.get("put_nvlink_ns_per_byte", 0.0)))
    return f


def fit_scheduler(raw: dict, hw, origin: str, enqueue: dict[str, float] | None = None) -> Fit:
    s = need(raw, "scheduler", "the megakernel's task gaps")
    if not s.get("gap_ns"):
        raise CalibrationError("scheduler", sorted(s), "gap_ns")
    f = Fit()
    f.set("handoff_ns", s["gap_ns"]["median"], f"{origin}: median gap between a processor's tasks "
          f"({s['tasks']} tasks of a layer no measured run uses)")
    delay = s.get("arrival_to_first_task_ns") or {}
    if delay.get("min", -1) >= 0:  # files before the fix also matched returned tiles (negative delays)
        # printed, not fitted: even the shortest delay waits for a processor (the first tiles land
        # while every processor still dispatches), which the model times itself; taken as the
        # subscriber's turn it made the model's subscriber warps the bottleneck of every large layer
        f.check("a tile's arrival to its first task, shortest (ns; not fitted)", delay["min"],
                f.values["handoff_ns"] + hw.subscriber_ns)
    return f.merge(fit_idle(raw, s, hw, f.values["handoff_ns"], origin, enqueue or {}))


def first_enqueue_ns(config: dict, enqueue: dict[str, float]) -> float:
    """The enqueue of the small scheduler layer's first expert (`enqueue`'s figures): the tasks of a
    mean expert's tiles, the column blocks of its GEMM0 each (a gated one's gate and up columns)."""
    if not any(enqueue.values()):
        return 0.0
    cfg = Config.from_dict(config)
    rows = math.ceil(cfg.tokens * cfg.top_k / cfg.experts)
    tiles, blocks = math.ceil(rows / cfg.tile_m), math.ceil(cfg.ffn * (2 if cfg.gated else 1) / cfg.tile_n)
    return (enqueue.get("enqueue_ns", 0.0) + cfg.ranks * enqueue.get("enqueue_source_ns", 0.0)
            + tiles * blocks * enqueue.get("enqueue_task_ns", 0.0))


def fit_idle(raw: dict, s: dict, hw, handoff_ns: float, origin: str, enqueue: dict[str, float]) -> Fit:
    """The latencies around idle processors, from the small scheduler layer on one GPU (on two, the
    peer's late row counts hold back the first tasks: its figures are printed beside the model's).
    Files from before it: no wake or pace, the final combine a hand-off after the last task."""
    f = Fit()
    idle = s.get("idle_one_gpu") or (s.get("idle") if raw.get("world") == 1 else None)
    if not idle or any(k not in idle for k in IDLE_NEEDS):
        f.set("wake_ns", 0.0, f"{origin}: not measured (a file from before the small scheduler layer)")
        f.set("assign_ns", 0.0, f"{origin}: not measured (a file from before the small scheduler layer)")
        f.set("stop_ns", handoff_ns, f"{origin}: not measured: the hand-off")
        return f
    where = f"{origin}: the small scheduler layer ({idle['config']['tokens']} tokens, one GPU)"
    queued = first_enqueue_ns(idle["config"], enqueue)
    f.set("wake_ns", max(idle["first_task_ns"] - hw.subscriber_ns - queued, 0.0),
          f"{where}: its first task's start after its tile's signal, less the subscriber's turn"
          + (f" and its expert's enqueue ({queued:.0f} ns)" if queued else ""))
    f.set("assign_ns", idle["assign_ns_per_task"], f"{where}: the first round of tasks once every processor has "
          "dispatched, from first start to last over their number")
    f.set("stop_ns", idle["stop_ns"]["median"], f"{where}: median over processors of the final combine's start "
          "after the last task's end")
    other = s.get("idle") if s.get("idle_one_gpu") else None
    if other and all(k in other for k in IDLE_NEEDS):
        f.check("small layer, two GPUs: signal to first task (ns; not fitted)", other["first_task_ns"],
                f.values["wake_ns"] + hw.subscriber_ns + first_enqueue_ns(other["config"], enqueue))
        f.check("small layer, two GPUs: first round, per task (ns; not fitted)", other["assign_ns_per_task"],
                f.values["assign_ns"])
        f.check("small layer, two GPUs: last task to final combine (ns; not fitted)", other["stop_ns"]["median"],
                f.values["stop_ns"])
    return f
