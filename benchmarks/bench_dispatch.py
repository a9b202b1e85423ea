"""A zoo layer's kernel on each dispatch path side by side, in one job on the same GPUs: the staged
dispatch at each sender count given, then the flat store path (sim.costs.dispatch_path picks one of
them by default). Each point is checked against the dropless torch layer and timed alone (median
of its launches, no torch timing).

    python benchmarks/bench_dispatch.py --layer qwen3-30b-a3b --tokens 4096 --gpus 4 [--senders 16 32 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu import cases, spawn  # noqa: E402
from reference import presets  # noqa: E402
from reference.cli import format_table  # noqa: E402
from sim import costs  # noqa: E402


def dispatch_cases(layer: str, tokens: int, gpus: int, dtype: str, senders: list[int], iters: int) -> list[dict]:
    """The layer's matrix case once per dispatch: staged with each sender count, then store."""
    (base,) = cases.matrix_cases(gpus, dtype, [layer], [tokens], flashmoe=False, torch_models=False)
    ways = [{"dispatch": "staged", "staged_blocks": n} for n in senders] + [{"dispatch": "store"}]
    return [{**base, **w, "baselines": [], "profile": False, "iters": iters,
             "name": f"{base['name']}-{w['dispatch']}{w.get('staged_blocks', '')}"} for w in ways]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", choices=list(presets.ZOO), default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per GPU")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--dtype", choices=list(cases.PRECISIONS), default="bfloat16")
    ap.add_argument("--senders", type=int, nargs="+", default=[costs.STAGED_BLOCKS],
                    help=f"the staged dispatch's sender counts (default: the kernel's {costs.STAGED_BLOCKS})")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("/tmp/moelab-bench-dispatch"))
    ap.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit of the job, seconds")
    args = ap.parse_args()
    why = spawn.unmet(args.gpus)
    if why:
        ap.error(why)
    todo = dispatch_cases(args.layer, args.tokens, args.gpus, args.dtype, args.senders, args.iters)
    rows = []
    for r in spawn.run(todo, args.gpus, args.out, timeout_s=args.timeout):
        if "failed" in r:
            rows.append([r["name"], r["dispatch"], "-", "FAILED: " + r["failed"], "", ""])
            continue
        rows.append([r["name"], r["dispatch"], r["staged_blocks"] if r["dispatch"] == "staged" else "-",
                     f"{r['kernel_ms']:.3f}", f"{min(r['kernel_ms_all']):.3f}", f"{r['vs_baseline_rel_err']:.3g}"])
    print(format_table(["point", "dispatch", "senders", "kernel ms", "min ms", "rel err vs torch"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
