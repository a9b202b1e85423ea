"""The kernel variant a simulation runs: how the kernel build moves, queues and routes a layer's rows.

One record of the choices a kernel build made that the simulator follows, so that a measured run's
prediction runs the kernel that was measured: `simulate` takes them field by field and records them
in its trace's meta; a measured trace's meta holds its kernel's (`Variant.recorded`: a run from
before a choice was recorded measured the kernel of then, each field's value for it named there).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from reference.config import is_positive_int

from . import costs
from .hardware import Hardware
from .trace import DISPATCH_PATHS


@dataclass(frozen=True)
class Variant:
    dispatch: str  # how dispatched rows move (trace.DISPATCH_PATHS)
    queue: str  # when a tile's GEMM tasks are queued (costs.QUEUE_POLICIES)
    staged_blocks: int = costs.STAGED_BLOCKS  # the processors that send the peers' chunks on the staged path
    deal: str = "chunks"  # how the dispatch's shares are dealt to blocks (costs.DISPATCH_DEALS)
    share_fences: int = 1  # fences before the signal of a chunk stored into a peer as one share (costs.SHARE_FENCES)
    select: str = "lists"  # how the gate selects top-k (costs.GATE_SELECTS)

    @classmethod
    def recorded(cls, meta: dict) -> Variant:
        """A measured trace's kernel: runs that recorded no "deal" dealt chunk slots, no
        "share_fences" fenced a one-share chunk twice, no "select" made one pass per choice."""
        return cls(str(meta["dispatch"]), str(meta["queue"]), int(meta["staged_blocks"]),
                   str(meta.get("deal", "slots")), int(meta.get("share_fences", 2)),
                   str(meta.get("select", costs.UNRECORDED_SELECT)))

    def fields(self) -> dict:
        """The variant as `simulate`'s keyword arguments (and its trace's meta keys)."""
        return asdict(self)

    def invalid(self, hw: Hardware) -> tuple[str, object, str] | None:
        """(field, value, what is allowed) of the first field the kernel cannot run with on `hw`'s
        processor blocks, or None."""
        if self.dispatch not in DISPATCH_PATHS:
            return "dispatch", self.dispatch, "one of " + ", ".join(DISPATCH_PATHS)
        if not is_positive_int(self.staged_blocks):
            return "staged_blocks", self.staged_blocks, "a positive number of processors"
        if self.staged_blocks > hw.processors - 1:  # the kernel keeps a block for this GPU's own chunks
            return ("staged_blocks", self.staged_blocks, f"at most {hw.processors - 1} on {hw.name} (its "
                    f"{hw.processors} processor blocks but one, which stores this GPU's own chunks)")
        if self.queue not in costs.QUEUE_POLICIES:
            return "queue", self.queue, "one of " + ", ".join(costs.QUEUE_POLICIES)
        if self.deal not in costs.DISPATCH_DEALS:
            return "deal", self.deal, "one of " + ", ".join(costs.DISPATCH_DEALS)
        if self.share_fences not in costs.SHARE_FENCES:
            return "share_fences", self.share_fences, "one of " + ", ".join(map(str, costs.SHARE_FENCES))
        if self.select not in costs.GATE_SELECTS:
            return "select", self.select, "one of " + ", ".join(costs.GATE_SELECTS)
        return None
