"""The bulk-synchronous baseline of the same layer, as Megatron-style expert parallelism runs it.

Every GPU runs separate kernels, each after a launch gap and each on all SMs: the gate, the
permutation of its tokens into per-expert buffers, an all-to-all dispatch (NCCL-like: every
(source, expert) block padded to the capacity, all pairs at once at the bandwidth an all-to-all
reaches, finished when every transfer has landed), the grouped GEMM0 and GEMM1 of its experts
over the padded rows, an all-to-all combine of the padded results, and the combine kernel that
un-permutes, weights and sums each token's k rows. Nothing overlaps. Without a capacity factor the padding
is the largest (source, expert) block, as a dropless all-to-all must size its buffers.
"""

from __future__ import annotations

import simpy

from reference import Config, TilePlan
from reference.plan import NETWORK, NVLINK, link_class
from reference.weights import ffn_in_width

from . import costs
from .clock import Clock
from .hardware import Hardware
from .links import SharedLink
from .trace import TraceBuilder


def padded_rows(cfg: Config, plan: TilePlan) -> int:
    """Rows every (source rank, routed expert) block is padded to."""
    return cfg.capacity if cfg.capacity is not None else int(plan.send_counts[:, : cfg.experts].max())


class Baseline:
    def __init__(self, env: Clock, cfg: Config, plan: TilePlan, hw: Hardware, rec: TraceBuilder):
        self.env, self.cfg, self.plan, self.hw, self.rec = env, cfg, plan, hw, rec
        self.pad = padded_rows(cfg, plan)
        self.nvlink = [SharedLink(env, min(hw.alltoall_gbps, hw.nvlink_gbps)) for _ in range(cfg.ranks)]
        self.nic = [SharedLink(env, min(hw.nic_gbps, hw.pcie_gbps)) for _ in range(cfg.ranks)]
        self.barriers: dict[str, tuple[simpy.Event, int]] = {}

    def start(self) -> None:
        for r in range(self.cfg.ranks):
            self.env.process(self.gpu(r))

    def gpu(self, r: int):
        """One GPU's layer call: kernels and collectives one after the other."""
        cfg, hw = self.cfg, self.hw
        nb, widen = cfg.dtype_bytes, ffn_in_width(cfg) // cfg.ffn
        rows = cfg.ranks * self.pad * cfg.local_experts + cfg.tokens * cfg.shared_experts
        experts_here = cfg.local_experts + cfg.shared_experts
        i0, h = cfg.ffn * widen, cfg.hidden
        picks = cfg.tokens * (cfg.top_k + cfg.shared_experts)
        yield from self.kernel(r, "gate", costs.gate_roofline_ns(hw, cfg))
        yield from self.kernel(r, "dispatch", costs.kernel_ns(hw, cfg, 0.0, 2.0 * nb * picks * h, gemm=False))
        yield from self.all_to_all(r, "dispatch")
        yield from self.kernel(r, "gemm0", costs.kernel_ns(
            hw, cfg, 2.0 * rows * h * i0, nb * (rows * h + experts_here * h * i0 + rows * i0), gemm=True))
        yield from self.kernel(r, "gemm1", costs.kernel_ns(
            hw, cfg, 2.0 * rows * cfg.ffn * h, nb * (rows * cfg.ffn + experts_here * cfg.ffn * h + rows * h),
            gemm=True))
        yield from self.all_to_all(r, "combine")
        yield from self.kernel(r, "combine", costs.kernel_ns(
            hw, cfg, 2.0 * picks * h, nb * (picks * h + cfg.tokens * h), gemm=False))

    def kernel(self, r: int, kind: str, duration: float):
        """A launch gap, then a kernel on every SM."""
        yield self.env.timeout(self.hw.kernel_launch_ns)
        start = self.env.now
        yield self.env.timeout(duration)
        node = self.cfg.node_of(r)
        for sm in range(self.hw.sms):
            self.rec.add(r, node, sm, "processor", kind, start, self.env.now)

    def all_to_all(self, r: int, phase: str):
        """Launch, wait for every GPU (the collective is synchronous), then send the padded
        blocks of this GPU's tokens for each peer's experts; done when every GPU's have landed."""
        yield self.env.timeout(self.hw.kernel_launch_ns)
        yield self.barrier(phase)
        yield self.env.timeout(self.hw.collective_latency_ns)
        yield self.env.all_of([self.env.process(self.put(r, peer)) for peer in range(self.cfg.ranks)])
        yield self.barrier(phase + " landed")

    def barrier(self, key: str) -> simpy.Event:
        """An event that succeeds once every GPU has reached barrier `key`."""
        event, left = self.barriers.get(key, (self.env.event(), self.cfg.ranks))
        self.barriers[key] = (event, left - 1)
        if left == 1:
            event.succeed()
        return event

    def put(self, r: int, peer: int):
        cfg = self.cfg
        nbytes = cfg.local_experts * self.pad * cfg.hidden * cfg.dtype_bytes
        link = int(link_class(cfg, r, peer))
        start = self.env.now
        if link == NVLINK:
            yield self.nvlink[r].transfer(nbytes)
            yield self.env.timeout(self.hw.nvlink_latency_ns)
        elif link == NETWORK:
            yield self.nic[r].transfer(nbytes)
            yield self.env.timeout(self.hw.nic_latency_ns)
        role, lane = ("nic", 0) if link == NETWORK else ("link", peer)
        self.rec.add(r, cfg.node_of(r), lane, role, "put", start, self.env.now, peer=peer, nbytes=nbytes)
