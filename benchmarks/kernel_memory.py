"""Device memory the megakernel's layer takes on each GPU, for every zoo model at 1K, 4K and 16K
tokens per GPU on its 4 GPUs (gpu.layout: the NVSHMEM heap, the working buffers, the weight copies
and the inputs), and whether it fits an H100's 80 GB.

    python benchmarks/kernel_memory.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu import layout  # noqa: E402
from reference import presets  # noqa: E402
from reference.cli import format_table  # noqa: E402

TOKENS = (1024, 4096, 16384)
H100_BYTES = 80e9


def rows() -> list[list[str]]:
    out = []
    for name, base in presets.ZOO.items():
        for t in TOKENS:
            cfg = base.replace(tokens=t)
            s = layout.Sizes.of(cfg)
            total = layout.layer_bytes(cfg) + layout.input_bytes(cfg)
            out.append([name, f"{t // 1024}K", f"{s.symmetric_bytes / 1e9:.2f}", f"{s.working_bytes / 1e9:.2f}",
                        f"{(layout.weight_copy_bytes(cfg) + layout.input_bytes(cfg)) / 1e9:.2f}",
                        f"{total / 1e9:.2f}", "yes" if total <= H100_BYTES else "no"])
    return out


def main() -> int:
    head = ["layer", "tokens/GPU", "heap GB", "buffers GB", "weights+inputs GB", "total GB", "fits 80 GB"]
    print(format_table(head, rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
