"""The routing of a config as tables: tokens per expert, dropped tokens, bytes between GPUs.

Everything comes from `reference` (the routing and the tile plan), so the Golden page shows the
same numbers the golden forward, the simulator and the kernel use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import reference
from reference import Config
from reference.plan import LINKS


@dataclass(frozen=True)
class RoutingTables:
    kept: np.ndarray  # (E + S,) rows each expert receives from all GPUs (shared experts last)
    dropped: np.ndarray  # (E,) assignments to each expert dropped by capacity
    capacity: int | None  # slots per (source GPU, expert)
    bytes_between: np.ndarray  # (P, P) bytes GPU src sends GPU dst, dispatch and combine
    link: np.ndarray  # (P, P) index into reference.plan.LINKS
    summary: dict  # the tile plan's summary, plus dropped assignments


def routing_tables(cfg: Config) -> RoutingTables:
    r = reference.route_config(cfg)
    tp = reference.plan.build(cfg, r)
    dropped = np.bincount(r.expert[~r.kept], minlength=cfg.experts)
    p = cfg.ranks
    between = np.zeros((p, p), np.int64)
    np.add.at(between, (tp.transfer_src, tp.transfer_dst), tp.transfer_bytes)
    gpu = np.arange(p)
    link = reference.plan.link_class(cfg, gpu[:, None], gpu[None, :])
    summary = {**tp.summary(), "dropped": int(dropped.sum()),
               "assignments": int(r.expert.size)}
    return RoutingTables(tp.send_counts.sum(axis=0), dropped, cfg.capacity, between, link, summary)


def link_names(link: np.ndarray) -> np.ndarray:
    return np.array(LINKS, dtype=object)[link]
