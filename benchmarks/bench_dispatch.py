"""Zoo layers' kernels on each dispatch path side by side, in one job on the same GPUs: the staged
dispatch at each sender count given, then the flat store path (sim.costs.DEFAULT_DISPATCH is the
kernel's default). Each point is checked against the dropless torch layer and timed alone (median
of its launches, no torch timing).

    python benchmarks/bench_dispatch.py --layers qwen3-30b-a3b gpt-oss-120b --tokens 4096 16384 --gpus 2 \
        [--senders 16 32 64] [--paths staged store]
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


def dispatch_cases(layers: list[str], tokens: list[int], gpus: int, dtype: str, senders: list[int], paths: list[str],
                   iters: int) -> list[dict]:
    """Each layer's matrix case at each token count once per dispatch: staged with each sender count
    (on two or more GPUs; on one the staged dispatch is the flat one), then store."""
    ways = [{"dispatch": "staged", "staged_blocks": n} for n in senders if "staged" in paths and gpus > 1]
    ways += [{"dispatch": "store"}] if "store" in paths or gpus == 1 else []
    return [{**base, **w, "baselines": [], "profile": False, "iters": iters,
             "name": f"{base['name']}-{w['dispatch']}{w.get('staged_blocks', '')}"}
            for base in cases.matrix_cases(gpus, dtype, layers, tokens, flashmoe=False, torch_models=False)
            for w in ways]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", choices=list(presets.ZOO), nargs="+", default=["qwen3-30b-a3b"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096], help="tokens per GPU")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--dtype", choices=list(cases.PRECISIONS), default="bfloat16")
    ap.add_argument("--senders", type=int, nargs="+", default=[costs.STAGED_BLOCKS],
                    help=f"the staged dispatch's sender counts (default: the kernel's {costs.STAGED_BLOCKS})")
    ap.add_argument("--paths", choices=["staged", "store"], nargs="+", default=["staged", "store"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("/tmp/moelab-bench-dispatch"))
    ap.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit of the job, seconds")
    args = ap.parse_args()
    why = spawn.unmet(args.gpus)
    if why:
        ap.error(why)
    if min(args.tokens) < 1 or min(args.senders) < 1:
        ap.error(f"--tokens {args.tokens} and --senders {args.senders}: positive numbers")
    todo = dispatch_cases(args.layers, args.tokens, args.gpus, args.dtype, args.senders, args.paths, args.iters)
    rows, by_name = [], {c["name"]: c for c in todo}
    failed = 0
    for r in spawn.run(todo, args.gpus, args.out, timeout_s=args.timeout):
        if "failed" in r:
            path = by_name.get(r["name"], {}).get("dispatch", "-")
            rows.append([r["name"], path, "-", "FAILED: " + r["failed"], "", ""])
            failed += 1
            continue
        rows.append([r["name"], r["dispatch"], r["staged_blocks"] if r["dispatch"] == "staged" else "-",
                     f"{r['kernel_ms']:.3f}", f"{min(r['kernel_ms_all']):.3f}", f"{r['vs_baseline_rel_err']:.3g}"])
    print(format_table(["point", "dispatch", "senders", "kernel ms", "min ms", "rel err vs torch"], rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
